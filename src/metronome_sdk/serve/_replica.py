"""One replica of many behind a load balancer: its name, its liveness and readiness, its headroom.

``metronome serve --replica-id NAME`` puts ``X-Metronome-Replica: NAME`` on every response
(streamed ones and errors too: set as the headers go out) and a ``replica="NAME"`` label on
every metric, so a test and an operator see which replica answered. ``GET /healthz`` is
liveness (the process and its engine work); ``GET /readyz`` is readiness for *new*
sessions: 503 with ``Retry-After`` while admission has no room, so a Kubernetes Service or
a balancer's health check stops sending newcomers while the sessions already here go on.
``metronome_admission_headroom`` is that room as a gauge, what an autoscaler scales on.

A replica does not know its peers. What keeps a session on the replica that holds its KV
is the balancer's hash on the session key, walked in the same order for every request of
a key; what keeps another replica from serving it when the balancer moves past a full or
dead one is ``declines``: a replica with an id answers a request that continues a
conversation (it carries an assistant turn) on a key it does not hold with 404
``SessionNotFound`` instead of opening the session afresh, so the balancer tries the next
replica and, when none holds it, the client gets that typed error, never a reply made
without the conversation's cache. See docs/serving-many.md.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .._engine import Engine
from .._stats import EngineStats
from ._config import check_replica_id

__all__ = ["REPLICA_HEADER", "Replica", "admission_headroom"]

REPLICA_HEADER = "X-Metronome-Replica"


def admission_headroom(stats: EngineStats) -> int:
    """Sessions admission would take now: the cap (never above the memory guard's) less those in flight."""
    if stats.failed:
        return 0
    return max(0, stats.limit - stats.sessions)


def continues_a_conversation(messages: Sequence[Mapping[str, str]]) -> bool:
    """Whether a chat request carries a reply already given: it is not a conversation's first request."""
    return any(m.get("role") == "assistant" for m in messages)


class _Labelled(Collector):
    """The samples of ``registries`` with ``replica="NAME"`` added to their labels."""

    def __init__(self, registries: Sequence[CollectorRegistry], replica: str | None) -> None:
        self._registries = registries
        self._replica = replica

    def collect(self) -> Iterable[Metric]:
        for registry in self._registries:
            for family in registry.collect():
                if self._replica is None:
                    yield family
                    continue
                labelled = copy.copy(family)
                labelled.samples = [s._replace(labels={**s.labels, "replica": self._replica}) for s in family.samples]
                yield labelled


class Replica:
    """What a ``ChatServer`` adds to run as one replica of many (``install`` it on the app).

    ``name``: the replica id (``None``: a lone server, no header and no label).
    ``live``: whether the server takes requests at all (not shutting down).
    ``retry_after``: the wait ``/readyz`` advises while the replica is full.
    ``headroom``: the gauge (the server's ``metronome_admission_headroom``) it keeps current.
    """

    def __init__(
        self, engine: Engine, *, name: str | None, live: Callable[[], bool], retry_after: float, headroom: Gauge
    ) -> None:
        check_replica_id(name)
        self.engine = engine
        self.name = name
        self._live = live
        self._retry_after = retry_after
        self.headroom = headroom

    def install(self, app: web.Application) -> None:
        app.on_response_prepare.append(self._label)
        app.router.add_get("/readyz", self._readyz)

    def declines(self, known: bool, messages: Sequence[Mapping[str, str]]) -> bool:
        """Whether to answer 404 rather than open ``messages``' session afresh (see the module docstring)."""
        return self.name is not None and not known and continues_a_conversation(messages)

    async def _label(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.name is not None:
            response.headers[REPLICA_HEADER] = self.name

    def _headroom(self) -> int:
        up = self._live() and not self.engine.closed and self.engine.failure is None
        room = admission_headroom(self.engine.stats()) if up else 0
        self.headroom.set(room)
        return room

    async def _readyz(self, request: web.Request) -> web.Response:
        room = self._headroom()
        stats = self.engine.stats()
        up = self._live() and not self.engine.closed and self.engine.failure is None
        body = {
            "status": "ready" if room > 0 else "full" if up else "unavailable",
            "replica": self.name,
            "headroom": room,
            "sessions": stats.sessions,
            "limit": stats.limit,
            "memory_limit": stats.memory_limit,
            "used_blocks": stats.used_blocks,
            "pool_blocks": stats.pool_blocks,
        }
        if room > 0:
            return web.json_response(body)
        headers = {"Retry-After": str(max(1, math.ceil(self._retry_after)))}
        return web.json_response(body, status=503, headers=headers)

    def exposition(self, registries: Sequence[CollectorRegistry]) -> bytes:
        """The Prometheus text of ``registries``, labelled with the replica (the headroom read now)."""
        self._headroom()
        return generate_latest(_Labelled(registries, self.name))
