// Fused CPU kernels for one engine step (float32). The torch path in model.py and
// attention.py is the reference; tests hold these kernels to it.
//
// Why: a batch-32 decode step of a 30-layer model is ~1,200 small torch ops plus a
// gather of every session's K/V into a contiguous view. Here all layers are one call,
// nine kernels a layer, and attention reads each session's blocks in place in the pool.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "chunk_attention.h"
#include "groups.h"
#include "tiles.h"
#include "vector16.h"

namespace {

using metronome::check_f32;
using metronome::check_i64;

// The sum of x[i]^2 over a row: four partial sums, independent chains (one `omp simd`
// sum was a single chain of dependent adds: 32 rows of 576 took 5.6 us on AVX2).
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
inline float sum_squares(const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    const __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
    a2 = _mm256_fmadd_ps(v2, v2, a2);
    a3 = _mm256_fmadd_ps(v3, v3, a3);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(v, v, a0);
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  float ss = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  for (; i < n; ++i) ss += x[i] * x[i];
  return ss;
}
#else
inline float sum_squares(const float* x, int64_t n) {
  vf a0 = vf{}, a1 = vf{};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const vf v0 = vload(x + i), v1 = vload(x + i + kLanes);
    a0 += v0 * v0;
    a1 += v1 * v1;
  }
  for (; i + kLanes <= n; i += kLanes) {
    const vf v = vload(x + i);
    a0 += v * v;
  }
  float ss = hsum(a0 + a1);
  for (; i < n; ++i) ss += x[i] * x[i];
  return ss;
}
#endif

// x * rsqrt(mean(x^2) + eps) * w, per row.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_f32(x, "x");
  check_f32(w, "weight");
  const int64_t n = x.size(-1);
  TORCH_CHECK(n > 0 && w.numel() == n, "the norm's weight must have one entry per column");
  const int64_t rows = x.numel() / n;
  auto out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xp + r * n;
      float* orow = op + r * n;
      const float inv = 1.f / std::sqrt(sum_squares(xr, n) / static_cast<float>(n) + feps);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) orow[i] = xr[i] * inv * wp[i];
    }
  });
  return out;
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// the AVX2 build's SiLU and fold use vector16.h's exp8: on the 16-float vectors GCC turned
// vexp's clamps into sixteen scalar compares and blends (a silu_mul of 32 x 1536 floats
// took twice torch's time)
#define METRONOME_EXP8 1
#endif

// [T, 2f] (gate | up) -> silu(gate) * up, [T, f].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_f32(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up must be [rows, 2 * f]");
  const int64_t rows = gate_up.size(0);
  const int64_t f = gate_up.size(1) / 2;
  auto out = at::empty({rows, f}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / f), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* g = gp + r * 2 * f;
      const float* u = g + f;
      float* o = op + r * f;
      int64_t i = 0;
#ifdef METRONOME_EXP8
      const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
      for (; i + 8 <= f; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_xor_ps(gv, sign));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
      }
#endif
      for (; i + kLanes <= f; i += kLanes) {
        const vf gv = vload(g + i);
        const vf out = gv / (1.f + vexp(-gv)) * vload(u + i);
        vstore(o + i, out);
      }
      for (; i < f; ++i) o[i] = g[i] / (1.f + fast_exp(-g[i])) * u[i];
    }
  });
  return out;
}

// The greedy choice of one row of logits: the first index of its largest value, in one
// pass. Each lane keeps its own maximum and where it first saw it (a strictly greater
// value moves both), so the first occurrence overall is the smallest index among the
// lanes that hold the row's maximum. `bad` sums x - x, which is 0 exactly for finite x:
// NaN once any NaN or inf went by (the engine's fault check). Two passes (the maximum,
// then a scalar scan for its first index) took 89 us a row of 49152 on AVX2, where GCC
// also lowered the 16-float select lane by lane; this one reads a row at about a sum's rate.
struct RowBest {
  float max = -std::numeric_limits<float>::infinity();
  int64_t index = 0;
  float bad = 0.f;

  void merge(float m, int64_t at) {
    if (m > max || (m == max && at < index)) max = m, index = at;
  }
};

#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr int64_t kBestStep = 32;  // four 8-float registers: independent compare chains

// the lanes' best over x[0 .. n), n a multiple of kBestStep
inline RowBest lanes_best(const float* x, int64_t n) {
  __m256 mx[4], bad = _mm256_setzero_ps();
  __m256i at[4], cur[4];
  for (int u = 0; u < 4; ++u) {
    mx[u] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    at[u] = _mm256_setzero_si256();
    cur[u] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * u));
  }
  const __m256i step = _mm256_set1_epi32(kBestStep);
  for (int64_t i = 0; i < n; i += kBestStep) {
    for (int u = 0; u < 4; ++u) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * u);
      const __m256 gt = _mm256_cmp_ps(v, mx[u], _CMP_GT_OQ);
      mx[u] = _mm256_max_ps(v, mx[u]);  // v > mx ? v : mx
      at[u] = _mm256_blendv_epi8(at[u], cur[u], _mm256_castps_si256(gt));
      bad = _mm256_add_ps(bad, _mm256_sub_ps(v, v));
      cur[u] = _mm256_add_epi32(cur[u], step);
    }
  }
  alignas(32) float m[32], b[8];
  alignas(32) int32_t idx[32];
  for (int u = 0; u < 4; ++u) {
    _mm256_store_ps(m + 8 * u, mx[u]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 8 * u), at[u]);
  }
  _mm256_store_ps(b, bad);
  RowBest best;
  for (int l = 0; l < 32; ++l) best.merge(m[l], idx[l]);
  for (int l = 0; l < 8; ++l) best.bad += b[l];
  return best;
}
#else
constexpr int64_t kBestStep = kLanes;

inline RowBest lanes_best(const float* x, int64_t n) {
  vf mx = vsplat(-std::numeric_limits<float>::infinity()), bad = vf{};
  vi at = vi{}, cur;
  for (int l = 0; l < kLanes; ++l) cur[l] = l;
  for (int64_t i = 0; i < n; i += kLanes) {
    const vf v = vload(x + i);
    const vi gt = v > mx;
    mx = gt ? v : mx;
    at = gt ? cur : at;
    bad += v - v;
    cur += kLanes;
  }
  RowBest best;
  for (int l = 0; l < kLanes; ++l) best.merge(mx[l], at[l]);
  best.bad = hsum(bad);
  return best;
}
#endif

// index of the first largest value, and whether every value is finite
inline std::pair<int64_t, bool> row_best(const float* x, int64_t vocab) {
  const int64_t n = vocab / kBestStep * kBestStep;
  RowBest best = lanes_best(x, n);
  for (int64_t i = n; i < vocab; ++i) {  // after every lane's index: strictly greater moves it
    if (x[i] > best.max) best.max = x[i], best.index = i;
    best.bad += x[i] - x[i];
  }
  return {best.index, best.bad == 0.f};
}

// Per row of logits [rows, vocab]: the first index of the largest value (greedy
// decoding, as torch.argmax), and whether the row is all finite (the engine's fault check).
std::tuple<at::Tensor, at::Tensor> greedy_rows(const at::Tensor& logits) {
  check_f32(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, "logits must be [rows, vocab]");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(vocab < (int64_t{1} << 31) - 64, "the vocabulary must fit 32-bit indices");
  auto best = at::empty({rows}, logits.options().dtype(at::kLong));
  auto finite = at::empty({rows}, logits.options().dtype(at::kBool));
  const float* lp = logits.data_ptr<float>();
  int64_t* bp = best.data_ptr<int64_t>();
  bool* fp = finite.data_ptr<bool>();
  at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      std::tie(bp[r], fp[r]) = row_best(lp + r * vocab, vocab);
    }
  });
  return {best, finite};
}

// rotate-half RoPE of one head vector
inline void rope(const float* x, const float* cos, const float* sin, float* out, int64_t hd) {
  const int64_t half = hd / 2;
#pragma omp simd
  for (int64_t d = 0; d < half; ++d) out[d] = x[d] * cos[d] - x[d + half] * sin[d];
#pragma omp simd
  for (int64_t d = half; d < hd; ++d) out[d] = x[d] * cos[d] + x[d - half] * sin[d];
}

// Split a step's fused q|k|v projection [T, (H + 2 KVH) * hd]: rotate q (at stream
// positions, and at in-cache positions for the sinks when sink_cos is given), rotate k,
// and write k and v into this layer's pool at each token's slot.
std::tuple<at::Tensor, at::Tensor> rope_store(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                              const std::optional<at::Tensor>& sink_cos,
                                              const std::optional<at::Tensor>& sink_sin, const at::Tensor& slots,
                                              at::Tensor k_cache, at::Tensor v_cache, int64_t num_heads) {
  check_f32(qkv, "qkv");
  check_i64(slots, "slot_mapping");
  check_f32(k_cache, "k_cache");
  check_f32(v_cache, "v_cache");
  TORCH_CHECK(qkv.dim() == 2 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "bad qkv or cache shape");
  const int64_t T = qkv.size(0);
  const int64_t kvh = k_cache.size(0);
  const int64_t num_slots = k_cache.size(1);
  const int64_t hd = k_cache.size(2);
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * kvh) * hd, "qkv width does not match the heads");
  TORCH_CHECK(slots.numel() == T, "one slot per token");
  auto check_angles = [&](const at::Tensor& c, const at::Tensor& s, const char* name) {
    check_f32(c, name);
    check_f32(s, name);
    TORCH_CHECK(c.dim() == 2 && c.size(0) == T && c.size(1) == hd && s.sizes() == c.sizes(), name,
                " must be [tokens, head_dim]");
  };
  check_angles(cos, sin, "cos/sin");
  const bool sinks = sink_cos.has_value();
  TORCH_CHECK(sinks == sink_sin.has_value(), "give sink_cos and sink_sin together");
  if (sinks) check_angles(*sink_cos, *sink_sin, "sink_cos/sink_sin");
  auto q = at::empty({T, num_heads, hd}, qkv.options());
  auto q_sink = sinks ? at::empty({T, num_heads, hd}, qkv.options()) : at::empty({0}, qkv.options());
  const float* src = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const float* scp = sinks ? sink_cos->data_ptr<float>() : nullptr;
  const float* ssp = sinks ? sink_sin->data_ptr<float>() : nullptr;
  const int64_t* slot = slots.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  float* qsp = sinks ? q_sink.data_ptr<float>() : nullptr;
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t width = qkv.size(1);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "slot out of the pool");
  }
  at::parallel_for(0, T, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* row = src + t * width;
      const float* c = cp + t * hd;
      const float* s = sp + t * hd;
      for (int64_t h = 0; h < num_heads; ++h) {
        rope(row + h * hd, c, s, qp + (t * num_heads + h) * hd, hd);
        if (sinks) rope(row + h * hd, scp + t * hd, ssp + t * hd, qsp + (t * num_heads + h) * hd, hd);
      }
      const float* k = row + num_heads * hd;
      const float* v = k + kvh * hd;
      for (int64_t h = 0; h < kvh; ++h) {
        rope(k + h * hd, c, s, kc + (h * num_slots + slot[t]) * hd, hd);
        std::memcpy(vc + (h * num_slots + slot[t]) * hd, v + h * hd, hd * sizeof(float));
      }
    }
  });
  return {q, q_sink};
}

// The next block's K and V lines, fetched a few at a time from inside the fold of the
// current block, so that memory stays busy while the fold computes. All of its 128 lines
// (8 KB) fetched at the block's start took every fill buffer: the fold waited for most of
// them to arrive, then computed with memory idle, so a block cost its read plus its
// arithmetic (scripts/probe_kv_read.cpp). Spread, attention took 0.73-0.75x the time from
// memory (AVX2, one or two threads, scripts/bench_attention.py; docs/engine.md). Into L2
// (prefetcht2), not L1: prefetcht0 was faster in L3 but slower from memory.
struct Ahead {
  const char* k = nullptr;
  const char* v = nullptr;
  int64_t lines = 0;  // 64-byte lines of each
  int64_t at = 0;     // the next line of both; lines: nothing (left) to fetch

  void to(const float* kb, const float* vb) {
    k = reinterpret_cast<const char*>(kb);
    v = reinterpret_cast<const char*>(vb);
    at = 0;
  }
  void none() { at = lines; }
  // line `at` of K and of V, into L2 (locality 1: prefetcht2)
  void line() {
    __builtin_prefetch(k + at * 64, 0, 1);
    __builtin_prefetch(v + at * 64, 0, 1);
    ++at;
  }
  // the next N lines of K and of V: no loop, no division (the fold calls this ~50 times a
  // block, and a rate kept in fixed point cost 8% with K/V in cache)
  template <int N>
  inline void step() {
#pragma GCC unroll 4
    for (int r = 0; r < N; ++r) {
      if (at < lines) line();
    }
  }
  void rest() {
    while (at < lines) line();
  }
};

// Online-softmax state of the G query heads that share one kv head, for one query token.
struct HeadsState {
  float* max;  // [G]
  float* sum;  // [G, kLanes]: per lane, summed once at the end (no horizontal sum a fold)
  float* acc;  // [G, hd]
};

#ifdef __AVX512F__
// Sixteen vectors to one whose lane j is the sum of d[j]: a transposing tree of 45
// shuffles and adds, where sixteen horizontal sums take about 130.
inline vf sum16(const vf* d) {
  __m512 pairs[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_loadu_ps(reinterpret_cast<const float*>(d + 2 * i));
    const __m512 b = _mm512_loadu_ps(reinterpret_cast<const float*>(d + 2 * i + 1));
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  __m512 quads[4];  // per 128-bit lane: the partial sums of four vectors
  for (int i = 0; i < 4; ++i) {
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 lo = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 hi = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
  vf out;
  std::memcpy(&out, &r, sizeof(out));
  return out;
}

// A NaN score may be passed over here; vexp still carries it into the weights.
inline float vmax(vf v) { return _mm512_reduce_max_ps(reinterpret_cast<__m512>(v)); }
#elif defined(__AVX2__)
// The same transposing sum on 8-float registers: each vector's halves added, then eight
// at a time folded by three rounds of pairwise adds (hadd) and one swap of 128-bit lanes.
// Sixteen scalar horizontal sums took about four times the keys' dot products here.
inline __m256 sum8(const __m256* s) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline vf sum16(const vf* d) {
  __m256 halves[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    const float* p = reinterpret_cast<const float*>(d + j);
    halves[j] = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
  }
  vf out;
  const __m256 lo = sum8(halves), hi = sum8(halves + 8);
  std::memcpy(&out, &lo, sizeof(lo));
  std::memcpy(reinterpret_cast<float*>(&out) + 8, &hi, sizeof(hi));
  return out;
}

// A tree of four maxima, where a scalar loop over the lanes is a chain of fifteen. A NaN
// score may be passed over here; vexp still carries it into the weights.
inline float vmax(vf v) {
  __m256 lo, hi;
  std::memcpy(&lo, &v, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const float*>(&v) + 8, sizeof(hi));
  const __m256 m = _mm256_max_ps(lo, hi);
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

#ifdef METRONOME_EXP8
// The softmax's vector steps on the 16 keys' lanes, as two 8-float registers.
inline vf exp_keys(vf s) {
  __m256 h[2];
  std::memcpy(h, &s, sizeof(h));
  h[0] = exp8(h[0]);
  h[1] = exp8(h[1]);
  std::memcpy(&s, h, sizeof(h));
  return s;
}

// lanes m .. 15 of s set to `fill`
inline vf mask_keys(vf s, int64_t m, float fill) {
  __m256 h[2];
  std::memcpy(h, &s, sizeof(h));
  const __m256 limit = _mm256_set1_ps(static_cast<float>(m)), f = _mm256_set1_ps(fill);
  const __m256 lane0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 lane1 = _mm256_add_ps(lane0, _mm256_set1_ps(8.f));
  h[0] = _mm256_blendv_ps(f, h[0], _mm256_cmp_ps(lane0, limit, _CMP_LT_OQ));
  h[1] = _mm256_blendv_ps(f, h[1], _mm256_cmp_ps(lane1, limit, _CMP_LT_OQ));
  std::memcpy(&s, h, sizeof(h));
  return s;
}
#define METRONOME_KEYS_PRIMITIVES 1
#endif
#else
inline vf sum16(const vf* d) {
  vf r;
  for (int j = 0; j < kLanes; ++j) r[j] = hsum(d[j]);
  return r;
}

inline float vmax(vf v) { return hmax(v); }
#endif

#ifndef METRONOME_KEYS_PRIMITIVES
inline vf exp_keys(vf s) { return vexp(s); }

inline vf mask_keys(vf s, int64_t m, float fill) {
  const vf lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < static_cast<float>(m) ? s : vsplat(fill);
}
#endif

// The online-softmax update of head g by up to sixteen keys' scores s (lanes from m on are
// not keys): the running max moves, the keys' weights exp(s - max) go to `weights` and to
// the head's running sums, and the return value is the factor its output sums must be
// multiplied by before the weighted values are added.
inline float softmax_update(vf s, int64_t m, HeadsState& st, int64_t g, float* weights) {
  s = mask_keys(s, m, -std::numeric_limits<float>::infinity());
  const float m_old = st.max[g];
  const float m_new = std::max(m_old, vmax(s));
  // the running max rarely moves after the first keys: skip the exp when it stays
  const float corr = m_old == m_new                                   ? 1.f
                     : m_old == -std::numeric_limits<float>::infinity() ? 0.f
                                                                        : exp_keys(vsplat(m_old - m_new))[0];
  const vf p = mask_keys(exp_keys(s - m_new), m, 0.f);
  st.max[g] = m_new;
  float* sum = st.sum + g * kLanes;
  const vf total = vload(sum) * corr + p;
  vstore(sum, total);
  vstore(weights, p);  // read back one by one: a vector store forwards to scalar loads
  return corr;
}

// Fold n contiguous keys (K and V rows of head_dim = 16 * NV floats) into the state,
// each head scoring them with its own query vector (q + g * head_dim). Sixteen keys at a
// time: their K and V rows (8 KB at head_dim 64) stay in L1 while every head of the group
// uses them, so each row comes from memory once a step for all the group's heads.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// AVX2 (16 registers of 8 floats). The dots: eight keys at a time, one 8-lane sum each, the
// loop over head_dim outside the loop over keys, so that each 8 floats of the query are
// loaded once for eight FMAs and the eight sums are independent chains (each FMA's other
// operand comes from memory: 8 sums + 1 query register); sum8 folds them. The output sums
// are 2 * NV registers a head, independent chains already.
template <int NV>
inline void fold_keys(const float* q, const float* k, const float* v, int64_t n, int64_t G, float scale,
                      HeadsState& st, Ahead& ahead) {
  constexpr int64_t HD = kLanes * NV;
  constexpr int W = HD / 8;  // 8-float registers a row
  const __m256 scale8 = _mm256_set1_ps(scale);
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - j0);
    const float* kr = k + j0 * HD;
    const float* vr = v + j0 * HD;
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = q + g * HD;
      alignas(64) float scores[kLanes] = {};
      for (int h = 0; h * 8 < m; ++h) {
        // keys past m read the last key again (its lanes are masked in softmax_update)
        const float* kj[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) kj[j] = kr + std::min<int64_t>(8 * h + j, m - 1) * HD;
        __m256 dots[8];
        const __m256 q0 = _mm256_loadu_ps(qg);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) dots[j] = _mm256_mul_ps(q0, _mm256_loadu_ps(kj[j]));
#pragma GCC unroll 16
        for (int c = 1; c < W; ++c) {
          const __m256 qc = _mm256_loadu_ps(qg + 8 * c);
#pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) dots[j] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kj[j] + 8 * c), dots[j]);
        }
        _mm256_store_ps(scores + 8 * h, _mm256_mul_ps(sum8(dots), scale8));
        ahead.step<3>();  // with one a key below: 66 of each, a block's 64 (head_dim 64, 3 heads)
      }
      alignas(64) float weights[kLanes];
      const __m256 c8 = _mm256_set1_ps(softmax_update(vload(scores), m, st, g, weights));
      float* accp = st.acc + g * HD;
      __m256 acc[W];
#pragma GCC unroll 16
      for (int c = 0; c < W; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(accp + 8 * c), c8);
      for (int64_t j = 0; j < m; ++j) {
        const __m256 pj = _mm256_set1_ps(weights[j]);
#pragma GCC unroll 16
        for (int c = 0; c < W; ++c) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + j * HD + 8 * c), acc[c]);
        ahead.step<1>();
      }
#pragma GCC unroll 16
      for (int c = 0; c < W; ++c) _mm256_storeu_ps(accp + 8 * c, acc[c]);
    }
  }
}
#else
template <int NV>
inline void fold_keys(const float* q, const float* k, const float* v, int64_t n, int64_t G, float scale,
                      HeadsState& st, Ahead& ahead) {
  constexpr int64_t HD = kLanes * NV;
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - j0);
    const float* kr = k + j0 * HD;
    const float* vr = v + j0 * HD;
    for (int64_t g = 0; g < G; ++g) {
      vf qv[NV];
      for (int c = 0; c < NV; ++c) qv[c] = vload(q + g * HD + c * kLanes) * scale;
      vf dots[kLanes];
      key_dots<NV>(qv, kr, HD, m, dots);
      alignas(64) float weights[kLanes];
      const float corr = softmax_update(sum16(dots), m, st, g, weights);
      float* accp = st.acc + g * HD;
      // two sums, even and odd keys, halve the chain of dependent adds
      vf acc[NV], odd[NV];
      for (int c = 0; c < NV; ++c) acc[c] = vload(accp + c * kLanes) * corr, odd[c] = vsplat(0.f);
      int64_t j = 0;
      for (; j + 1 < m; j += 2) {
        const float p0 = weights[j], p1 = weights[j + 1];
        for (int c = 0; c < NV; ++c) {
          acc[c] += p0 * vload(vr + j * HD + c * kLanes);
          odd[c] += p1 * vload(vr + (j + 1) * HD + c * kLanes);
        }
        ahead.step<3>();  // 72 lines of each a block, its 64 (head_dim 64, 3 heads)
      }
      if (j < m) {
        for (int c = 0; c < NV; ++c) acc[c] += weights[j] * vload(vr + j * HD + c * kLanes);
      }
      for (int c = 0; c < NV; ++c) vstore(accp + c * kLanes, acc[c] + odd[c]);
    }
  }
}
#endif

// Any other head size: plain loops.
inline void fold_keys_any(const float* q, const float* k, const float* v, int64_t n, int64_t G, int64_t hd,
                          float scale, HeadsState& st) {
  for (int64_t g = 0; g < G; ++g) {
    const float* qg = q + g * hd;
    float* acc = st.acc + g * hd;
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.f;
      for (int64_t d = 0; d < hd; ++d) s += qg[d] * k[j * hd + d];
      s *= scale;
      const float m_old = st.max[g];
      const float m_new = std::max(m_old, s);
      const float corr = m_old == -std::numeric_limits<float>::infinity() ? 0.f : fast_exp(m_old - m_new);
      const float p = fast_exp(s - m_new);
      st.max[g] = m_new;
      st.sum[g * kLanes] = st.sum[g * kLanes] * corr + p;  // lane 0 of the head's sums
      for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * corr + p * v[j * hd + d];
    }
  }
}

struct AttentionArgs {
  const float* q;
  const float* q_sink;  // == q when the sinks use the stream rotation
  const float* k_cache;
  const float* v_cache;
  float* out;
  const int64_t* query_start;
  const int64_t* positions;
  const int64_t* block_logical;
  const int64_t* block_physical;
  const int64_t* block_count;
  const int64_t* pinned;  // [B] first tokens each session keeps, or null: `sinks` for every session
  int64_t H, G, hd, num_slots, max_blocks, block_size, window, sinks;
  float scale;

  // where physical block p of kv head kh starts in k_cache and v_cache, in floats
  int64_t block_at(int64_t kh, int64_t p) const { return (kh * num_slots + p * block_size) * hd; }
};

// One (session, kv head): every query token of the session, block by block. Within a
// block the visible keys are at most two runs, the sinks and the window, so there is
// no per-key mask.
// then_k, then_v: the first block of the task this thread takes next (or null), fetched
// while this one's last block is folded.
template <int NV>
void attend_task(const AttentionArgs& a, int64_t b, int64_t kh, int64_t row0, int64_t row1, const float* then_k,
                 const float* then_v, std::vector<float>& scratch) {
  const int64_t G = a.G, hd = a.hd, bs = a.block_size;
  scratch.resize(G * (1 + kLanes + hd));
  HeadsState st{scratch.data(), scratch.data() + G, scratch.data() + G * (1 + kLanes)};
  Ahead ahead;
  ahead.lines = bs * hd * static_cast<int64_t>(sizeof(float)) / 64;
  auto fold = [&](const float* qq, const float* k, const float* v, int64_t n) {
    if constexpr (NV > 0) {
      fold_keys<NV>(qq, k, v, n, G, a.scale, st, ahead);
    } else {
      fold_keys_any(qq, k, v, n, G, hd, a.scale, st);
    }
  };
  const int64_t* lg = a.block_logical + b * a.max_blocks;
  const int64_t* ph = a.block_physical + b * a.max_blocks;
  const int64_t sinks = a.window > 0 && a.pinned != nullptr ? a.pinned[b] : a.sinks;
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t t = a.positions[row];
    // stream keys this query sees: [0, n_sink) with q_sink, [lo, t] with q
    const int64_t n_sink = a.window > 0 ? std::min(sinks, t + 1) : 0;
    const int64_t lo = a.window > 0 ? std::max(sinks, t - a.window + 1) : 0;
    const float* q = a.q + (row * a.H + kh * G) * hd;
    const float* q_sink = a.q_sink + (row * a.H + kh * G) * hd;
    std::fill(st.max, st.max + G, -std::numeric_limits<float>::infinity());
    std::fill(st.sum, st.sum + G * kLanes, 0.f);
    std::fill(st.acc, st.acc + G * hd, 0.f);
    for (int64_t i = 0; i < a.block_count[b]; ++i) {
      const int64_t first = lg[i] * bs;
      if (first > t) break;  // blocks are in stream order
      const int64_t base = a.block_at(kh, ph[i]);
      const float* kb = a.k_cache + base;
      const float* vb = a.v_cache + base;
      // blocks lie anywhere in the pool, so the hardware prefetcher cannot see the next one
      if (i + 1 < a.block_count[b] && lg[i + 1] * bs <= t) {
        const int64_t next = a.block_at(kh, ph[i + 1]);
        ahead.to(a.k_cache + next, a.v_cache + next);
      } else if (row + 1 == row1 && then_k != nullptr) {
        ahead.to(then_k, then_v);
      } else {
        ahead.none();
      }
      const int64_t s1 = std::min(first + bs, n_sink);
      if (s1 > first) fold(q_sink, kb, vb, s1 - first);
      const int64_t w0 = std::max(first, lo);
      const int64_t w1 = std::min(first + bs, t + 1);
      if (w1 > w0) {
        fold(q, kb + (w0 - first) * hd, vb + (w0 - first) * hd, w1 - w0);
      }
      ahead.rest();  // what a short block's fold left
    }
    float* o = a.out + (row * a.H + kh * G) * hd;
    for (int64_t g = 0; g < G; ++g) {
      const float inv = 1.f / hsum(vload(st.sum + g * kLanes));
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) o[g * hd + d] = st.acc[g * hd + d] * inv;
    }
  }
}

// Rows row0 .. row1 - 1 of session b (a prefill chunk) on chunk_attention's tiles. Not
// inlined into paged_attention's worker, whose decode fold it would otherwise share code with.
__attribute__((noinline)) void attend_chunk(const AttentionArgs& a, int64_t b, int64_t kh, int64_t row0, int64_t row1,
                                            std::vector<float>& scratch) {
  const int64_t at = b * a.max_blocks;
  const int64_t sinks = a.window > 0 && a.pinned != nullptr ? a.pinned[b] : a.sinks;
  const metronome::ChunkArgs c{a.q,          a.q_sink, a.k_cache,  a.v_cache,         a.out,       a.positions,
                               a.block_logical + at, a.block_physical + at, a.block_count[b], a.H, a.G, a.hd,
                               a.num_slots, a.block_size, a.window, sinks, a.scale};
  metronome::chunk_attention(c, kh, row0, row1, scratch);
}

// Attention of a step's queries over each session's resident blocks, read in place.
//
// Session b owns query rows [query_start[b], query_start[b+1]) and the blocks
// block_physical[b, :block_count[b]], whose stream indices start at
// block_logical[b, i] * block_size. The query at stream index t sees keys k <= t that
// are sinks (k < min(sinks, t + 1)) or in its window (k >= t - window + 1); window <= 0
// means every key. Sink keys are scored with q_sink when it is given (see model.py).
// pinned, when given, replaces sinks per session: a session's pinned prefix (its system
// prompt) is kept and scored as its sinks are.
// A task is one (session, kv head) and a few of its queries: a decode step reads each
// session's K/V blocks once.
at::Tensor paged_attention(const at::Tensor& q, const std::optional<at::Tensor>& q_sink, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& query_start, const at::Tensor& positions,
                           const at::Tensor& block_logical, const at::Tensor& block_physical,
                           const at::Tensor& block_count, int64_t block_size, int64_t window, int64_t sinks,
                           double scale, const std::optional<at::Tensor>& pinned) {
  check_f32(q, "q");
  check_f32(k_cache, "k_cache");
  check_f32(v_cache, "v_cache");
  check_i64(query_start, "query_start");
  check_i64(positions, "positions");
  check_i64(block_logical, "block_logical");
  check_i64(block_physical, "block_physical");
  check_i64(block_count, "block_count");
  const bool use_sink_q = q_sink.has_value() && q_sink->numel() > 0;
  if (use_sink_q) {
    check_f32(*q_sink, "q_sink");
    TORCH_CHECK(q_sink->sizes() == q.sizes(), "q_sink must have q's shape");
  }
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "bad q or cache shape");
  const int64_t T = q.size(0);
  const int64_t B = block_count.size(0);
  AttentionArgs a{};
  a.H = q.size(1);
  a.hd = q.size(2);
  const int64_t kvh = k_cache.size(0);
  TORCH_CHECK(k_cache.size(2) == a.hd && a.H % kvh == 0, "q and the cache disagree on heads");
  TORCH_CHECK(query_start.size(0) == B + 1 && positions.size(0) == T, "one query_start per session, plus one");
  TORCH_CHECK(block_logical.sizes() == block_physical.sizes() && block_physical.size(0) == B, "bad block tables");
  a.G = a.H / kvh;
  a.num_slots = k_cache.size(1);
  a.max_blocks = block_physical.size(1);
  a.block_size = block_size;
  a.window = window;
  a.sinks = window > 0 ? sinks : 0;
  a.scale = static_cast<float>(scale);
  a.query_start = query_start.data_ptr<int64_t>();
  a.positions = positions.data_ptr<int64_t>();
  a.block_logical = block_logical.data_ptr<int64_t>();
  a.block_physical = block_physical.data_ptr<int64_t>();
  a.block_count = block_count.data_ptr<int64_t>();
  if (pinned.has_value()) {
    check_i64(*pinned, "pinned");
    TORCH_CHECK(pinned->numel() == B, "one pinned count per session");
    a.pinned = pinned->data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) TORCH_CHECK(a.pinned[b] >= 0, "pinned counts must be >= 0");
  }
  TORCH_CHECK(a.query_start[0] == 0 && a.query_start[B] == T, "query_start must span every query row");
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(a.query_start[b] <= a.query_start[b + 1], "query_start must not decrease");
    TORCH_CHECK(a.block_count[b] >= 0 && a.block_count[b] <= a.max_blocks, "block_count out of range");
    for (int64_t i = 0; i < a.block_count[b]; ++i) {
      const int64_t p = a.block_physical[b * a.max_blocks + i];
      TORCH_CHECK(p >= 0 && (p + 1) * block_size <= a.num_slots, "block out of the pool");
      TORCH_CHECK(i == 0 || a.block_logical[b * a.max_blocks + i] > a.block_logical[b * a.max_blocks + i - 1],
                  "blocks must be in stream order");
    }
  }
  auto out = at::empty({T, a.H * a.hd}, q.options());
  a.q = q.data_ptr<float>();
  a.q_sink = use_sink_q ? q_sink->data_ptr<float>() : a.q;
  a.k_cache = k_cache.data_ptr<float>();
  a.v_cache = v_cache.data_ptr<float>();
  a.out = out.data_ptr<float>();
  // a task: one (session, kv head) and up to kRows of its queries, so that one long
  // chunk (a prompt, a scored text) still spreads over every thread
  constexpr int64_t kRows = 8;
  // a session with many rows (a prefill chunk) goes to chunk_attention's tiles instead
  constexpr int64_t kChunkMinRows = 16;
  const bool tiled = metronome::chunk_attention_ok(a.hd, a.G);
  struct Task {
    int64_t b, kh, row0, row1;
    bool chunk;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const bool chunk = tiled && a.query_start[b + 1] - a.query_start[b] >= kChunkMinRows;
    const int64_t step = chunk ? metronome::chunk_attention_rows(a.G) : kRows;
    for (int64_t kh = 0; kh < kvh; ++kh) {
      for (int64_t r = a.query_start[b]; r < a.query_start[b + 1]; r += step) {
        tasks.push_back({b, kh, r, std::min(r + step, a.query_start[b + 1]), chunk});
      }
    }
  }
  // sessions differ in length, so tasks differ in cost: the longest go first and each
  // thread takes the next task when it is free (a static split left one thread waiting)
  auto cost = [&](const Task& t) { return a.block_count[t.b] * (t.row1 - t.row0); };
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& x, const Task& y) { return cost(x) > cost(y); });
  std::atomic<int64_t> next{0};
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n_tasks), 1, [&](int64_t, int64_t) {
    std::vector<float> scratch;
    for (int64_t i = next++; i < n_tasks;) {
      // the next task is claimed now, so that its first block can be fetched while this one ends
      const int64_t then = next++;
      const Task& t = tasks[i];
      const float *then_k = nullptr, *then_v = nullptr;
      if (then < n_tasks && a.block_count[tasks[then].b] > 0) {
        const Task& u = tasks[then];
        const int64_t first = a.block_at(u.kh, a.block_physical[u.b * a.max_blocks]);
        then_k = a.k_cache + first;
        then_v = a.v_cache + first;
      }
      i = then;
      if (t.chunk) {
        attend_chunk(a, t.b, t.kh, t.row0, t.row1, scratch);
        continue;
      }
      switch (a.hd) {
        case 16: attend_task<1>(a, t.b, t.kh, t.row0, t.row1, then_k, then_v, scratch); break;
        case 32: attend_task<2>(a, t.b, t.kh, t.row0, t.row1, then_k, then_v, scratch); break;
        case 64: attend_task<4>(a, t.b, t.kh, t.row0, t.row1, then_k, then_v, scratch); break;
        case 128: attend_task<8>(a, t.b, t.kh, t.row0, t.row1, then_k, then_v, scratch); break;
        default: attend_task<0>(a, t.b, t.kh, t.row0, t.row1, then_k, then_v, scratch); break;
      }
    }
  });
  return out;
}

// A dense layer on either weight layout: GGUF blocks in tiles (uint8 or int8 q, see
// tiles.h), or the model's own float32 weight [K, N] (scale and offset empty), which goes
// to the BLAS torch links (oneDNN/MKL sgemm; the residual as addmm's beta term). That
// BLAS beat this file's own float32 kernel at 1-32 rows on AVX2 (6-60x: 16 float32
// registers, not 32) and on AVX-512 (1.5-4x), measured in docs/engine.md, so the
// float32 kernel is gone.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, const at::Tensor& offset,
                  int64_t n, const std::optional<at::Tensor>& residual) {
  if (w.scalar_type() == at::kByte && w.dim() == 3) return metronome::group_linear(x, w, n, residual);
  if (w.scalar_type() == at::kByte || w.scalar_type() == at::kChar) {
    return metronome::tile_linear(x, w, scale, offset.numel() > 0 ? std::optional<at::Tensor>(offset) : std::nullopt,
                                  n, residual);
  }
  check_f32(x, "x");
  check_f32(w, "weight");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "x must be [M, K] and the weight [K, N]");
  TORCH_CHECK(w.size(0) == x.size(1), "x has ", x.size(1), " columns, the weight ", w.size(0), " rows");
  TORCH_CHECK(w.size(1) == n, "the weight has ", w.size(1), " columns, not n = ", n);
  if (residual.has_value()) {
    check_f32(*residual, "residual");
    TORCH_CHECK(residual->size(0) == x.size(0) && residual->size(1) == n, "residual must be [M, N]");
    return at::addmm(*residual, x, w);
  }
  return at::mm(x, w);
}

bool tiles_ready() { return metronome::tiles_ready(); }

// Every decoder layer of a step in one call: per layer, the nine kernels above with no
// return to Python between them. weights: per layer, in order, input_norm, qkv, o_proj,
// post_norm, gate_up, down_proj, each dense layer as three tensors (weight, scale,
// offset: see linear).
constexpr int64_t kLayerWeights = 14;

at::Tensor decoder_layers(at::Tensor x, at::TensorList weights, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& cos, const at::Tensor& sin, const std::optional<at::Tensor>& sink_cos,
                          const std::optional<at::Tensor>& sink_sin, const at::Tensor& slots,
                          const at::Tensor& query_start, const at::Tensor& positions, const at::Tensor& block_logical,
                          const at::Tensor& block_physical, const at::Tensor& block_count, int64_t block_size,
                          int64_t window, int64_t sinks, int64_t num_heads, int64_t intermediate, double eps,
                          const std::optional<at::Tensor>& pinned) {
  check_f32(k_cache, "k_cache");
  check_f32(v_cache, "v_cache");
  const int64_t layers = k_cache.size(0);
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "the caches must be [layers, kvh, slots, hd]");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kLayerWeights * layers, "fourteen weights per layer");
  const int64_t hidden = x.size(1);
  const int64_t hd = k_cache.size(3);
  const int64_t qkv_width = (num_heads + 2 * k_cache.size(1)) * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const bool with_sinks = sink_cos.has_value();
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = weights.data() + kLayerWeights * i;
    const at::Tensor *qkv = w + 1, *o_proj = w + 4, *gate_up = w + 8, *down = w + 11;
    at::Tensor kc = k_cache.select(0, i);
    at::Tensor vc = v_cache.select(0, i);
    at::Tensor h = rms_norm(x, w[0], eps);
    auto [q, q_sink] = rope_store(linear(h, qkv[0], qkv[1], qkv[2], qkv_width, std::nullopt), cos, sin, sink_cos,
                                  sink_sin, slots, kc, vc, num_heads);
    at::Tensor attn = paged_attention(q, with_sinks ? std::optional<at::Tensor>(q_sink) : std::nullopt, kc, vc,
                                      query_start, positions, block_logical, block_physical, block_count, block_size,
                                      window, sinks, scale, pinned);
    x = linear(attn, o_proj[0], o_proj[1], o_proj[2], hidden, x);
    h = rms_norm(x, w[7], eps);
    at::Tensor act = silu_mul(linear(h, gate_up[0], gate_up[1], gate_up[2], 2 * intermediate, std::nullopt));
    x = linear(act, down[0], down[1], down[2], hidden, x);
  }
  return x;
}

}  // namespace

// the op namespace: "metronome" for the native build, another one per vector-unit build
// (kernels/__init__.py), so that one process can load several builds
#ifndef METRONOME_OPS
#define METRONOME_OPS metronome
#endif
#define METRONOME_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

METRONOME_LIBRARY(METRONOME_OPS, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("silu_mul(Tensor gate_up) -> Tensor", &silu_mul);
  m.def("greedy_rows(Tensor logits) -> (Tensor, Tensor)", &greedy_rows);
  m.def("tiles_ready() -> bool", &tiles_ready);
  m.def("tile_linear(Tensor x, Tensor q, Tensor scale, Tensor? offset, int n, Tensor? residual) -> Tensor",
        &metronome::tile_linear);
  m.def("group_linear(Tensor x, Tensor groups, int n, Tensor? residual) -> Tensor", &metronome::group_linear);
  m.def("linear(Tensor x, Tensor weight, Tensor scale, Tensor offset, int n, Tensor? residual) -> Tensor", &linear);
  m.def(
      "rope_store(Tensor qkv, Tensor cos, Tensor sin, Tensor? sink_cos, Tensor? sink_sin, Tensor slots, "
      "Tensor(a!) k_cache, Tensor(b!) v_cache, int num_heads) -> (Tensor, Tensor)",
      &rope_store);
  m.def(
      "paged_attention(Tensor q, Tensor? q_sink, Tensor k_cache, Tensor v_cache, Tensor query_start, "
      "Tensor positions, Tensor block_logical, Tensor block_physical, Tensor block_count, int block_size, "
      "int window, int sinks, float scale, Tensor? pinned=None) -> Tensor",
      &paged_attention);
  m.def(
      "decoder_layers(Tensor x, Tensor[] weights, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cos, Tensor sin, "
      "Tensor? sink_cos, Tensor? sink_sin, Tensor slots, Tensor query_start, Tensor positions, "
      "Tensor block_logical, Tensor block_physical, Tensor block_count, int block_size, int window, int sinks, "
      "int num_heads, int intermediate, float eps, Tensor? pinned=None) -> Tensor",
      &decoder_layers);
}
