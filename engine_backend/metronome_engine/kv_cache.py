"""The pool's storage: K and V for every slot, ``[layers, kv_heads, slots, head_dim]``."""

from __future__ import annotations

import torch

from .config import ModelConfig

__all__ = ["KVCache"]


class KVCache:
    """Heads-major, so that a block of one head is a contiguous ``block_size * head_dim`` run."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (config.num_layers, config.num_kv_heads, num_blocks * block_size, config.head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @staticmethod
    def bytes_per_slot(config: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return config.kv_bytes_per_token(itemsize)
