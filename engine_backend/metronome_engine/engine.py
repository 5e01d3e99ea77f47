"""The engine core: sessions' KV state in one block pool, one batched step per call.

A step never raises because the pool is full: a session that cannot get blocks for
its new tokens is reported as stalled (``StepOutput.stall``), its tokens are not
appended, and the other sessions of the step proceed. A session whose logits come out
non-finite (its own state is corrupt) is reported the same way, as a value
(``Stall.NUMERIC_FAULT``), and dropped: its blocks are scrubbed and freed. A step that
raises changes nothing: reservations are rolled back and no session is committed.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from .attention import AttentionBatch, SeqChunk, StepTokens
from .backend import PoolStats, Stall, StepOutput, StepRequest, validate_step
from .batch_view import BatchView
from .block_pool import BlockPool
from .kernels.choice import REGIMES, KernelChoice, StepPath, choose_kernels, nearest_regime, regime_paths
from .kv_cache import KVCache
from .kv_policy import KVPolicy
from .model import LlamaModel
from .paged import PagedBatch
from .quant import Quantize
from .sampling import SamplingParams, sample
from .sequence import SequenceKV

if TYPE_CHECKING:
    from .config import ModelConfig
    from .kernels import Isa

__all__ = ["EngineCore", "Kernels", "StepPath", "resolve_kernels"]

log = logging.getLogger(__name__)

# "fused": the compiled kernels (kernels/ops.cpp) of one vector-unit build (isa, default
# $METRONOME_KERNELS_ISA or native), which fail loudly if they cannot build; "torch": plain
# torch ops; "auto": whichever of the two ran faster here (kernels/choice.py), else torch
Kernels = Literal["auto", "fused", "torch"]


def resolve_kernels(
    kernels: Kernels,
    device: torch.device,
    config: ModelConfig | None = None,
    *,
    model: str | os.PathLike[str] | None = None,
    blocks: bool | None = None,
    isa: Isa | None = None,
) -> Literal["fused", "torch"]:
    """The path an engine with this choice runs on ``device``: ``"auto"`` resolves to the
    path measured fastest here for a model of ``config``'s shapes (or ``model``'s, read
    from its folder; SmolLM2's when neither is given), with or without ``blocks`` that are
    its weights (default: what ``model`` loads as, else with), timed once and cached
    (``kernels/choice.py``). ``"fused"`` raises ``KernelBuildError`` where the kernels of
    the build ``isa`` (default ``METRONOME_KERNELS_ISA`` or native) do not build."""
    from . import kernels as fused_kernels

    if kernels not in ("auto", "fused", "torch"):
        raise ValueError(f"kernels must be 'auto', 'fused' or 'torch', got {kernels!r}")
    if kernels == "torch":
        return "torch"
    if device.type != "cpu":
        if kernels == "fused":
            raise ValueError(f"kernels='fused' runs on the CPU only, the model is on {device}; use kernels='auto'")
        return "torch"
    build = fused_kernels.get_build(isa)
    if kernels == "fused":
        build.load()
        return "fused"
    if not build.available():
        return "torch"
    choice = auto_choice(config, model=model, blocks=blocks, isa=build.isa)
    log.info("kernels.auto chose %s from %s", choice.name, json.dumps(choice.times_ms))
    return choice.path


def auto_choice(
    config: ModelConfig | None = None,
    *,
    model: str | os.PathLike[str] | None = None,
    blocks: bool | None = None,
    isa: Isa | None = None,
    quantize: Quantize | None = None,
) -> KernelChoice:
    """``kernels="auto"``'s measured choice for a model of these shapes (see ``resolve_kernels``);
    ``quantize``: the model named is quantized on load (it then has blocks)."""
    from .config import ModelConfig
    from .weights import DEFAULT_MODEL, has_blocks

    if blocks is None:
        blocks = has_blocks(model or DEFAULT_MODEL, quantize) if config is None or model is not None else True
    if config is None:
        from .weights import read_config, resolve_model_dir

        config = ModelConfig.from_hf(read_config(resolve_model_dir(model or DEFAULT_MODEL)))
    return choose_kernels(config, isa, blocks=blocks, make_engine=EngineCore)


@dataclass(slots=True)
class _Seq:
    kv: SequenceKV
    sampling: SamplingParams
    generator: torch.Generator | None = field(default=None)


class EngineCore:
    """Serves many sessions of one model under one KV policy from a fixed block pool.

    Size the pool with ``num_blocks`` or a byte budget ``memory_bytes`` (one of them).
    A bounded policy is checked at construction: the pool must hold at least one
    session's bound, else ``ValueError``. ``kernels`` picks the step's path: the fused
    CPU kernels (``"fused"``, of the vector-unit build ``isa``; where that build has AMX
    tiles, the first fused engine packs the model's weights in place), plain torch ops
    (``"torch"``), or whichever of the two was measured faster here (``"auto"``).
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        policy: KVPolicy,
        num_blocks: int | None = None,
        memory_bytes: int | None = None,
        block_size: int = 16,
        kernels: Kernels = "auto",
        isa: Isa | None = None,
    ) -> None:
        if (num_blocks is None) == (memory_bytes is None):
            raise ValueError("give exactly one of num_blocks or memory_bytes to size the block pool")
        if not isinstance(policy, KVPolicy):
            raise ValueError(f"policy must be a KVPolicy, got {policy!r}; try KVPolicy.windowed(256, sinks=4)")
        self.model = model
        self.config = model.config
        self.policy = policy
        self.device = next(model.parameters()).device
        bytes_per_block = KVCache.bytes_per_slot(self.config) * block_size
        if num_blocks is not None:
            self.pool = BlockPool(num_blocks, block_size)
        else:
            assert memory_bytes is not None
            self.pool = BlockPool.from_budget(memory_bytes, bytes_per_block=bytes_per_block, block_size=block_size)
        model.config.check_kv_window(policy.window)
        bound = policy.max_blocks(block_size)
        if bound is not None and bound > self.pool.num_blocks:
            raise ValueError(
                f"the pool of {self.pool.num_blocks} blocks cannot hold one session's bound of {bound} blocks "
                f"({policy!r}, block_size={block_size}); raise num_blocks/memory_bytes to at least "
                f"{bound} blocks ({bound * bytes_per_block} bytes) or lower the window"
            )
        self.bytes_per_block = bytes_per_block
        self.cache = KVCache(self.config, self.pool.num_blocks, block_size, device=self.device)
        self.view = BatchView()
        self.fused = resolve_kernels(kernels, self.device, model.config, blocks=model.has_blocks, isa=isa) == "fused"
        self.ops: Any = None  # the fused kernels' build's torch.ops namespace
        # regime -> the path its steps run on, where "auto" measured different winners
        # (or the column groups) and every path can read the model (no tiles): see _step_path
        self.regimes: dict[str, StepPath] | None = None
        self._last_fused = self.fused
        if kernels == "auto" and self.device.type == "cpu" and not model.packed:
            self._switch_per_regime(model, isa)
        if self.fused:
            from . import kernels as fused_kernels

            build = fused_kernels.get_build(isa)
            build.load()
            if model.packed and not build.tiles_available():
                raise ValueError(
                    f"this model's weights are packed in AMX tiles, which the {build.isa} build cannot read; "
                    "load the model again for this engine"
                )
            self.isa: Isa | None = build.isa
            self.ops = build.ops
            model.pack_weights(build)
        else:
            self.isa = None
            model.require_unpacked()
        self._seqs: dict[int, _Seq] = {}
        self._ids = itertools.count(1)

    def _switch_per_regime(self, model: LlamaModel, isa: Isa | None) -> None:
        from . import kernels as fused_kernels

        build = fused_kernels.get_build(isa)
        if not build.available() or (build.tiles_available() and model.has_blocks):
            return  # no fused path here, or one that packs the weights in place
        choice = auto_choice(model.config, blocks=model.has_blocks, isa=build.isa)
        paths = regime_paths(choice, groups=model.has_blocks)
        if "groups" in paths.values() and not model.pack_groups():  # blocks that are not the weights
            paths = regime_paths(choice, groups=False)
        if len(set(paths.values())) > 1 or "groups" in paths.values():
            self.regimes = paths
            self.ops = build.ops
            log.info("kernels.auto runs per regime: %s", json.dumps(paths))

    def pin_paths(self, paths: Mapping[str, StepPath]) -> None:
        """Run the steps of each regime (``kernels.choice.REGIMES``) on the path given,
        as ``kernels="auto"`` does with the winners it measured. ``ValueError`` where a
        path cannot run here: fused paths need an engine built with fused kernels,
        ``"groups"`` a model whose blocks are its weights (``LlamaModel.pack_groups``)."""
        unknown = set(paths) - set(REGIMES)
        if unknown:
            raise ValueError(f"unknown regimes {sorted(unknown)}; the regimes are {list(REGIMES)}")
        for path in paths.values():
            if path not in ("torch", "fused", "groups"):
                raise ValueError(f"a step path is 'torch', 'fused' or 'groups', got {path!r}")
            if path != "torch" and self.ops is None:
                raise ValueError("fused paths need an engine made with kernels='fused' or 'auto'")
            if path == "torch":
                self.model.require_unpacked()
        if "groups" in paths.values() and not self.model.pack_groups():
            raise ValueError("this model has no blocks that are its weights (load a GGUF file or quantize on load)")
        self.regimes = dict(paths)

    def step_path(self, sessions: int, new_tokens: int = 1) -> StepPath:
        """The path a step of ``sessions`` sessions (the longest adding ``new_tokens``) runs
        on: the engine's, or the measured winner of the regime the step is nearest (a
        prefill chunk, or a decode step of one, a few or many rows)."""
        default: StepPath = "fused" if self.fused else "torch"
        if self.regimes is None:
            return default
        return self.regimes.get(nearest_regime(sessions, new_tokens), default)

    def _step_path(self, chunks: list[SeqChunk]) -> StepPath:
        path = self.step_path(len(chunks), max(ch.n_new for ch in chunks))
        if self._last_fused and path == "torch":
            self.view.invalidate()  # the fused steps wrote the pool, not the torch path's view
        self._last_fused = path != "torch"
        return path

    @classmethod
    def from_pretrained(
        cls,
        model: str | os.PathLike[str] = "smollm2-135m-instruct",
        *,
        policy: KVPolicy,
        device: str = "cpu",
        num_blocks: int | None = None,
        memory_bytes: int | None = None,
        block_size: int = 16,
        kernels: Kernels = "auto",
        quantize: Quantize | None = None,
    ) -> EngineCore:
        """An engine on ``model``'s weights (``weights.load_model``; ``quantize`` there)."""
        from .weights import load_model

        return cls(
            load_model(model, device=device, quantize=quantize),
            policy=policy,
            num_blocks=num_blocks,
            memory_bytes=memory_bytes,
            block_size=block_size,
            kernels=kernels,
        )

    # sessions ------------------------------------------------------------------------------------

    def add_sequence(self, *, sampling: SamplingParams | None = None, pinned: int = 0) -> int:
        """Open a session. ``pinned``: its first tokens (a system prompt) stay resident
        beside the sinks whatever the window does (see ``KVPolicy``); ``ValueError`` when
        the pool could never hold the bound that gives the session."""
        bound = self.policy.max_blocks(self.pool.block_size, pinned=pinned)  # checks pinned
        if bound is not None and bound > self.pool.num_blocks:
            raise ValueError(
                f"a session pinning {pinned} tokens is bounded by {bound} blocks ({self.policy!r}, "
                f"block_size={self.pool.block_size}), more than the pool's {self.pool.num_blocks}; "
                "pin a shorter prefix, lower the window or grow the pool"
            )
        seq_id = next(self._ids)
        params = sampling or SamplingParams()
        gen = None
        if not params.greedy:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(params.seed if params.seed is not None else seq_id)
        self._seqs[seq_id] = _Seq(SequenceKV(seq_id, self.policy, self.pool, pinned=pinned), params, gen)
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        """End a session and return all its blocks. Unknown ids are ignored (idempotent)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            seq.kv.release()

    def has_sequence(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def sequence_ids(self) -> list[int]:
        """The open sequences' ids, oldest first (those ``pool_stats().sequences`` counts)."""
        return list(self._seqs)

    def sequence_length(self, seq_id: int) -> int:
        return self._seq(seq_id).kv.num_tokens

    def sequence_blocks(self, seq_id: int) -> int:
        return self._seq(seq_id).kv.num_blocks

    def resident_blocks(self, seq_id: int) -> list[tuple[int, int]]:
        """``(logical, physical)`` of every block the session holds, in stream order."""
        return self._seq(seq_id).kv.resident_blocks()

    def evicted_tokens(self, seq_id: int) -> int:
        """Tokens between the session's pinned prefix and its window: its last token no longer saw them."""
        return self._seq(seq_id).kv.evicted_tokens

    @property
    def pins_prefixes(self) -> bool:
        return True

    # going back: tentative tokens, taken back exactly ---------------------------------------------

    @property
    def rewinds(self) -> bool:
        """This backend can hold a session's context and go back to it (``hold``, ``rewind``)."""
        return True

    def hold_blocks(self, limit: int) -> int:
        """Most blocks a hold of ``limit`` tokens keeps beyond a session's bound."""
        return -(-limit // self.pool.block_size) + 1

    def hold(self, seq_id: int, limit: int) -> None:
        """Keep what session ``seq_id`` sees now resident for up to ``limit`` more tokens, so that
        ``rewind`` can go back to it exactly; past ``limit`` the hold lapses (see ``SequenceKV``)."""
        self._seq(seq_id).kv.hold(limit)

    def release_hold(self, seq_id: int) -> None:
        """End the session's hold: its window moves on from the next step."""
        self._seq(seq_id).kv.release_hold()

    def rewind(self, seq_id: int, length: int) -> int:
        """Take session ``seq_id`` back to ``length`` tokens (held by ``hold``); the blocks it holds then."""
        kv = self._seq(seq_id).kv
        kv.rewind(length)
        self.view.invalidate()  # its row holds the K/V of tokens that are gone
        return kv.num_blocks

    def session_bound_blocks(self, chunk: int = 1, *, pinned: int = 0) -> int | None:
        """Most blocks one session (pinning ``pinned`` tokens) can hold under this policy
        (``None``: unbounded)."""
        return self.policy.max_blocks(self.pool.block_size, chunk=chunk, pinned=pinned)

    def pool_stats(self) -> PoolStats:
        return PoolStats(self.pool.num_blocks, self.pool.num_used, self.pool.block_size, len(self._seqs))

    def _seq(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise ValueError(f"seq_id={seq_id} is not an open sequence; open one with add_sequence()") from None

    # the step ------------------------------------------------------------------------------------

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]:
        """One batched forward pass over every request. Outputs are in request order."""
        self._validate(requests)
        outputs: dict[int, StepOutput] = {}
        chunks: list[SeqChunk] = []
        served: list[StepRequest] = []
        for req in requests:
            seq = self._seqs[req.seq_id]
            if not seq.kv.reserve(len(req.tokens)):
                outputs[req.seq_id] = StepOutput(
                    req.seq_id, stall=Stall.POOL_EXHAUSTED, num_tokens=seq.kv.num_tokens, num_blocks=seq.kv.num_blocks
                )
                continue
            chunks.append(SeqChunk(seq.kv, len(req.tokens), all_logits=req.all_logits))
            served.append(req)
        if chunks:
            try:
                self._run(chunks, served, outputs)
            except BaseException:
                self.view = BatchView()  # not only forgotten: its storage may hold this step's K/V
                for ch in chunks:
                    ch.seq.rollback()
                raise
        return [outputs[r.seq_id] for r in requests]

    def _forward(self, chunks: list[SeqChunk], ids: Tensor, path: StepPath) -> tuple[Tensor, StepTokens]:
        if path != "torch":
            paged = PagedBatch.build(self.policy, chunks, device=self.device)
            hidden = self.model.forward_fused(ids, paged, self.cache, self.ops, groups=path == "groups")
            return hidden, paged.tokens
        rows = self.view.prepare(self.cache, [ch.seq for ch in chunks])
        batch = AttentionBatch.build(
            self.policy,
            chunks,
            rows,
            self.view.capacity,
            head_dim=self.config.head_dim,
            group_size=self.config.group_size,
            device=self.device,
        )
        return self.model(ids, batch, self.cache, self.view), batch.tokens

    def _run(self, chunks: list[SeqChunk], served: list[StepRequest], outputs: dict[int, StepOutput]) -> None:
        ids = torch.tensor([t for r in served for t in r.tokens], dtype=torch.int64, device=self.device)
        path = self._step_path(chunks)
        fused = path != "torch"
        hidden, tokens = self._forward(chunks, ids, path)
        logits = self.model.logits(hidden, self.ops if path == "groups" else None)
        # row of each session's last token, and its rows when it asked for all of them
        spans: list[tuple[int, int]] = []
        row = 0
        for ch, req in zip(chunks, served, strict=True):
            n_rows = ch.n_new if (req.all_logits or tokens.logit_rows is None) else 1
            spans.append((row, row + n_rows))
            row += n_rows
        greedy, finite = self._greedy_and_finite(logits, [end - 1 for _, end in spans], fused)
        results: list[tuple[SeqChunk, StepRequest, int | None, Tensor | None]] = []
        faulty: list[SeqChunk] = []
        for i, (ch, req) in enumerate(zip(chunks, served, strict=True)):
            start, end = spans[i]
            if not all(finite[start:end]):
                faulty.append(ch)
                continue
            seq = self._seqs[req.seq_id]
            token: int | None = None
            if req.sample:
                token = int(greedy[i]) if seq.sampling.greedy else sample(logits[end - 1], seq.sampling, seq.generator)
            out_logits = logits[start:end] if req.all_logits else (logits[end - 1] if req.return_logits else None)
            results.append((ch, req, token, out_logits))
        # commit only once nothing more can raise: a step that fails leaves every session as it was
        for ch, req, token, out_logits in results:
            ch.seq.commit(ch.n_new)
            outputs[req.seq_id] = StepOutput(
                req.seq_id, token=token, logits=out_logits, num_tokens=ch.seq.num_tokens, num_blocks=ch.seq.num_blocks
            )
        for ch in faulty:
            outputs[ch.seq.seq_id] = StepOutput(
                ch.seq.seq_id, stall=Stall.NUMERIC_FAULT, num_tokens=ch.seq.num_tokens, num_blocks=0
            )
            self._drop_faulty(ch.seq)
        if faulty:
            # a fresh view: the old one holds the dropped rows' non-finite K/V, which other rows
            # would later see in masked columns (0 * NaN is NaN)
            self.view = BatchView()

    def _greedy_and_finite(self, logits: Tensor, last_rows: list[int], fused: bool) -> tuple[list[int], list[bool]]:
        """The greedy token of each session (its last row) and, per row, whether it is all finite."""
        if fused:
            best, ok = self.ops.greedy_rows(logits)  # one pass over the logits
            best_rows = best.tolist()
            return [best_rows[r] for r in last_rows], ok.tolist()
        # one call for the batch; a decode step's logits are already one row per session
        last = logits
        if logits.shape[0] != len(last_rows):
            last = logits.index_select(0, torch.tensor(last_rows, device=logits.device))
        # a row's sum is non-finite exactly when the row holds a NaN or an inf (finite logits
        # are far too small to overflow a float32 sum): one pass
        return last.argmax(dim=-1).tolist(), torch.isfinite(logits.sum(dim=-1)).tolist()

    def _drop_faulty(self, seq: SequenceKV) -> None:
        """Scrub a corrupt session's blocks (a block reused with NaN in it poisons its next owner) and free them."""
        bs = self.pool.block_size
        slots = torch.tensor(
            [pb * bs + j for _, pb in seq.resident_blocks() for j in range(bs)], dtype=torch.int64, device=self.device
        )
        if slots.numel():
            self.cache.k.index_fill_(2, slots, 0.0)
            self.cache.v.index_fill_(2, slots, 0.0)
        seq.release()
        del self._seqs[seq.seq_id]

    def _validate(self, requests: Sequence[StepRequest]) -> None:
        """Reject the whole step before anything changes: nothing is half-applied."""
        validate_step(requests, self.config.vocab_size, self._seq)
