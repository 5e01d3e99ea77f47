"""``ChatServer`` as one replica of many: its header, its labelled metrics, readiness and headroom."""

from __future__ import annotations

import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metronome_sdk import Engine
from metronome_sdk.cli import main
from metronome_sdk.serve import ChatServer, ServeConfig
from tests.serve.conftest import TOKEN, serving

pytestmark = pytest.mark.timeout(60)

USER = [{"role": "user", "content": "hello there"}]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def base(server: ChatServer) -> str:
    return server.url.removesuffix("/v1")


async def test_every_response_names_the_replica(engine: Engine) -> None:
    async with await serving(engine, replica_id="r-1", token=TOKEN) as server, httpx2.AsyncClient() as http:
        url = f"{server.url}/chat/completions"
        answers = {
            "whole": await http.post(url, json={"messages": USER}, headers=AUTH),
            "stream": await http.post(url, json={"messages": USER, "stream": True}, headers=AUTH),
            "bad body": await http.post(url, json={"messages": "nope"}, headers=AUTH),
            "no token": await http.post(url, json={"messages": USER}),
            "no route": await http.get(f"{base(server)}/nowhere"),
            "healthz": await http.get(f"{base(server)}/healthz"),
            "readyz": await http.get(f"{base(server)}/readyz"),
            "metrics": await http.get(f"{base(server)}/metrics", headers=AUTH),
        }
        held = [engine.try_session(), engine.try_session()]  # the cap (2) is full
        answers["refused"] = await http.post(url, json={"messages": USER}, headers=AUTH)
        for s in held:
            await s.aclose()
    statuses = {what: r.status_code for what, r in answers.items()}
    assert statuses == {
        "whole": 200,
        "stream": 200,
        "bad body": 400,
        "no token": 401,
        "no route": 404,
        "healthz": 200,
        "readyz": 200,
        "metrics": 200,
        "refused": 429,
    }
    assert {what: r.headers.get("X-Metronome-Replica") for what, r in answers.items()} == dict.fromkeys(answers, "r-1")


async def test_a_lone_server_sends_no_replica_header_or_label(engine: Engine) -> None:
    async with await serving(engine) as server, httpx2.AsyncClient() as http:
        r = await http.get(f"{base(server)}/metrics")
    assert "X-Metronome-Replica" not in r.headers
    assert "replica=" not in r.text
    assert "metronome_admission_headroom 2.0" in r.text


async def test_every_metric_carries_the_replica_label(engine: Engine) -> None:
    async with await serving(engine, replica_id="r-2") as server, httpx2.AsyncClient() as http:
        await http.post(f"{server.url}/chat/completions", json={"messages": USER})
        text = (await http.get(f"{base(server)}/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = [s for f in families.values() for s in f.samples]
    assert samples and all(s.labels.get("replica") == "r-2" for s in samples)
    # the engine's metrics and the server's, both labelled
    assert {"metronome_frames", "metronome_serve_requests", "metronome_admission_headroom"} <= families.keys()
    served = [s for s in families["metronome_serve_requests"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in served] == [({"status": "200", "replica": "r-2"}, 1.0)]


async def test_readiness_and_the_headroom_gauge_follow_admission(engine: Engine) -> None:
    async with await serving(engine, replica_id="r-3") as server, httpx2.AsyncClient() as http:

        async def probe() -> tuple[int, int, str | None, float]:
            ready = await http.get(f"{base(server)}/readyz")
            metrics = (await http.get(f"{base(server)}/metrics")).text
            (gauge,) = [
                s.value
                for f in text_string_to_metric_families(metrics)
                if f.name == "metronome_admission_headroom"
                for s in f.samples
            ]
            return ready.status_code, ready.json()["headroom"], ready.headers.get("Retry-After"), gauge

        seen = [await probe()]
        first = engine.try_session()
        seen.append(await probe())
        second = engine.try_session()  # the cap (2) is full
        seen.append(await probe())
        await first.aclose()
        seen.append(await probe())
        await second.aclose()
        full = await http.get(f"{base(server)}/readyz")
    assert seen == [(200, 2, None, 2.0), (200, 1, None, 1.0), (503, 0, "1", 0.0), (200, 1, None, 1.0)]
    assert full.status_code == 200 and full.json()["status"] == "ready"


async def test_readiness_and_liveness_are_503_once_the_engine_is_gone(engine: Engine) -> None:
    async with await serving(engine, replica_id="r-4") as server, httpx2.AsyncClient() as http:
        assert (await http.get(f"{base(server)}/readyz")).status_code == 200
        await engine.aclose()
        ready = await http.get(f"{base(server)}/readyz")
        live = await http.get(f"{base(server)}/healthz")
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable" and ready.json()["headroom"] == 0
    assert live.status_code == 503


async def test_a_replica_declines_a_conversation_it_does_not_hold(engine: Engine) -> None:
    later = [*USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and then?"}]
    async with (
        await serving(engine, replica_id="r-5") as server,
        openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0) as client,
    ):
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(
                model="any", messages=later, extra_headers={"X-Metronome-Session": "elsewhere"}
            )
        assert server.named_sessions == 0 and engine.stats().sessions == 0  # nothing opened for it
        # the conversation's first request opens it here; its later requests are served here
        key = {"X-Metronome-Session": "here"}
        first = await client.chat.completions.create(model="any", messages=USER, extra_headers=key)
        reply = first.choices[0].message.content or ""
        second = await client.chat.completions.create(
            model="any",
            messages=[*USER, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}],
            extra_headers=key,
        )
        assert second.choices[0].finish_reason in ("stop", "length")
        assert server.named_sessions == 1  # the same session, served here
    assert caught.value.status_code == 404
    assert caught.value.code == "SessionNotFound"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0


async def test_a_lone_server_reopens_a_conversation_it_does_not_hold(engine: Engine) -> None:
    later = [*USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and then?"}]
    async with (
        await serving(engine) as server,
        openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0) as client,
    ):
        reply = await client.chat.completions.create(
            model="any", messages=later, extra_headers={"X-Metronome-Session": "idled-out"}
        )
        assert reply.choices[0].finish_reason in ("stop", "length")  # the history, prefilled into a fresh session
        assert server.named_sessions == 1


@pytest.mark.parametrize("bad", ["", "has space", "-leading", "x" * 64, 7, "é"])
def test_a_replica_id_is_checked_when_made(bad: object) -> None:
    with pytest.raises(ValueError, match="replica_id"):
        ServeConfig(replica_id=bad)  # type: ignore[arg-type]
    assert ServeConfig(replica_id="pod-7.zone_a").replica_id == "pod-7.zone_a"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--replica-id", "no spaces"], "replica_id"),
        (["--max-sessions", "0"], "--max-sessions must be >= 1"),
        (["--min-sessions", "3", "--max-sessions", "2"], "--min-sessions 3 exceeds --max-sessions 2"),
    ],
)
def test_the_serve_command_refuses_bad_replica_flags_before_loading(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "loading the model" not in err
