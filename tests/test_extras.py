"""Optional packages stay optional: the core import loads none, and a missing one names its extra.

Each check runs in a fresh interpreter, so what an earlier test imported cannot hide an import.
A module set to ``None`` in ``sys.modules`` cannot be imported: that stands for "not installed".
"""

from __future__ import annotations

import subprocess
import sys

# what each extra brings; none of it may load with the SDK's core
OPTIONAL = ("aiortc", "av", "matplotlib", "pocketsphinx", "faster_whisper", "pipecat", "livekit", "onnxruntime")


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def loaded_after(statement: str) -> list[str]:
    out = run(f"import sys\n{statement}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))")
    assert out.returncode == 0, out.stderr
    return sorted(set(out.stdout.split()) & set(OPTIONAL))


def test_the_core_import_loads_no_optional_package() -> None:
    assert loaded_after("import metronome_sdk") == []


def test_the_in_memory_transport_and_the_cli_load_no_optional_package() -> None:
    assert loaded_after("import metronome_sdk.transports, metronome_sdk.cli; metronome_sdk.cli.build_parser()") == []


def test_the_check_sees_an_optional_import() -> None:
    # the test above is only as good as its probe: importing the WebRTC transport does load aiortc
    assert "aiortc" in loaded_after("import metronome_sdk.webrtc")


def test_the_webrtc_transport_without_its_extra_names_the_extra() -> None:
    out = run("import sys; sys.modules['aiortc'] = None\nimport metronome_sdk.webrtc")
    assert out.returncode != 0
    assert "needs the [webrtc] extra: pip install 'metronome-sdk[webrtc]'" in out.stderr


def test_metronome_demo_without_its_extra_says_so_in_one_line() -> None:
    code = (
        "import sys; sys.modules['aiortc'] = None\nfrom metronome_sdk.cli import main\nraise SystemExit(main(['demo']))"
    )
    out = run(code)
    assert out.returncode == 2
    assert out.stderr.startswith("metronome: error: ") and "Traceback" not in out.stderr
    assert "[webrtc] extra" in out.stderr


def test_bench_without_metronome_bench_names_the_package() -> None:
    # the benchmarks are their own distribution: without it, `metronome bench` says what to install
    code = (
        "import sys; sys.modules['metronome_bench'] = None\n"
        "from metronome_sdk.cli import main\n"
        "raise SystemExit(main(['bench', 'sweep', '--quick']))"
    )
    out = run(code)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("metronome: error: metronome bench comes with the metronome-bench package")
    assert "pip install metronome-bench" in out.stderr and "Traceback" not in out.stderr


def test_the_sdk_commands_run_without_metronome_bench() -> None:
    code = (
        "import sys; sys.modules['metronome_bench'] = None\n"
        "from metronome_sdk.cli import build_parser\n"
        "args = build_parser().parse_args(['demo', '--no-early-transcribe'])\n"
        "print(args.run.__module__)"
    )
    out = run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "metronome_sdk.commands.demo"


def test_resampling_without_pyav_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['av'] = None\n"
        "import numpy as np\n"
        "from metronome_sdk._audio import Framer, resample\n"
        "assert len(Framer(4).push(np.zeros(8, np.int16))) == 2  # no resampling, no PyAV needed\n"
        "assert resample(np.zeros(8, np.int16), 16000, 16000).size == 8\n"
        "resample(np.zeros(8, np.int16), 48000, 16000)"
    )
    out = run(code)
    assert out.returncode != 0
    assert "needs the [webrtc] extra" in out.stderr


def test_smart_turn_without_pipecat_names_the_extra() -> None:
    out = run("import sys; sys.modules['pipecat'] = None\nfrom metronome_sdk.voice import SmartTurn\nSmartTurn()")
    assert out.returncode != 0
    assert "pip install 'metronome-sdk[voice,pipecat]'" in out.stderr and "ModuleNotFoundError" in out.stderr
