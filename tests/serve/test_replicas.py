"""Two ``metronome serve`` replicas behind real nginx, with deploy/nginx/metronome.conf as documented.

Real parts only: two processes on the SmolLM2 weights, Debian's nginx (``make nginx``), the
``openai`` client. Each replica admits two sessions, so six sessions are three times what one
takes. The keys are picked so that four of them hash first to replica ``a``: two of them can
only be admitted by spilling to ``b``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "nginx" / "metronome.conf"
CAP = 2  # sessions each replica admits
HEADER = "X-Metronome-Replica"
HELLO = [{"role": "user", "content": "Say hello."}]

MAIN_CONF = """\
pid nginx.pid;
error_log stderr warn;
master_process off;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    include {site};
}}
"""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def text(self) -> str:
        return self.out.read_text() + self.err.read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(name: str, argv: list[str], tmp: Path, env: dict[str, str]) -> Child:
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(argv, stdout=o, stderr=e, env=env, cwd=tmp)
    return Child(name, proc, out, err)


async def _wait_for(child: Child, prefix: str, seconds: float) -> str:
    with anyio.fail_after(seconds):
        while True:
            for line in child.out.read_text().splitlines():
                if line.startswith(prefix):
                    return line
            assert child.proc.poll() is None, f"{child.name} exited:\n{child.text()}"
            await anyio.sleep(0.2)


async def _wait_listening(port: int, child: Child, seconds: float) -> None:
    with anyio.fail_after(seconds):
        while True:
            assert child.proc.poll() is None, f"{child.name} exited:\n{child.text()}"
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.1)
                continue
            await stream.aclose()
            return


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Every process the test starts; each is killed (if still running) and waited for."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in started:
            if child.proc.poll() is None:
                child.proc.kill()
        for child in started:
            child.proc.wait(timeout=30)


def _site_conf(replicas: dict[str, int], listen: int) -> str:
    text = CONF.read_text()
    # the documented addresses, replaced by this run's; everything else exactly as documented
    for documented, port in (("127.0.0.1:8001", replicas["a"]), ("127.0.0.1:8002", replicas["b"])):
        assert documented in text
        text = text.replace(documented, f"127.0.0.1:{port}")
    assert "listen 127.0.0.1:8000;" in text
    return text.replace("listen 127.0.0.1:8000;", f"listen 127.0.0.1:{listen};")


def _turns(history: list[dict[str, str]], reply: str, follow_up: str) -> list[dict[str, str]]:
    return [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]


async def _chat(client: openai.AsyncOpenAI, key: str, messages: list[dict[str, str]]) -> tuple[str, str]:
    """One request of session ``key`` through nginx: (the replica that answered, the reply)."""
    raw = await client.chat.completions.with_raw_response.create(
        model="metronome", messages=messages, max_tokens=6, extra_headers={"X-Metronome-Session": key}
    )
    completion = raw.parse()
    return raw.headers[HEADER], completion.choices[0].message.content or ""


async def _first_choice(http: httpx2.AsyncClient, base: str, key: str) -> str:
    """The replica ``key`` hashes to first, found without opening a session: a later request on
    a key no replica holds is declined by each in ring order, and the last to decline answers."""
    body: dict[str, Any] = {"messages": _turns(HELLO, "Hello.", "Again."), "max_tokens": 1}
    r = await http.post(f"{base}/v1/chat/completions", json=body, headers={"X-Metronome-Session": key})
    assert r.status_code == 404 and r.json()["error"]["code"] == "SessionNotFound", r.text
    last: str = r.headers[HEADER]
    return "b" if last == "a" else "a"


async def test_two_replicas_behind_nginx_spill_refuse_and_fail_alone(tmp_path: Path, children: list[Child]) -> None:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.fail("nginx is not installed: `make nginx` (make test-slow does) installs Debian's")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

    def replica_argv(name: str) -> list[str]:
        argv = [sys.executable, "-m", "metronome_sdk.cli", "serve", "--no-realtime", "--replica-id", name]
        return [*argv, "--max-sessions", str(CAP), "--min-sessions", str(CAP), "--max-tokens", "6"]

    for name in ("a", "b"):
        children.append(_start(name, [*replica_argv(name), "--port", "0"], tmp_path, env))
    replicas: dict[str, Child] = {c.name: c for c in children}
    ports: dict[str, int] = {}
    for name, child in replicas.items():  # both load the model at once
        line = await _wait_for(child, "serving http://127.0.0.1:", 400)
        ports[name] = int(line.split()[1].removeprefix("http://127.0.0.1:").removesuffix("/v1"))

    listen = _free_port()
    (tmp_path / "tmp").mkdir()
    site = tmp_path / "metronome.conf"
    site.write_text(_site_conf(ports, listen))
    (tmp_path / "nginx.conf").write_text(MAIN_CONF.format(site=site))
    argv = [nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr", "-g", "daemon off;"]
    children.append(proxy := _start("nginx", argv, tmp_path, env))
    await _wait_listening(listen, proxy, 30)
    base = f"http://127.0.0.1:{listen}"

    async with (
        httpx2.AsyncClient(timeout=120) as http,
        openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120) as client,
    ):
        # a request with no key is a session of its own: round robin over the replicas
        one_off = []
        for _ in range(4):
            raw = await client.chat.completions.with_raw_response.create(
                model="metronome", messages=HELLO, max_tokens=2
            )
            one_off.append(raw.headers[HEADER])
        assert sorted(set(one_off)) == ["a", "b"], one_off

        # four keys that hash first to a, two more: a takes two, the other two must spill to b
        to_a: list[str] = []
        others: list[str] = []
        for i in range(64):
            key = f"call-{i}"
            first = await _first_choice(http, base, key)
            if first == "a" and len(to_a) < 2 * CAP:
                to_a.append(key)
            elif first == "b" and len(others) < CAP:
                others.append(key)
            if len(to_a) == 2 * CAP and len(others) == CAP:
                break
        assert len(to_a) == 2 * CAP and len(others) == CAP, "the hash put too few keys on one replica"
        keys = [*to_a, *others]
        assert await _healthz(http, ports["a"]) == (0, 0) and await _healthz(http, ports["b"]) == (0, 0)

        # open them in order: no refusal while a replica has room; then each refusal says when to retry
        opened: dict[str, tuple[str, str]] = {}  # key -> (replica, its first reply)
        refused: list[openai.RateLimitError] = []
        for key in keys:
            try:
                opened[key] = await _chat(client, key, HELLO)
            except openai.RateLimitError as exc:
                refused.append(exc)
        assert list(opened) == keys[: 2 * CAP], "a session was refused while a replica had room"
        assert [opened[k][0] for k in to_a] == ["a", "a", "b", "b"]  # the last two spilled to b
        assert len(refused) == len(keys) - 2 * CAP
        for exc in refused:
            assert exc.code == "AdmissionRejected"
            assert int(exc.response.headers["Retry-After"]) >= 1 and int(exc.response.headers["retry-after-ms"]) >= 1
        assert await _healthz(http, ports["a"]) == (CAP, None) and await _healthz(http, ports["b"]) == (CAP, None)

        # every later request of a session reaches the replica that holds it, spilled ones too
        for key, (replica, reply) in opened.items():
            again, _ = await _chat(client, key, _turns(HELLO, reply, "Once more."))
            assert again == replica, key

        # a dies: its sessions get a typed error; b's carry on, on b
        replicas["a"].proc.kill()
        replicas["a"].proc.wait(timeout=30)
        for key, (replica, reply) in opened.items():
            history = _turns(HELLO, reply, "And now?")
            if replica == "a":
                with pytest.raises(openai.NotFoundError) as gone:
                    await _chat(client, key, history)
                assert gone.value.code == "SessionNotFound"
                assert gone.value.response.headers[HEADER] == "b"  # b said so; it opened nothing for it
            else:
                assert (await _chat(client, key, history))[0] == "b"
        assert await _healthz(http, ports["b"]) == (CAP, None)

        # with a gone and b full, a new call is refused, still with Retry-After
        with pytest.raises(openai.RateLimitError) as full:
            await _chat(client, to_a[0], HELLO)
        assert full.value.response.headers[HEADER] == "b" and int(full.value.response.headers["Retry-After"]) >= 1

        # a comes back on its address and takes new sessions again (its old ones stay gone)
        argv = [*replica_argv("a"), "--port", str(ports["a"])]
        children.append(revived := _start("a-again", argv, tmp_path, env))
        await _wait_for(revived, "serving http://127.0.0.1:", 400)
        reopened = await _chat(client, to_a[0], HELLO)
        assert reopened[0] == "a"

        # every call ends: every block goes back to its replica's pool
        for key in [to_a[0], *(k for k, (replica, _) in opened.items() if replica == "b")]:
            r = await http.delete(f"{base}/v1/sessions/{key}")
            assert r.status_code == 200, r.text
        assert await _healthz(http, ports["b"]) == (0, 0) and await _healthz(http, ports["a"]) == (0, 0)

    for child in (replicas["b"], revived):
        child.proc.send_signal(signal.SIGINT)
    proxy.proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
    for child in (replicas["b"], revived, proxy):
        assert child.proc.wait(timeout=60) == 0, child.text()
    for child in (replicas["a"], replicas["b"], revived):
        assert "Traceback" not in child.text(), child.text()  # a was killed; it did not fail


async def _healthz(http: httpx2.AsyncClient, port: int) -> tuple[int, int | None]:
    """(sessions, used blocks) of one replica, from its own /healthz; blocks only when none is open."""
    health = (await http.get(f"http://127.0.0.1:{port}/healthz")).json()
    return health["sessions"], (health["used_blocks"] if health["sessions"] == 0 else None)
