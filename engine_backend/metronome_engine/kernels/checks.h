// Input checks the kernels share (ops.cpp, tiles.cpp): each names the argument it refuses.
#pragma once

#include <ATen/ATen.h>

namespace metronome {

inline void check_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

inline void check_i64(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous(), name,
              " must be a contiguous int64 CPU tensor");
}

}  // namespace metronome
