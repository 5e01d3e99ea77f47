// Attention of a chunk of many query rows of one session (a prefill chunk, a scored text)
// over its resident blocks, as products of register tiles.
//
// Why: paged_attention's fold (ops.cpp) takes one query row at a time: per row and head,
// each key's score is a dot product summed across a register (a horizontal sum), and the
// softmax runs on 16 keys at a time. Fine for a decode step, where a session has one row;
// a 256-token chunk has 256 rows over the same keys, and there that fold spent 3.2 ms a
// layer where torch's flash attention (what HF runs) spent 1.9 (one thread, AVX2). Here a
// task takes several rows' heads that share a kv head, 24 query vectors: their scores
// against 4 keys are one outer-product tile (S^T = K Q^T: per k-dimension, 3 loads of the
// transposed queries, 4 broadcasts of the keys, 12 FMAs into 12 sums), keys in lanes' rows
// and queries in lanes, so that the softmax runs down the rows with no horizontal sums, and
// the output is the same tile again (O^T += V^T P^T). The keys are read in place in the
// pool, block by block; the sinks (or a pinned prefix) are scored with q_sink as in ops.cpp.

#include "chunk_attention.h"

#include "vector16.h"  // exp8

#include <algorithm>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#define METRONOME_CHUNK_AVX2 1
#include <immintrin.h>
#endif

namespace metronome {

#ifdef METRONOME_CHUNK_AVX2
namespace {

constexpr int kLanes = 24;      // query vectors of a tile: three 8-float registers
constexpr int kNV = kLanes / 8;
constexpr int64_t kKeys = 128;  // key rows per softmax chunk: 12 KB of scores (L1)
constexpr int32_t kFar = 1 << 30;

inline int32_t clamp32(int64_t x) { return static_cast<int32_t>(std::clamp<int64_t>(x, -kFar, kFar)); }

// Scores of 4 keys (rows of k, hd apart; past nk, key 0 again, never read) against the
// tile's queries (qt: [hd][24]) into s: [4][24].
inline void scores_tile(const float* k, int64_t nk, int64_t hd, const float* qt, float* s) {
  const float* kr[4];
  for (int r = 0; r < 4; ++r) kr[r] = k + (r < nk ? r : 0) * hd;
  __m256 acc[4 * kNV];
#pragma GCC unroll 12
  for (int i = 0; i < 4 * kNV; ++i) acc[i] = _mm256_setzero_ps();
#pragma GCC unroll 2
  for (int64_t d = 0; d < hd; ++d, qt += kLanes) {
    const __m256 w0 = _mm256_load_ps(qt), w1 = _mm256_load_ps(qt + 8), w2 = _mm256_load_ps(qt + 16);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256 b = _mm256_broadcast_ss(kr[r] + d);
      acc[r * kNV] = _mm256_fmadd_ps(b, w0, acc[r * kNV]);
      acc[r * kNV + 1] = _mm256_fmadd_ps(b, w1, acc[r * kNV + 1]);
      acc[r * kNV + 2] = _mm256_fmadd_ps(b, w2, acc[r * kNV + 2]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < 4 * kNV; ++i) _mm256_store_ps(s + 8 * i, acc[i]);
}

// A run of keys in the chunk: n rows of V from v, their scores at row `row` of the chunk.
struct Segment {
  const float* v;
  int64_t n, row;
};

// The tile's state: per lane (query vector) the running max and sum, and O^T [hd][24].
struct Tile {
  float* qt;       // [hd][24] the queries, scaled
  float* qst;      // the same with q_sink (== qt where not given)
  float* ot;       // [hd][24]
  float* s;        // [kKeys + 4][24] scores, then weights
  __m256i t[kNV];  // per lane: its stream index, its window's first key, its sinks' end (relative to t0)
  __m256i lo[kNV];
  __m256i sink_end[kNV];
  __m256 max[kNV], sum[kNV];
};

// Scores of keys s0 .. s0 + n - 1 (rows of k), masked per lane: sink-scored keys are seen
// by lanes whose sinks reach them, the others by lanes whose window holds them.
void score_keys(Tile& tl, const float* k, int64_t n, int64_t s0, int64_t t0, bool sink, int64_t hd, int64_t row) {
  const float* qt = sink ? tl.qst : tl.qt;
  for (int64_t j = 0; j < n; j += 4) scores_tile(k + j * hd, std::min<int64_t>(4, n - j), hd, qt, tl.s + (row + j) * kLanes);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; ++j) {
    const __m256i rel = _mm256_set1_epi32(clamp32(s0 + j - t0));
    float* sr = tl.s + (row + j) * kLanes;
#pragma GCC unroll 3
    for (int v = 0; v < kNV; ++v) {
      __m256i seen;
      if (sink) {
        seen = _mm256_cmpgt_epi32(tl.sink_end[v], rel);
      } else {  // lo <= rel <= t
        seen = _mm256_andnot_si256(_mm256_or_si256(_mm256_cmpgt_epi32(rel, tl.t[v]), _mm256_cmpgt_epi32(tl.lo[v], rel)),
                                   _mm256_set1_epi32(-1));
      }
      _mm256_store_ps(sr + 8 * v, _mm256_blendv_ps(ninf, _mm256_load_ps(sr + 8 * v), _mm256_castsi256_ps(seen)));
    }
  }
}

// The chunk's rows into the tile: online softmax (the running max moves once per chunk,
// not per key), then O^T += V^T P^T in strips of 4 head dimensions (12 sums).
void fold_chunk(Tile& tl, const Segment* segs, size_t nseg, int64_t rows, int64_t hd) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  __m256 mx[kNV] = {ninf, ninf, ninf};
  for (int64_t j = 0; j < rows; ++j) {
#pragma GCC unroll 3
    for (int v = 0; v < kNV; ++v) mx[v] = _mm256_max_ps(mx[v], _mm256_load_ps(tl.s + j * kLanes + 8 * v));
  }
  __m256 safe[kNV], corr[kNV];
#pragma GCC unroll 3
  for (int v = 0; v < kNV; ++v) {
    const __m256 m_new = _mm256_max_ps(tl.max[v], mx[v]);
    const __m256 none = _mm256_cmp_ps(m_new, ninf, _CMP_EQ_OQ);  // no key seen yet: nothing to scale
    safe[v] = _mm256_blendv_ps(m_new, zero, none);
    corr[v] = _mm256_blendv_ps(exp8(_mm256_sub_ps(tl.max[v], m_new)), one, none);
    tl.max[v] = m_new;
    tl.sum[v] = _mm256_mul_ps(tl.sum[v], corr[v]);
  }
  for (int64_t d = 0; d < hd; ++d) {
#pragma GCC unroll 3
    for (int v = 0; v < kNV; ++v) {
      float* o = tl.ot + d * kLanes + 8 * v;
      _mm256_store_ps(o, _mm256_mul_ps(_mm256_load_ps(o), corr[v]));
    }
  }
  for (int64_t j = 0; j < rows; ++j) {
#pragma GCC unroll 3
    for (int v = 0; v < kNV; ++v) {
      float* sr = tl.s + j * kLanes + 8 * v;
      const __m256 x = _mm256_load_ps(sr);
      // a masked key weighs 0 exactly (exp's clamp would leave 1e-38)
      const __m256 p = _mm256_blendv_ps(exp8(_mm256_sub_ps(x, safe[v])), zero, _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ));
      _mm256_store_ps(sr, p);
      tl.sum[v] = _mm256_add_ps(tl.sum[v], p);
    }
  }
  for (int64_t d0 = 0; d0 < hd; d0 += 4) {
    __m256 acc[4 * kNV];
#pragma GCC unroll 12
    for (int i = 0; i < 4 * kNV; ++i) acc[i] = _mm256_load_ps(tl.ot + d0 * kLanes + 8 * i);
    for (size_t g = 0; g < nseg; ++g) {
      const float* v = segs[g].v + d0;
      const float* p = tl.s + segs[g].row * kLanes;
#pragma GCC unroll 2
      for (int64_t j = 0; j < segs[g].n; ++j, v += hd, p += kLanes) {
        const __m256 p0 = _mm256_load_ps(p), p1 = _mm256_load_ps(p + 8), p2 = _mm256_load_ps(p + 16);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m256 b = _mm256_broadcast_ss(v + r);
          acc[r * kNV] = _mm256_fmadd_ps(b, p0, acc[r * kNV]);
          acc[r * kNV + 1] = _mm256_fmadd_ps(b, p1, acc[r * kNV + 1]);
          acc[r * kNV + 2] = _mm256_fmadd_ps(b, p2, acc[r * kNV + 2]);
        }
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < 4 * kNV; ++i) _mm256_store_ps(tl.ot + d0 * kLanes + 8 * i, acc[i]);
  }
}

}  // namespace

bool chunk_attention_ok(int64_t hd, int64_t G) { return hd % 4 == 0 && hd > 0 && G >= 1 && G <= kLanes; }

int64_t chunk_attention_rows(int64_t G) { return std::max<int64_t>(1, kLanes / G); }

void chunk_attention(const ChunkArgs& a, int64_t kh, int64_t row0, int64_t row1, std::vector<float>& scratch) {
  const int64_t hd = a.hd, G = a.G, bs = a.block_size;
  const int64_t nq = (row1 - row0) * G;
  const bool own_sink_q = a.q_sink != a.q;
  // three [hd][24] buffers and the scores, 32-byte aligned within the scratch
  const int64_t tile = hd * kLanes;
  scratch.resize(3 * tile + (kKeys + 4) * kLanes + 8);
  float* base = scratch.data();
  base += (8 - (reinterpret_cast<uintptr_t>(base) / sizeof(float)) % 8) % 8;
  Tile tl{};
  tl.qt = base;
  tl.qst = own_sink_q ? base + tile : tl.qt;
  tl.ot = base + 2 * tile;
  tl.s = base + 3 * tile;
  std::fill(tl.qt, tl.qt + 3 * tile, 0.f);
  int64_t t_min = a.positions[row0], t_max = t_min;
  for (int64_t row = row0; row < row1; ++row) {
    t_min = std::min(t_min, a.positions[row]);
    t_max = std::max(t_max, a.positions[row]);
  }
  const int64_t t0 = t_min;
  alignas(32) int32_t t_rel[kLanes], lo_rel[kLanes], sink_rel[kLanes];
  for (int lane = 0; lane < kLanes; ++lane) {  // padding lanes see nothing
    t_rel[lane] = -kFar;
    lo_rel[lane] = kFar;
    sink_rel[lane] = -kFar;
  }
  for (int64_t lane = 0; lane < nq; ++lane) {
    const int64_t row = row0 + lane / G, h = kh * G + lane % G;
    const int64_t t = a.positions[row];
    t_rel[lane] = clamp32(t - t0);
    lo_rel[lane] = clamp32((a.window > 0 ? std::max(a.sinks, t - a.window + 1) : 0) - t0);
    sink_rel[lane] = clamp32((a.window > 0 ? std::min(a.sinks, t + 1) : 0) - t0);
    const float* q = a.q + (row * a.H + h) * hd;
    const float* qs = a.q_sink + (row * a.H + h) * hd;
    for (int64_t d = 0; d < hd; ++d) {
      tl.qt[d * kLanes + lane] = q[d] * a.scale;
      if (own_sink_q) tl.qst[d * kLanes + lane] = qs[d] * a.scale;
    }
  }
  for (int v = 0; v < kNV; ++v) {
    tl.t[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(t_rel + 8 * v));
    tl.lo[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_rel + 8 * v));
    tl.sink_end[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(sink_rel + 8 * v));
    tl.max[v] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    tl.sum[v] = _mm256_setzero_ps();
  }
  // the keys any of the tile's rows sees: sinks [0, sink_hi), the window [lo_min, t_max]
  const int64_t sink_hi = a.window > 0 ? std::min(a.sinks, t_max + 1) : 0;
  const int64_t lo_min = a.window > 0 ? std::max(a.sinks, t_min - a.window + 1) : 0;
  Segment segs[kKeys + 1];
  size_t nseg = 0;
  int64_t used = 0;
  auto take = [&](const float* k, const float* v, int64_t s0, int64_t n, bool sink) {
    while (n > 0) {
      const int64_t m = std::min(n, kKeys - used);
      score_keys(tl, k, m, s0, t0, sink, hd, used);
      segs[nseg++] = Segment{v, m, used};
      used += m;
      if (used == kKeys) {
        fold_chunk(tl, segs, nseg, used, hd);
        used = 0;
        nseg = 0;
      }
      k += m * hd;
      v += m * hd;
      s0 += m;
      n -= m;
    }
  };
  for (int64_t i = 0; i < a.block_count; ++i) {
    const int64_t first = a.block_logical[i] * bs;
    if (first > t_max) break;  // blocks are in stream order
    const int64_t at = (kh * a.num_slots + a.block_physical[i] * bs) * hd;
    const float* kb = a.k_cache + at;
    const float* vb = a.v_cache + at;
    const int64_t s1 = std::min(first + bs, sink_hi);
    if (s1 > first) take(kb, vb, first, s1 - first, true);
    const int64_t w0 = std::max(first, lo_min), w1 = std::min(first + bs, t_max + 1);
    if (w1 > w0) take(kb + (w0 - first) * hd, vb + (w0 - first) * hd, w0, w1 - w0, false);
  }
  if (used > 0) fold_chunk(tl, segs, nseg, used, hd);
  alignas(32) float sum[kLanes];
  for (int v = 0; v < kNV; ++v) _mm256_store_ps(sum + 8 * v, tl.sum[v]);
  for (int64_t lane = 0; lane < nq; ++lane) {
    const int64_t row = row0 + lane / G, h = kh * G + lane % G;
    float* o = a.out + (row * a.H + h) * hd;
    const float inv = 1.f / sum[lane];
    for (int64_t d = 0; d < hd; ++d) o[d] = tl.ot[d * kLanes + lane] * inv;
  }
}
#else
// other vector units: paged_attention keeps its own fold (chunk_attention_ok says no)
bool chunk_attention_ok(int64_t, int64_t) { return false; }

int64_t chunk_attention_rows(int64_t) { return 1; }

void chunk_attention(const ChunkArgs&, int64_t, int64_t, int64_t, std::vector<float>&) {}
#endif

}  // namespace metronome
