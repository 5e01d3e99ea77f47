// Dense layers read straight from GGUF-style 4- and 8-bit blocks on the vector unit
// (AVX2 + FMA), for steps of few rows. See groups.cpp.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace metronome {

// x [M, K] @ W (+ residual [M, N]) -> [M, N], where W [K, N] is held in column groups
// (metronome_engine/quant.py: pack_groups): uint8 [ceil(N / 4), K / 32, bytes], one
// record per (group of 4 columns, block of 32 k):
// - Q4_1 (80 bytes): per column 16 bytes, element j in the low nibble of byte j and
//   element j + 16 in the high one (GGUF's order); then 4 float16 scales, 4 float16 offsets;
// - Q8_0 (136 bytes): per column 32 int8; then 4 float16 scales.
// W[k, n] = scale * q + offset, computed in float32 exactly as the loader de-quantizes.
at::Tensor group_linear(const at::Tensor& x, const at::Tensor& groups, int64_t n,
                        const std::optional<at::Tensor>& residual);

}  // namespace metronome
