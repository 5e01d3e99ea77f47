"""Under a window policy the runner equals a dense reference with in-cache positions.

The reference is written independently of the runner: for every query it takes the
explicit span (the sinks, the session's pinned prefix, and the window) and rotates the
span's keys at positions 0..len-1.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.engine import Kernels

from .tiny import FAMILY_CONFIGS, VOCAB, tiny_family, tiny_hf, tiny_runner


def _rope(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    hd = x.shape[-1]
    ang = pos.double()[:, None] * inv.double()[None, :]
    cos, sin = torch.cat((ang, ang), -1).cos().float(), torch.cat((ang, ang), -1).sin().float()
    half = hd // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def dense_reference(
    hf: PreTrainedModel,
    tokens: list[int],
    window: int | None,
    sinks: int,
    original_positions: bool = False,
    pinned: int = 0,
) -> torch.Tensor:
    """Logits for every token; query t attends to key j <= t when j is a sink (j < S), in the
    pinned prefix (j < pinned) or in the window (j > t - W). RoPE's frequencies are HF's own
    (scaled as the config says); biases and q/k norms as the checkpoint holds them."""
    c = hf.config
    sd = hf.state_dict()
    h_, kvh = c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    inv = hf.model.rotary_emb.inv_freq
    assert hf.model.rotary_emb.attention_scaling == 1.0  # the families here scale frequencies only

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * w

    x = sd["model.embed_tokens.weight"][torch.tensor(tokens)]
    n = len(tokens)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        h = norm(x, sd[p + "input_layernorm.weight"])
        q, k, v = (
            F.linear(h, sd[p + f"self_attn.{m}_proj.weight"], sd.get(p + f"self_attn.{m}_proj.bias")).view(n, -1, hd)
            for m in "qkv"
        )
        if p + "self_attn.q_norm.weight" in sd:  # Qwen3: per head, before RoPE
            q, k = norm(q, sd[p + "self_attn.q_norm.weight"]), norm(k, sd[p + "self_attn.k_norm.weight"])
        out = torch.empty(n, h_, hd)
        for t in range(n):
            if window is None:
                span = list(range(t + 1))
            else:
                span = [j for j in range(t + 1) if j < sinks or j < pinned or j > t - window]
            idx = torch.tensor(span)
            pos = idx if original_positions else torch.arange(len(span))
            ks = _rope(k[idx], pos, inv).repeat_interleave(h_ // kvh, dim=1)  # [L, H, hd]
            qt = _rope(q[t : t + 1], pos[-1:], inv)[0]  # [H, hd]
            att = torch.softmax(torch.einsum("hd,lhd->hl", qt, ks) / hd**0.5, -1)
            out[t] = torch.einsum("hl,lhd->hd", att, v[idx].repeat_interleave(h_ // kvh, dim=1))
        x = x + F.linear(out.view(n, -1), sd[p + "self_attn.o_proj.weight"], sd.get(p + "self_attn.o_proj.bias"))
        h = norm(x, sd[p + "post_attention_layernorm.weight"])
        x = x + F.linear(
            F.silu(F.linear(h, sd[p + "mlp.gate_proj.weight"])) * F.linear(h, sd[p + "mlp.up_proj.weight"]),
            sd[p + "mlp.down_proj.weight"],
        )
    x = norm(x, sd["model.norm.weight"])
    return F.linear(x, sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))


def stream_logits(engine: EngineCore, tokens: list[int], chunks: list[int], pinned: int = 0) -> torch.Tensor:
    seq = engine.add_sequence(pinned=pinned)
    rows, at = [], 0
    for size in chunks:
        out = engine.step([StepRequest(seq, tokens[at : at + size], all_logits=True)])[0]
        assert out.ok and out.logits is not None
        rows.append(out.logits)
        at += size
    return torch.cat(rows)


@pytest.mark.parametrize(("window", "sinks", "block_size"), [(8, 4, 4), (7, 0, 4), (6, 3, 4), (5, 2, 16)])
def test_window_equals_dense_reference(window: int, sinks: int, block_size: int, kernels: Kernels) -> None:
    hf = tiny_hf(3)
    tokens = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(5)).tolist()
    ref = dense_reference(hf, tokens, window, sinks)
    policy = KVPolicy.windowed(window, sinks=sinks)
    for chunks in ([1] * 60, [7, 1, 13, 2, 30, 7]):  # token by token, and uneven chunks
        engine = EngineCore(tiny_runner(hf), policy=policy, num_blocks=64, block_size=block_size, kernels=kernels)
        got = stream_logits(engine, tokens, chunks)
        assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
@pytest.mark.usefixtures("one_torch_thread")
def test_each_family_under_a_window_equals_the_dense_reference(family: str, kernels: Kernels) -> None:
    """Scaled RoPE at in-cache positions, biases, q/k norms, untied heads under window + sinks;
    and under the full policy the reference is HF's model itself."""
    hf = tiny_family(family, seed=3)
    tokens = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        full = hf(torch.tensor([tokens])).logits[0]
    assert float((dense_reference(hf, tokens, None, 0) - full).abs().max() / full.abs().max()) < 1e-4
    ref = dense_reference(hf, tokens, 8, 4)
    for chunks in ([1] * 60, [7, 1, 13, 2, 30, 7]):
        engine = EngineCore(
            tiny_runner(hf), policy=KVPolicy.windowed(8, sinks=4), num_blocks=64, block_size=4, kernels=kernels
        )
        got = stream_logits(engine, tokens, chunks)
        assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4


def test_full_policy_equals_dense_reference_and_window_differs(kernels: Kernels) -> None:
    hf = tiny_hf(4)
    tokens = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    full = dense_reference(hf, tokens, None, 0)
    engine = EngineCore(tiny_runner(hf), policy=KVPolicy.full(), num_blocks=64, block_size=4, kernels=kernels)
    assert float((stream_logits(engine, tokens, [40]) - full).abs().max() / full.abs().max()) < 1e-4
    # the scheme matters: original positions give different logits once the window slid
    in_cache = dense_reference(hf, tokens, 8, 4)
    original = dense_reference(hf, tokens, 8, 4, original_positions=True)
    assert float((in_cache[20:] - original[20:]).abs().max()) > 1e-3
    assert float((in_cache[:12] - original[:12]).abs().max()) < 1e-4


def test_batch_of_windowed_sessions_matches_each_alone(kernels: Kernels) -> None:
    hf = tiny_hf(5)
    policy = KVPolicy.windowed(6, sinks=2)
    gen = torch.Generator().manual_seed(9)
    streams = [torch.randint(0, VOCAB, (50,), generator=gen).tolist() for _ in range(3)]
    refs = [dense_reference(hf, s, 6, 2) for s in streams]
    engine = EngineCore(tiny_runner(hf), policy=policy, num_blocks=64, block_size=4, kernels=kernels)
    seqs = [engine.add_sequence() for _ in streams]
    offsets = [0, 0, 0]
    sizes = [[3, 1, 20, 1, 25], [1] * 10 + [40], [50]]
    for round_ in range(max(len(s) for s in sizes)):
        reqs, who = [], []
        for i, seq in enumerate(seqs):
            if round_ < len(sizes[i]):
                n = sizes[i][round_]
                reqs.append(StepRequest(seq, streams[i][offsets[i] : offsets[i] + n], all_logits=True))
                who.append((i, offsets[i], n))
                offsets[i] += n
        for out, (i, at, n) in zip(engine.step(reqs), who, strict=True):
            assert out.logits is not None
            ref = refs[i][at : at + n]
            assert float((out.logits - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.parametrize("policy", [KVPolicy.windowed(6, sinks=2), KVPolicy.full()])
def test_sessions_that_come_and_go_keep_exact_logits(policy: KVPolicy, kernels: Kernels) -> None:
    """Random participation per step: rows of the batch view are reused, holed, compacted and rebuilt."""
    hf = tiny_hf(6)
    gen = torch.Generator().manual_seed(11)
    n_tok = 120
    streams = [torch.randint(0, VOCAB, (n_tok,), generator=gen).tolist() for _ in range(3)]
    window = policy.window
    refs = [dense_reference(hf, s, window, policy.sinks) for s in streams]
    engine = EngineCore(tiny_runner(hf), policy=policy, num_blocks=128, block_size=4, kernels=kernels)
    seqs = [engine.add_sequence() for _ in streams]
    at = [0, 0, 0]
    while min(at) < n_tok:
        reqs, who = [], []
        for i, seq in enumerate(seqs):
            if at[i] < n_tok and torch.rand((), generator=gen) < 0.7:
                n = min(int(torch.randint(1, 6, (), generator=gen)), n_tok - at[i])
                reqs.append(StepRequest(seq, streams[i][at[i] : at[i] + n], all_logits=True))
                who.append((i, at[i], n))
                at[i] += n
        if not reqs:
            continue
        for out, (i, start, n) in zip(engine.step(reqs), who, strict=True):
            assert out.logits is not None
            ref = refs[i][start : start + n]
            assert float((out.logits - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(
    ("window", "sinks", "pinned", "block_size"), [(8, 4, 13, 4), (7, 0, 9, 4), (6, 4, 2, 4), (5, 2, 21, 16)]
)
def test_pinned_prefix_equals_dense_reference(
    window: int, sinks: int, pinned: int, block_size: int, kernels: Kernels
) -> None:
    hf = tiny_hf(7)
    tokens = torch.randint(0, VOCAB, (70,), generator=torch.Generator().manual_seed(8)).tolist()
    ref = dense_reference(hf, tokens, window, sinks, pinned=pinned)
    policy = KVPolicy.windowed(window, sinks=sinks)
    for chunks in ([1] * 70, [pinned, 1, 13, 2, 30, 70 - pinned - 46], [3, 40, 27]):  # the prompt whole, or split
        engine = EngineCore(tiny_runner(hf), policy=policy, num_blocks=64, block_size=block_size, kernels=kernels)
        got = stream_logits(engine, tokens, chunks, pinned=pinned)
        assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4
    # a pin longer than the sinks matters: without it the stream scores differently once the window slid
    plain = dense_reference(hf, tokens, window, sinks)
    assert (float((plain[40:] - ref[40:]).abs().max()) > 1e-3) == (pinned > sinks)


@pytest.mark.usefixtures("one_torch_thread")
def test_sessions_pinning_different_prefixes_share_a_step(kernels: Kernels) -> None:
    hf = tiny_hf(8)
    policy = KVPolicy.windowed(6, sinks=2)
    gen = torch.Generator().manual_seed(12)
    pins = [0, 11, 5]  # the sinks alone, a long prompt, a short one: one step, three pinned counts
    streams = [torch.randint(0, VOCAB, (50,), generator=gen).tolist() for _ in pins]
    refs = [dense_reference(hf, s, 6, 2, pinned=p) for s, p in zip(streams, pins, strict=True)]
    engine = EngineCore(tiny_runner(hf), policy=policy, num_blocks=64, block_size=4, kernels=kernels)
    seqs = [engine.add_sequence(pinned=p) for p in pins]
    at = 0
    for n in [1, 12, 1, 1, 3, 20, 1, 1, 10]:
        reqs = [StepRequest(seq, s[at : at + n], all_logits=True) for seq, s in zip(seqs, streams, strict=True)]
        outs = engine.step(reqs)
        for out, ref in zip(outs, refs, strict=True):
            assert out.logits is not None
            assert float((out.logits - ref[at : at + n]).abs().max() / ref.abs().max()) < 1e-4
        at += n


@functools.cache
def _long_conversation(pinned: int, n_conv: int) -> tuple[PreTrainedModel, list[int], torch.Tensor]:
    """The tiny model, a random stream and its reference logits: computed once for both paths."""
    hf = tiny_hf(9)
    gen = torch.Generator().manual_seed(13)
    tokens = torch.randint(0, VOCAB, (pinned + n_conv,), generator=gen).tolist()
    return hf, tokens, dense_reference(hf, tokens, 256, 4, pinned=pinned)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_300_token_pinned_prompt_survives_2000_tokens_of_conversation(kernels: Kernels) -> None:
    """The issue's check: W = 256, 4 sinks, blocks of 16, a 300-token prompt, 2,000 tokens after it."""
    policy = KVPolicy.windowed(256, sinks=4)
    bs, pinned, n_conv, turn = 16, 300, 2000, 24
    hf, tokens, ref = _long_conversation(pinned, n_conv)
    # a pool exactly the size of the bound with the longest chunk: a step that overstepped it would stall
    bound = policy.max_blocks(bs, chunk=turn, pinned=pinned)
    decode_bound = math.ceil(pinned / bs) + math.ceil(256 / bs) + 1
    assert bound is not None and policy.max_blocks(bs, pinned=pinned) == decode_bound
    engine = EngineCore(tiny_runner(hf), policy=policy, num_blocks=bound, block_size=bs, kernels=kernels)
    seq = engine.add_sequence(pinned=pinned)
    chunks = [pinned]
    while sum(chunks) < len(tokens):  # turns: a user's chunk, then a reply decoded token by token
        for n in [turn] + [1] * 40:
            chunks.append(min(n, len(tokens) - sum(chunks)))
    chunks = [c for c in chunks if c > 0]
    rows, at, prompt_blocks = [], 0, None
    for n in chunks:
        out = engine.step([StepRequest(seq, tokens[at : at + n], all_logits=True)])[0]
        assert out.ok and out.logits is not None
        rows.append(out.logits)
        at += n
        assert out.num_blocks <= decode_bound  # after every step, the decode bound
        held = dict(engine.resident_blocks(seq))
        if prompt_blocks is None:
            prompt_blocks = {lb: held[lb] for lb in range(math.ceil(pinned / bs))}
        assert {lb: held.get(lb) for lb in prompt_blocks} == prompt_blocks  # the prompt's blocks never moved
    got = torch.cat(rows)
    assert at == pinned + n_conv and engine.sequence_blocks(seq) <= decode_bound
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4
    # and the conversation did slide: the window alone no longer sees the prompt
    assert engine.evicted_tokens(seq) == n_conv - 256


def test_a_prefix_too_large_for_the_pool_is_refused_at_open() -> None:
    policy = KVPolicy.windowed(16, sinks=4)
    engine = EngineCore(tiny_runner(tiny_hf(1)), policy=policy, num_blocks=12, block_size=4, kernels="torch")
    with pytest.raises(ValueError, match="pinning 40 tokens"):
        engine.add_sequence(pinned=40)  # 10 + 4 + 1 blocks > 12
    assert engine.pool_stats().sequences == 0
    engine.add_sequence(pinned=20)  # 5 + 4 + 1 fits
