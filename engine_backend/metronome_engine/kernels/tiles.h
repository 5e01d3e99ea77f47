// Dense layers on the CPU's matrix tiles (AMX), for weights kept as GGUF-style blocks.
// See tiles.cpp.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace metronome {

// Whether this build has the tile kernels and the OS lets this process use the tiles.
bool tiles_ready();

// x [M, K] @ W (+ residual [M, N]) -> [M, N], where W [K, N] is held as 32-row blocks,
// W[k, n] = scale[n, k / 32] * q[n, k] + offset[n, k / 32], laid out by pack_tiles
// (metronome_engine/quant.py): q [ceil(N / 16), K / 32, 16, 16] uint8 (two 4-bit values a
// byte, with an offset) or [ceil(N / 16), K / 32, 16, 32] int8 (no offset); scale and
// offset [ceil(N / 16), K / 32, 16] float32.
at::Tensor tile_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const std::optional<at::Tensor>& offset, int64_t n, const std::optional<at::Tensor>& residual);

}  // namespace metronome
