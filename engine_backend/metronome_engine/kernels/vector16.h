// The 16-float vector and its small helpers, shared by the engine's kernels (ops.cpp) and
// vLLM's sinks + window kernel (vllm_backend/sink_window.cpp, a separate build that
// includes this file by its relative path). Each build's cache key covers this file.
//
// An unnamed namespace: each build compiles these for its own vector unit (-march=native
// or x86-64-v3), so every translation unit keeps its own copies (internal linkage).
#pragma once

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

// 16 floats: GCC lowers these to the widest vector unit there is (one AVX-512
// register, two AVX2 ones, four NEON ones). aligned(4): loads from any float address.
typedef float vf __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi __attribute__((vector_size(64), aligned(4)));
constexpr int kLanes = 16;

// Loads and stores through a may_alias vector type: one unaligned vector move each (in
// sink_window.cpp a memcpy into a vf became two half-width stores and a full-width
// reload, a store-forwarding stall on every key).
typedef float vf_mem __attribute__((vector_size(64), aligned(4), may_alias));

inline vf vload(const float* p) { return *reinterpret_cast<const vf_mem*>(p); }

inline void vstore(float* p, vf v) { *reinterpret_cast<vf_mem*>(p) = v; }

inline vf vsplat(float x) { return vf{} + x; }

inline float hsum(vf v) {
#ifdef __AVX512F__
  return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
#else
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
#endif
}

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}

// exp on 16 lanes for the softmax and SiLU (std::exp does not vectorize without
// -ffast-math, which would also drop the NaN semantics the engine's fault check relies
// on): a degree-6 polynomial after range reduction by ln 2. Relative error about 2e-7;
// NaN in gives NaN out.
// x clamped to [lo, hi], NaN kept. On AVX2 GCC lowered `x < lo ? lo : x` on these 16-float
// vectors lane by lane (32 scalar compares and blends per clamp: silu_mul ran at a third of
// torch's speed); max/min take x as their second operand, which they return for NaN.
inline vf vclamp(vf x, float lo, float hi) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  __m256 h[2];
  std::memcpy(h, &x, sizeof(x));
  for (auto& v : h) v = _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), v));
  std::memcpy(&x, h, sizeof(x));
  return x;
#else
  x = x < lo ? vsplat(lo) : x;
  return x > hi ? vsplat(hi) : x;
#endif
}

inline vf vexp(vf x) {
  x = vclamp(x, -87.0f, 88.0f);
  const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const vf r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  vf p = vsplat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * __builtin_bit_cast(vf, bits);
}

inline float fast_exp(float x) { return vexp(vsplat(x))[0]; }

// The products of a query (NV pieces of 16 floats, qv) with up to sixteen keys, key j's
// pieces at k + j * stride: dots[j] holds its 16 partial sums (keys m .. 15: zeros), to be
// summed across lanes by the caller, sixteen keys at once.
template <int NV>
inline void key_dots(const vf* qv, const float* k, int64_t stride, int64_t m, vf* dots) {
  for (int64_t j = 0; j < kLanes; ++j) {
    if (j < m) {
      vf dot = qv[0] * vload(k + j * stride);
      for (int c = 1; c < NV; ++c) dot += qv[c] * vload(k + j * stride + c * kLanes);
      dots[j] = dot;
    } else {
      dots[j] = vsplat(0.f);
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// vexp on one 8-float register, the same steps, for the AVX2 kernels (ops.cpp's fold and
// SiLU, chunk_attention.cpp): written on the 16-float vectors GCC split each step in two
// halves. max/min take their second operand where either is NaN, so NaN comes out NaN.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // round to nearest
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic), magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

}  // namespace
