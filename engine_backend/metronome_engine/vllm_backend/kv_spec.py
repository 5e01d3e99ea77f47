"""The sinks + window KV cache spec and its manager, for vLLM's KV cache manager.

vLLM's ``SlidingWindowManager`` frees blocks that fall out of the window but keeps no sinks;
``RSWAManager`` keeps the prompt and frees a gap after it. ``SinkWindowManager`` keeps the
first ``S`` tokens' blocks and the last ``W`` tokens' blocks of every request and frees the
blocks between at once (swapped for vLLM's null block), so a session's footprint is bounded
by ``ceil(S/bs) + ceil(W/bs) + 1`` blocks, the torch runner's bound.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec

from .positions import gap_blocks

__all__ = ["SinkWindowManager", "SinkWindowSpec"]


@dataclass(frozen=True, kw_only=True)
class SinkWindowSpec(FullAttentionSpec):  # type: ignore[misc]
    """Full attention over the first ``sinks`` and the last ``window`` tokens of each request."""

    window: int
    sinks: int

    @classmethod
    def merge(cls, specs: list[Any]) -> SinkWindowSpec:
        if not all(isinstance(s, SinkWindowSpec) for s in specs):
            raise ValueError("every attention layer of a sinks + window group must use SinkWindowSpec")
        bounds = {(s.window, s.sinks) for s in specs}
        if len(bounds) != 1:
            raise ValueError(f"every layer must share one window and sink count, got {sorted(bounds)}")
        base = FullAttentionSpec.merge(specs)
        window, sinks = bounds.pop()
        return cls(**{f.name: getattr(base, f.name) for f in fields(base)}, window=window, sinks=sinks)

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        """One request's most blocks: sinks, the window widened by a step's tokens, one partial block.

        vLLM checks at start-up that the pool holds one request; under the bound that is far
        less than ``max_model_len``, so a session may outlive the pool many times over.
        """
        in_flight = int(
            getattr(vllm_config, "max_in_flight_tokens", vllm_config.scheduler_config.max_num_batched_tokens)
        )
        bs = self.block_size
        blocks = -(-self.sinks // bs) + -(-(self.window + in_flight - 1) // bs) + 1
        longest = int(vllm_config.model_config.max_model_len)
        return int(min(blocks, -(-longest // bs)) * self.page_size_bytes)


class SinkWindowManager(FullAttentionManager):  # type: ignore[misc]
    """Frees a request's blocks between its sink blocks and its window as the window moves."""

    def __init__(self, kv_cache_spec: SinkWindowSpec, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.window = kv_cache_spec.window
        self.sinks = kv_cache_spec.sinks

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        del num_prompt_tokens  # the bound depends on the stream position only
        gap = gap_blocks(processed_computed_tokens, window=self.window, sinks=self.sinks, block_size=self.block_size)
        if gap:
            self._remove_blocks_in_range(request_id, gap.start, gap.stop)
