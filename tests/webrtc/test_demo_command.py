"""``metronome demo`` serves the page on loopback, stops cleanly on Ctrl-C, and says why it cannot listen."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(240)]


def _demo(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "metronome_sdk.cli", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_metronome_demo_serves_the_page_and_stops_on_ctrl_c() -> None:
    # `with`: its pipes are closed however the test ends (a failed start once left them to the garbage collector)
    with _demo("--port", "0") as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # printed once the model, the voice and the socket are ready
            assert line.startswith("voice demo on http://127.0.0.1:"), line + proc.communicate(timeout=30)[1]
            url = line.split()[3]
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert resp.status == 200 and b'id="start"' in resp.read()
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert "stopped: every peer connection and session closed" in err
    assert "Traceback" not in err


def test_metronome_demo_names_a_port_it_cannot_take() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with _demo("--port", str(port)) as proc:
            _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2
    assert f"metronome: error: cannot listen on 127.0.0.1:{port}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("option", "bad", "message"),
    [
        ("--whisper-window", ("40", "0.5", "ten"), "--whisper-window takes seconds in [1, 30]"),
        ("--whisper-workers", ("0", "two", "-1"), "--whisper-workers takes a count >= 1"),
        ("--first-words", ("0", "six", "-1"), "--first-words takes a count >= 1 or 'none'"),
        ("--engine-threads", ("0", "two", "-1"), "--engine-threads takes a count >= 1 or 'all'"),
    ],
)
def test_metronome_demo_refuses_an_option_out_of_its_range(
    option: str, bad: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from metronome_sdk.cli import main

    for value in bad:
        with pytest.raises(SystemExit) as exit_:
            main(["demo", option, value])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err


def test_metronome_demo_refuses_a_frame_of_no_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    from metronome_sdk.cli import main

    assert main(["demo", "--decode-tokens", "0"]) == 2  # refused before any model loads
    assert "decode_tokens must be an int >= 1, got 0" in capsys.readouterr().err


def test_the_demo_engine_leaves_the_voice_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from metronome_sdk.webrtc import demo_engine, voice_threads

    for cores, threads in ((1, 1), (2, 1), (8, 7)):
        monkeypatch.setattr("os.sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert voice_threads() == threads
    config = demo_engine(threads=3).config
    assert config is not None and config.threads == 3


def test_the_demo_engine_lets_a_step_take_most_of_the_deadline() -> None:
    from metronome_sdk.webrtc import demo_engine

    timing = demo_engine(threads=1).timing
    assert (timing.period, timing.step_share, timing.prompt_at_open) == (0.08, 0.9, True)
