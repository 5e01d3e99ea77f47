"""Prometheus metrics of one engine, in a private registry.

A private registry keeps two engines (or a test and an application) from colliding
in the global one. Exposition is opt-in: ``EngineMetrics.serve()`` starts an HTTP
endpoint, ``EngineMetrics.text()`` renders the exposition format for your own.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

__all__ = ["EngineMetrics"]

# per-frame latency in seconds: dense around the 80 ms frame period
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.16, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.frame_latency = Histogram(
            "metronome_frame_latency_seconds",
            "Per-frame latency: frame submitted to output ready",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.frames = Counter("metronome_frames_total", "Output frames delivered", registry=r)
        self.deadline_misses = Counter("metronome_deadline_misses_total", "Frames later than the deadline", registry=r)
        self.stalls = Counter(
            "metronome_stalls_total", "Frames the engine could not serve (pool exhausted)", registry=r
        )
        self.rejected = Counter("metronome_admission_rejected_total", "Sessions refused at admission", registry=r)
        self.admitted = Counter("metronome_admission_admitted_total", "Sessions admitted", registry=r)
        self.faults = Counter(
            "metronome_faults_total",
            "Faults by kind: step_failed, step_stuck, numeric_fault, shed, output_dropped, input_refused, "
            "engine_failed",
            ["kind"],
            registry=r,
        )
        self.evicted_tokens = Counter(
            "metronome_evicted_tokens_total",
            "Conversation tokens that left sessions' windows: the model no longer sees them",
            registry=r,
        )
        self.sessions = Gauge("metronome_sessions", "Sessions open", registry=r)
        self.limit = Gauge("metronome_admission_limit", "The admission cap (AIMD under the memory guard)", registry=r)
        self.occupancy = Gauge("metronome_pool_occupancy", "Fraction of KV blocks in use", registry=r)
        self.t_sat = Gauge(
            "metronome_t_sat_seconds",
            "Seconds until the KV pool is full at the measured growth: free blocks / (N * r); +Inf: never",
            registry=r,
        )
        self._server: Any = None

    def text(self) -> bytes:
        """The Prometheus text exposition of this engine's metrics."""
        return generate_latest(self.registry)

    def serve(self, port: int = 9464, *, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` over HTTP on ``addr:port`` (``port=0``: any free port); return the port."""
        if self._server is not None:
            raise RuntimeError("metrics are already served; call serve() once per engine")
        started = start_http_server(port, addr=addr, registry=self.registry)
        server = started[0] if isinstance(started, tuple) else None
        self._server = server
        return int(server.server_port) if server is not None else port

    def close(self) -> None:
        """Stop the HTTP endpoint, if one was started."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
