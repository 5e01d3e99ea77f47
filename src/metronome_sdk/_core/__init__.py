"""The tick loop, the metronome, and its parts: the engine side of every session.

``Engine`` (``_engine.py``) assembles these at start; ``Session`` (``_session.py``) reaches them
only through its ``SessionLink``. Each module has one job:

- ``tick.py``: the loop: pacing, gathering each tick's chunks, dispatch, the watchdog's verdicts;
- ``budget.py``: how many tokens a tick appends and which session appends how many (pure);
- ``cost.py``: what a step costs on this machine, calibrated at start and refitted (pure fit);
- ``step.py``: the step on the core thread (new sequences, one batched step, decode rounds);
- ``worker.py``: the core's own thread; ``watchdog.py``: waiting on a step, slow or stuck;
- ``outcome.py``: what a step did for a frame (pure); ``delivery.py``: acting on it;
- ``admission.py``: the session cap (AIMD) and the memory guard; ``model_admission.py``: the
  model-based cap; ``door.py``: admitting a session, waiting for room, refusing;
- ``link.py``: a session's one owner on the engine side (``SessionLink``, what admission returns);
- ``state.py``: each admitted session's engine-side state (the rules for its context and its last
  reply token, once), and what the parts share;
- ``channel.py``: a session's bounded queues; ``encoding.py``: input frames to tokens;
- ``memory.py``: what a session's model still sees under a window policy (pure);
- ``counters.py``: every count, once, behind ``stats()`` and Prometheus; ``growth.py``: ``t_sat``;
- ``signal.py``: a wake-up that fires many times.
"""

from __future__ import annotations

__all__: list[str] = []  # internal: applications import metronome_sdk's public names
