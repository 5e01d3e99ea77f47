"""The estimators the engine acts on, public so that a benchmark or a dashboard computes the same numbers.

``percentile`` is admission's latency signal (nearest rank over the last frames); ``t_sat`` and
``GrowthRate`` are the pool-saturation gauge (``stats().t_sat``, ``metronome_t_sat_seconds``).
"""

from ._core.admission import percentile
from ._core.growth import GrowthRate, t_sat

__all__ = ["GrowthRate", "percentile", "t_sat"]
