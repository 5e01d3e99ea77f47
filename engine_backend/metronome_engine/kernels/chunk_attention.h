// Attention of a chunk of many query rows of one session (a prefill chunk) over its
// resident blocks, as products of tiles. See chunk_attention.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace metronome {

// One session's share of paged_attention's arguments (kernels/ops.cpp): its blocks' tables
// (block_logical / block_physical: this session's row), and `sinks` already resolved (its
// pinned prefix where it has one).
struct ChunkArgs {
  const float* q;       // [T, H, hd]
  const float* q_sink;  // the same layout, rotated at in-cache positions; == q when not given
  const float* k_cache;
  const float* v_cache;  // [kvh, num_slots, hd]
  float* out;            // [T, H * hd]
  const int64_t* positions;
  const int64_t* block_logical;
  const int64_t* block_physical;
  int64_t block_count, H, G, hd, num_slots, block_size, window, sinks;
  float scale;
};

// Whether this build has the tiled kernel for head size hd and G query heads per kv head.
bool chunk_attention_ok(int64_t hd, int64_t G);

// Query rows a task takes: its rows' G heads fill the tile's 24 lanes.
int64_t chunk_attention_rows(int64_t G);

// Rows row0 .. row1 - 1 (at most chunk_attention_rows(G)) of kv head kh.
void chunk_attention(const ChunkArgs& a, int64_t kh, int64_t row0, int64_t row1, std::vector<float>& scratch);

}  // namespace metronome
