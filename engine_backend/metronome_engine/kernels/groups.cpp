// Dense layers read straight from 4- and 8-bit blocks (GGUF Q4_1 / Q8_0) on the vector
// unit, for steps of few rows.
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
// Register blocking for AVX2's 16 registers of 8 floats: a pass holds eight 8-lane sums,
// R rows x C columns (see group_pass); each 32-k block of a column is widened once per
// pass and used by its R rows.

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
#ifndef METRONOME_GROUP_ROWS
#define METRONOME_GROUP_ROWS 8
#endif
constexpr int kMaxRows = METRONOME_GROUP_ROWS;  // rows per pass

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
#else
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
      for (int64_t j = 0; j < kBlock; ++j) {
        float q;
        if constexpr (Q4) {
          const uint8_t byte = rec[16 * c + j % 16];
          q = static_cast<float>(j < 16 ? byte & 0x0F : byte >> 4);
        } else {
          q = static_cast<float>(static_cast<int8_t>(rec[32 * c + j]));
        }
        const float w = Q4 ? std::fma(q, s, o) : q * s;
        for (int r = 0; r < R; ++r) sum[r] += w * a.x[(r0 + r) * a.K + b * kBlock + j];
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * a.n + col + c;
      a.out[at] = a.residual != nullptr ? sum[r] + a.residual[at] : sum[r];
    }
  }
}
#endif

// Every row of group g: passes of 8 rows (one column at a time), then of 4, 2, 1 rows
// (2, 4, 4 columns at a time): eight sums a pass.
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
  if constexpr (kMaxRows >= 8) r0 = group_passes<8, 1, Q4>(a, g, r0, a.M);
  if constexpr (kMaxRows >= 4) r0 = group_passes<4, 2, Q4>(a, g, r0, a.M);
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
