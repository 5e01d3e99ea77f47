// The 16-float vector and its small helpers, shared by the engine's kernels (ops.cpp) and
// vLLM's sinks + window kernel (vllm_backend/sink_window.cpp, a separate build that
// includes this file by its relative path). Each build's cache key covers this file.
//
// An unnamed namespace: each build compiles these for its own vector unit (-march=native
// or x86-64-v3), so every translation unit keeps its own copies (internal linkage).
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>

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
inline vf vexp(vf x) {
  x = x < -87.0f ? vsplat(-87.0f) : x;
  x = x > 88.0f ? vsplat(88.0f) : x;
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

}  // namespace
