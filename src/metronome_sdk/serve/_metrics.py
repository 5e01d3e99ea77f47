"""The server's own Prometheus metrics, beside the engine's on ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

__all__ = ["ServeMetrics"]


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "metronome_serve_requests_total",
            "Chat completion requests by the HTTP status answered",
            ["status"],
            registry=r,
        )
        self.stream_errors = Counter(
            "metronome_serve_stream_errors_total",
            "Streams ended by an error event after their first token, by the SDK exception",
            ["code"],
            registry=r,
        )
        self.interrupted = Counter(
            "metronome_serve_replies_interrupted_total",
            "Replies cut by a newer request on the same named session, or by shutdown",
            registry=r,
        )
        self.named_sessions = Gauge("metronome_serve_named_sessions", "Named sessions open", registry=r)
        self.idle_closed = Counter(
            "metronome_serve_sessions_idle_closed_total", "Named sessions closed for being idle", registry=r
        )
        self.admission_headroom = Gauge(
            "metronome_admission_headroom",
            "Sessions admission would admit now: the cap less the sessions in flight (0 while the engine is down)",
            registry=r,
        )

        self.realtime_answers = Counter(
            "metronome_serve_realtime_connections_total",
            "/v1/realtime connections by the HTTP status answered (101: upgraded and served)",
            ["status"],
            registry=r,
        )
        self.realtime_open = Gauge(
            "metronome_serve_realtime_open", "/v1/realtime connections open (or being refused)", registry=r
        )

    def text(self) -> bytes:
        return generate_latest(self.registry)
