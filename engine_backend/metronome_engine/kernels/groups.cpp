// Dense layers read straight from 4- and 8-bit blocks (GGUF Q4_1 / Q8_0) on the vector
// unit: steps of few rows (passes over the blocks) and of many (panels, below).
//
// Why: a decode step of one to a few sessions reads every weight once and does little
// arithmetic with it, so its dense layers take as long as their weights take to arrive
// from memory. As float32 (what the BLAS multiplies) SmolLM2's weights are 540 MB a step;
// as blocks, 5 bits a weight (Q4_1) or 8.5 (Q8_0), a sixth to a quarter of that. Here
// each block is widened in registers and multiplied against the float32 activations:
// W[k, n] = scale * q + offset is one FMA on the widened q, exact as the loader's
// de-quantizer (scale * q is exact in float32, so the one rounding is the add's), and the
// products are summed in float32. Results agree with a float32 GEMM on the de-quantized
// weights to float32 rounding (another order of the sums), not bit for bit.
//
// Few rows (a decode step of one to three sessions), register blocking for AVX2's 16
// registers of 8 floats: a pass holds eight 8-lane sums, R rows x C columns (see
// group_pass); each 32-k block of a column is widened once per pass and used by its R rows.
// More rows (decode of 4+ sessions, prefill chunks) wait on FMAs, not on the weights:
// there each weight is widened once for all rows into a float32 panel and an outer-product
// microkernel runs over it (see panel_rows).

#include "groups.h"

#include "checks.h"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define METRONOME_GROUPS_AVX2 1
#include <immintrin.h>
#endif

namespace metronome {
namespace {

constexpr int64_t kBlock = 32;  // k per block
constexpr int64_t kGroup = 4;   // output columns per record
constexpr int64_t kQ4Record = kGroup * 16 + kGroup * 2 * 2;  // nibbles, f16 scales, f16 offsets
constexpr int64_t kQ8Record = kGroup * 32 + kGroup * 2;      // int8, f16 scales

struct GroupArgs {
  const float* x;
  const uint8_t* groups;
  const float* residual;  // or null
  float* out;
  int64_t M, K, n, nb, record;
};

#ifdef METRONOME_GROUPS_AVX2
// [sum(a), sum(b), sum(c), sum(d)]
inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Rows r0 .. r0 + R - 1 by columns c0 .. c0 + C - 1 of group g, R x C = 8 sums (with one
// row, two a column: four FMAs a block into one sum would wait on each other's latency).
// Eight sums, the widened nibbles, a scale and an offset fill 14 of the 16 registers;
// each block of a column is widened once and used by R rows. Every loop over the sums is
// unrolled in full and the sums are one flat array, so that they stay in registers.
template <int R, int C, bool Q4>
void group_pass(const GroupArgs& a, int64_t g, int c0, int64_t r0) {
  constexpr int S = R == 1 ? 2 : 1;
  static_assert(R * C * S <= 8, "eight sums at most: AVX2 has sixteen registers");
  __m256 acc[R * C * S];
#pragma GCC unroll 16
  for (int i = 0; i < R * C * S; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi32(0x0F);
  const uint8_t* rec = a.groups + g * a.nb * a.record;
  const float* x = a.x + r0 * a.K;
  for (int64_t b = 0; b < a.nb; ++b, rec += a.record) {
    alignas(32) float so[8];  // scales, then offsets
    if constexpr (Q4) {
      _mm256_store_ps(so, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kGroup * 16))));
    } else {
      _mm_store_ps(so, _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + kGroup * 32))));
    }
    const float* xb = x + b * kBlock;
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m256 s = _mm256_broadcast_ss(so + c0 + c);
      // the i-th 8 elements of the column's block, into every row's sums
      auto fold = [&](int i, __m256 w) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m256& sum = acc[(r * C + c) * S + (i % S)];
          sum = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb + r * a.K + 8 * i), sum);
        }
      };
      if constexpr (Q4) {
        const uint8_t* q = rec + 16 * (c0 + c);
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
        const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
        const __m256 o = _mm256_broadcast_ss(so + kGroup + c0 + c);
        fold(0, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(lo, low)), s, o));
        fold(1, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(hi, low)), s, o));
        fold(2, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4)), s, o));
        fold(3, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4)), s, o));
      } else {
        const int8_t* q = reinterpret_cast<const int8_t*>(rec + 32 * (c0 + c));
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i));
          fold(i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), s));
        }
      }
    }
  }
  const int64_t col = g * kGroup + c0;
  const int64_t cols = std::min<int64_t>(C, a.n - col);
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[C * S > 4 ? C * S : 4];
    __m256 sums[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      sums[c] = acc[(r * C + c) * S];
      if constexpr (S == 2) sums[c] = _mm256_add_ps(sums[c], acc[(r * C + c) * S + 1]);
    }
    if constexpr (C == 4) {
      _mm_store_ps(v, sum4(sums[0], sums[1], sums[2], sums[3]));
    } else if constexpr (C == 2) {
      _mm_store_ps(v, sum4(sums[0], sums[1], sums[0], sums[1]));
    } else {
      _mm_store_ps(v, sum4(sums[0], sums[0], sums[0], sums[0]));
    }
    const int64_t at = (r0 + r) * a.n + col;
    for (int64_t c = 0; c < cols; ++c) a.out[at + c] = a.residual != nullptr ? v[c] + a.residual[at + c] : v[c];
  }
}

// Many rows (a batch of sessions, a prefill chunk): the step waits on FMAs, not on the
// weights, so each weight is widened once for all rows, not once per pass of 8. A panel of
// kPanelGroups groups (8 * NV columns) is widened, over all of K, into a float32 panel
// [K][8 * NV] (L1/L2-resident: 36 KB at K = 576), transposed so that a row of it is
// 8 * NV consecutive columns; then every tile of R rows runs an outer-product microkernel
// over it: per k, NV weight vectors, R broadcasts of x[r, k], R * NV FMAs into R * NV sums.
// R = 4, NV = 3 holds 12 sums + 3 weights + 1 broadcast in the 16 registers. Each output
// is one sum along k in order, so the bits do not depend on the thread count.
constexpr int kPanelNV = 3;                          // 8-float vectors per panel row
constexpr int64_t kPanelCols = 8 * kPanelNV;         // columns per panel
constexpr int64_t kPanelGroups = kPanelCols / kGroup;
constexpr int kTileRows = 4;                          // rows per microkernel tile
constexpr int64_t kChunk = 288;                       // k per widened chunk at most (4-bit; a multiple of 32)
constexpr int64_t kChunkQ8 = 192;                     // the same, 8-bit
alignas(64) constexpr uint8_t kZeroRecord[kQ8Record] = {};  // columns past N: zero weights
// From 4 rows on the panels win (one thread, CPU time, weights from memory, the dense
// layers of a step: 2 rows 1.05x the passes' time, 4 rows 0.89x, 8 rows 0.80x, 32 rows
// 0.61x; scripts/bench_group_linear.py)
constexpr int64_t kPanelMinRows = 4;

// prefetcht0 as asm: GCC (12, -O3) deleted a loop of _mm_prefetch calls whose end it could
// not prove, as if the loop did nothing (C++'s forward-progress rule)
inline void fetch_line(const char* p) { asm volatile("prefetcht0 %0" : : "m"(*p)); }

// Eight columns' 16 bytes, two columns a vector (y[i]: column i in the low lane, i + 4 in
// the high one) -> four vectors of four rows each: byte j of the eight columns is dword
// j % 4 of u[j / 4] in both lanes (columns 0-3 low, 4-7 high). Two rounds of in-lane
// unpacks, 8 shuffles for 128 bytes, where 128-bit ones took 24 and a widening from xmm
// to ymm (vpmovzxbd, port 5 only) one more per row; the panel's fill was port 5 bound.
inline void transpose_lanes(const __m256i y[4], __m256i u[4]) {
  const __m256i t0 = _mm256_unpacklo_epi8(y[0], y[1]), t1 = _mm256_unpackhi_epi8(y[0], y[1]);
  const __m256i t2 = _mm256_unpacklo_epi8(y[2], y[3]), t3 = _mm256_unpackhi_epi8(y[2], y[3]);
  u[0] = _mm256_unpacklo_epi16(t0, t2);  // bytes 0-3
  u[1] = _mm256_unpackhi_epi16(t0, t2);  // 4-7
  u[2] = _mm256_unpacklo_epi16(t1, t3);  // 8-11
  u[3] = _mm256_unpackhi_epi16(t1, t3);  // 12-15
}

// vpshufb controls: dword i of each lane <- byte 4r + i of the lane, as the dword's low
// byte (zero-extended; Q4) or its high byte (q * 2^24; Q8, whose scale carries 2^-24)
inline __m256i spread_control(int r, bool high) {
  alignas(32) int8_t c[32];
  for (int i = 0; i < 32; ++i) c[i] = -128;  // zero
  for (int lane = 0; lane < 2; ++lane) {
    for (int i = 0; i < 4; ++i) c[16 * lane + 4 * i + (high ? 3 : 0)] = static_cast<int8_t>(4 * r + i);
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
}

// Two groups' blocks b0 .. b0 + blocks - 1 (ga, gb: their first records; a group past the
// last one reads a zero record, stride 0) into panel columns 8 * octet .. 8 * octet + 7:
// W = scale * q + offset, as group_pass computes it (bit for bit the loader's weight; for
// Q8 (q * 2^24) * (scale * 2^-24), the same product: both factors are exact).
template <bool Q4>
void widen_octet(const GroupArgs& a, const uint8_t* ga, const uint8_t* gb, int64_t stride_b, int64_t blocks,
                 float* panel, int octet) {
  const __m256i spread[4] = {spread_control(0, !Q4), spread_control(1, !Q4), spread_control(2, !Q4),
                             spread_control(3, !Q4)};
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b, ga += a.record, gb += stride_b) {
    float* dst = panel + b * kBlock * kPanelCols + 8 * octet;
    constexpr int64_t kq = Q4 ? 16 : 32;  // bytes a column
    auto halves = [&](int64_t at) {
      return _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ga + at)),
                                                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + at))));
    };
    __m256 s = halves(kGroup * kq);
    const __m256 o = Q4 ? halves(kGroup * kq + 8) : _mm256_setzero_ps();
    if constexpr (!Q4) s = _mm256_mul_ps(s, _mm256_set1_ps(0x1p-24f));
#pragma GCC unroll 2
    for (int part = 0; part < (Q4 ? 1 : 2); ++part) {  // Q8: k 0-15, then 16-31
      __m256i y[4], u[4];
#pragma GCC unroll 4
      for (int i = 0; i < kGroup; ++i) {
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ga + kq * i + 16 * part));
        const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + kq * i + 16 * part));
        y[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
      }
      transpose_lanes(y, u);
#pragma GCC unroll 4
      for (int m = 0; m < 4; ++m) {
        if constexpr (Q4) {  // byte j: k = j (low nibble) and j + 16 (high)
          const __m256i lo = _mm256_and_si256(u[m], low);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(u[m], 4), low);
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            const int j = 4 * m + r;
            _mm256_store_ps(dst + j * kPanelCols,
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, spread[r])), s, o));
            _mm256_store_ps(dst + (j + 16) * kPanelCols,
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, spread[r])), s, o));
          }
        } else {
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            const int j = 16 * part + 4 * m + r;
            _mm256_store_ps(dst + j * kPanelCols,
                            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(u[m], spread[r])), s));
          }
        }
      }
    }
  }
}

// One tile: 4 rows (from x itself: a row past M reads the last row again, never stored) by
// the panel's 24 columns over the chunk of k from k0; `rows` of the 4 and `cols` of the 24
// are real. The first chunk stores its sums, later ones add.
void panel_tile(const GroupArgs& a, const float* panel, int64_t k0, int64_t kc, int64_t r0, int64_t rows,
                int64_t col, int64_t cols, bool first, bool last) {
  constexpr int R = kTileRows;
  const float* xr[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) xr[r] = a.x + (r0 + std::min<int64_t>(r, rows - 1)) * a.K + k0;
  __m256 acc[R * kPanelNV];
#pragma GCC unroll 16
  for (int i = 0; i < R * kPanelNV; ++i) acc[i] = _mm256_setzero_ps();
  const float* w = panel;
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k, w += kPanelCols) {
    __m256 wv[kPanelNV];
#pragma GCC unroll 4
    for (int v = 0; v < kPanelNV; ++v) wv[v] = _mm256_load_ps(w + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(xr[r] + k);
#pragma GCC unroll 4
      for (int v = 0; v < kPanelNV; ++v) acc[r * kPanelNV + v] = _mm256_fmadd_ps(xb, wv[v], acc[r * kPanelNV + v]);
    }
  }
  const bool residual = last && a.residual != nullptr;
  // unrolled with r a constant, so that the sums stay in registers (a loop to `rows` made
  // GCC keep them on the stack, stored after every k)
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    const int64_t at = (r0 + r) * a.n + col;
    float* o = a.out + at;
    if (cols == kPanelCols) {
#pragma GCC unroll 4
      for (int v = 0; v < kPanelNV; ++v) {
        __m256 sum = acc[r * kPanelNV + v];
        if (!first) sum = _mm256_add_ps(sum, _mm256_loadu_ps(o + 8 * v));
        if (residual) sum = _mm256_add_ps(sum, _mm256_loadu_ps(a.residual + at + 8 * v));
        _mm256_storeu_ps(o + 8 * v, sum);
      }
    } else {
      alignas(32) float v[kPanelCols];
#pragma GCC unroll 4
      for (int i = 0; i < kPanelNV; ++i) _mm256_store_ps(v + 8 * i, acc[r * kPanelNV + i]);
      for (int64_t c = 0; c < cols; ++c) {
        float sum = first ? v[c] : v[c] + o[c];
        o[c] = residual ? sum + a.residual[at + c] : sum;
      }
    }
  }
}

// Panels lo .. hi - 1, chunk by chunk of k: each chunk widened once into the thread's
// buffer, then every tile of rows over it. K is cut in near-equal chunks of whole blocks,
// up to 288 k for 4-bit blocks (K = 576: two of 288, 27 KB; 1536: six of 256) and 192 for
// 8-bit ones (18 KB). One thread, 4-bit layers, 288 against 192: 0.98x the time at 32
// rows (fewer passes over the sums), 0.96x at 256, the same at 4 and 8; on the 8-bit head
// 1.02-1.07x. 576 took 1.10x (the panel and the rows' chunk no longer fit in L1), 96 1.04x.
template <bool Q4>
void panel_rows(const GroupArgs& a, int64_t lo, int64_t hi, float* panel) {
  const int64_t G = (a.n + kGroup - 1) / kGroup;
  const int64_t tiles = (a.M + kTileRows - 1) / kTileRows;
  const int64_t most = Q4 ? kChunk : kChunkQ8, chunks = (a.K + most - 1) / most;
  const int64_t chunk = (a.nb + chunks - 1) / chunks * kBlock;
  for (int64_t p = lo; p < hi; ++p) {
    const int64_t col = p * kPanelCols;
    const int64_t cols = std::min<int64_t>(kPanelCols, a.n - col);
    for (int64_t k0 = 0; k0 < a.K; k0 += chunk) {
      const int64_t kc = std::min<int64_t>(chunk, a.K - k0);
      for (int octet = 0; octet < kPanelNV; ++octet) {
        const int64_t g = p * kPanelGroups + 2 * octet;  // and g + 1
        auto first = [&](int64_t group) { return a.groups + (group * a.nb + k0 / kBlock) * a.record; };
        const uint8_t* ga = g < G ? first(g) : kZeroRecord;
        const uint8_t* gb = g + 1 < G ? first(g + 1) : kZeroRecord;
        const int64_t stride_b = g + 1 < G ? a.record : 0;
        if (g < G) {
          widen_octet<Q4>(a, ga, gb, stride_b, kc / kBlock, panel, octet);
        } else {  // past the last group: zero columns, never stored
          for (int64_t k = 0; k < kc; ++k) std::memset(panel + k * kPanelCols + 8 * octet, 0, 8 * sizeof(float));
        }
      }
      // the next chunk's records (the next panel's first, after the last chunk), fetched
      // while the tiles run: they come from memory. A share before each tile, not all at
      // once: a burst of 45-77 lines waited on the line fill buffers and held the tiles up
      // (32 rows, one thread: 0.96x the burst's time; with no fetch at all, 1.15x)
      const bool last_chunk = k0 + kc >= a.K;
      const int64_t np = last_chunk ? p + 1 : p, nk = last_chunk ? 0 : k0 + kc;
      const int64_t next_groups = np < hi ? std::min<int64_t>(G, (np + 1) * kPanelGroups) - np * kPanelGroups : 0;
      const int64_t group_bytes = std::min<int64_t>(chunk, a.K - nk) / kBlock * a.record;
      const int64_t group_lines = group_bytes / 64 + 2;  // the records need not start a line
      const int64_t lines = next_groups * group_lines;
      auto fetch = [&](int64_t from, int64_t to) {  // lines from .. to - 1 of the next chunk
        for (int64_t i = from; i < to;) {
          const int64_t g = i / group_lines, line = i - g * group_lines, n = std::min(group_lines - line, to - i);
          const uint8_t* at = a.groups + ((np * kPanelGroups + g) * a.nb + nk / kBlock) * a.record;
          for (int64_t j = 0; j < n; ++j) fetch_line(reinterpret_cast<const char*>(at) + 64 * (line + j));
          i += n;
        }
      };
      for (int64_t t = 0; t < tiles; ++t) {
        fetch(lines * t / tiles, lines * (t + 1) / tiles);
        const int64_t r0 = t * kTileRows;
        panel_tile(a, panel, k0, kc, r0, std::min<int64_t>(kTileRows, a.M - r0), col, cols, k0 == 0, k0 + kc == a.K);
      }
    }
  }
}

#endif
#ifndef METRONOME_GROUPS_AVX2
// Any other vector unit: plain loops (a fallback, not tuned)
template <int R, int C, bool Q4>
void group_pass(const GroupArgs& a, int64_t g, int c0, int64_t r0) {
  const int64_t col = g * kGroup;
  const int64_t cols = std::min<int64_t>(c0 + C, a.n - col);
  for (int64_t c = c0; c < cols; ++c) {
    float sum[R] = {};
    for (int64_t b = 0; b < a.nb; ++b) {
      const uint8_t* rec = a.groups + (g * a.nb + b) * a.record;
      const uint8_t* sp = rec + kGroup * (Q4 ? 16 : 32);
      auto half = [&](int i) {
        uint16_t bits;
        std::memcpy(&bits, sp + 2 * i, 2);
        return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
      };
      const float s = half(static_cast<int>(c));
      const float o = Q4 ? half(static_cast<int>(kGroup + c)) : 0.f;
      // each block's 32 products summed apart, then the blocks: one running sum over K = 1536
      // was 2.1e-6 of the largest output off float64 (the vector paths' lanes stay under 2e-6)
      float part[R] = {};
      for (int64_t j = 0; j < kBlock; ++j) {
        float q;
        if constexpr (Q4) {
          const uint8_t byte = rec[16 * c + j % 16];
          q = static_cast<float>(j < 16 ? byte & 0x0F : byte >> 4);
        } else {
          q = static_cast<float>(static_cast<int8_t>(rec[32 * c + j]));
        }
        const float w = Q4 ? std::fma(q, s, o) : q * s;
        for (int r = 0; r < R; ++r) part[r] += w * a.x[(r0 + r) * a.K + b * kBlock + j];
      }
      for (int r = 0; r < R; ++r) sum[r] += part[r];
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * a.n + col + c;
      a.out[at] = a.residual != nullptr ? sum[r] + a.residual[at] : sum[r];
    }
  }
}
#endif

// Every row of group g: passes of 8 rows (one column at a time), then of 4, 2, 1 rows
// (2, 4, 4 columns at a time): eight sums a pass. On AVX2 only 1 to 3 rows come here.
template <int R, int C, bool Q4>
int64_t group_passes(const GroupArgs& a, int64_t g, int64_t r0, int64_t rows) {
  for (; r0 + R <= rows; r0 += R) {
    for (int c0 = 0; c0 < kGroup; c0 += C) group_pass<R, C, Q4>(a, g, c0, r0);
  }
  return r0;
}

template <bool Q4>
void group_rows(const GroupArgs& a, int64_t g) {
  int64_t r0 = 0;
#ifndef METRONOME_GROUPS_AVX2  // on AVX2, 4 rows and more run on the panels
  r0 = group_passes<8, 1, Q4>(a, g, r0, a.M);
  r0 = group_passes<4, 2, Q4>(a, g, r0, a.M);
#endif
  r0 = group_passes<2, 4, Q4>(a, g, r0, a.M);
  group_passes<1, 4, Q4>(a, g, r0, a.M);
}

}  // namespace

at::Tensor group_linear(const at::Tensor& x, const at::Tensor& groups, int64_t n,
                        const std::optional<at::Tensor>& residual) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  TORCH_CHECK(groups.scalar_type() == at::kByte && groups.is_contiguous() && groups.dim() == 3 &&
                  (groups.size(2) == kQ4Record || groups.size(2) == kQ8Record),
              "groups must be contiguous uint8 [N / 4, K / 32, 80 (Q4_1) or 136 (Q8_0)] (quant.pack_groups)");
  const int64_t M = x.size(0), K = x.size(1), G = groups.size(0), nb = groups.size(1);
  TORCH_CHECK(K == nb * kBlock, "x has ", K, " columns, the groups cover ", nb * kBlock);
  TORCH_CHECK(n > (G - 1) * kGroup && n <= G * kGroup, "n does not match the groups' columns");
  const float* rp = nullptr;
  if (residual.has_value()) {
    check_f32(*residual, "residual");
    TORCH_CHECK(residual->dim() == 2 && residual->size(0) == M && residual->size(1) == n, "residual must be [M, N]");
    rp = residual->data_ptr<float>();
  }
  auto out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const GroupArgs a{x.data_ptr<float>(), groups.data_ptr<uint8_t>(), rp, out.data_ptr<float>(), M, K, n, nb,
                    groups.size(2)};
  const bool q4 = a.record == kQ4Record;
#ifdef METRONOME_GROUPS_AVX2
  if (M >= kPanelMinRows) {
    const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
    at::parallel_for(0, panels, 1, [&](int64_t lo, int64_t hi) {
      alignas(64) float panel[kChunk * kPanelCols];
      if (q4) {
        panel_rows<true>(a, lo, hi, panel);
      } else {
        panel_rows<false>(a, lo, hi, panel);
      }
    });
    return out;
  }
#endif
  // each thread a contiguous run of groups: its weights are one stream from memory
  at::parallel_for(0, G, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      if (q4) {
        group_rows<true>(a, g);
      } else {
        group_rows<false>(a, g);
      }
    }
  });
  return out;
}

}  // namespace metronome
