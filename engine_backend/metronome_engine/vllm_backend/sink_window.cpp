// Sinks + window attention read in place from vLLM's paged KV cache (CPU, float32).
// attention.py's torch pass and the tests' dense reference are what this kernel is held to.
//
// Why: the torch pass copies each tile's sink and window blocks out of the cache and
// relocates the sinks before torch's attention kernel; vLLM's own CPU kernel reads the
// cache where it is. This one does too: per (request, kv head), block by block, the
// sinks scored with the query at its in-cache position and the window with the query
// at its stream index, one online softmax over both (no second pass, no merge).
//
// The cache is vLLM's logical per-layer view [blocks, kv_heads, block_size, 2 * d]
// (K then V on the last axis) with whatever strides its physical layout gives (NHD or
// HND): every read goes through the view's strides.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "../kernels/vector16.h"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Lane j of the result is the sum of the lanes of v[j]: sixteen dot products reduced
// together in four rounds of pairwise shuffles, not sixteen horizontal sums.
inline vf lane_sums(vf* v) {
  const vi lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const vi hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const vi lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const vi hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const vi lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const vi hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const vi lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const vi hi1 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  vf a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1], lo8) + __builtin_shuffle(v[2 * i], v[2 * i + 1], hi8);
  for (int i = 0; i < 4; ++i) b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo4) + __builtin_shuffle(a[2 * i], a[2 * i + 1], hi4);
  for (int i = 0; i < 2; ++i) c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], lo2) + __builtin_shuffle(b[2 * i], b[2 * i + 1], hi2);
  return __builtin_shuffle(c[0], c[1], lo1) + __builtin_shuffle(c[0], c[1], hi1);
}

// The running softmax of one query row's G heads (the query heads of one kv head).
struct Running {
  float* max;  // [G]
  float* sum;  // [G]
  float* acc;  // [G, d]
};

// Folds keys [0, n) of one block into the running softmax: key j's K at k + j * ks,
// its V at k + j * ks + d. q: the row's G heads, already scaled, d = NV * 16 apart.
template <int NV>
void fold(const float* q, const float* k, int64_t ks, int64_t n, int64_t G, Running& st) {
  constexpr int64_t D = NV * kLanes;
  const vf lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - j0);
    const float* kr = k + j0 * ks;
    for (int64_t g = 0; g < G; ++g) {
      vf qv[NV];
      for (int c = 0; c < NV; ++c) qv[c] = vload(q + g * D + c * kLanes);
      vf dots[kLanes];
      key_dots<NV>(qv, kr, ks, m, dots);
      vf s = lane_sums(dots);
      s = lane < static_cast<float>(m) ? s : vsplat(kNegInf);
      const float m_old = st.max[g];
      const float m_new = std::max(m_old, hmax(s));
      // the running max seldom moves after the first keys: then no rescaling
      const float corr = m_old == m_new ? 1.f : m_old == kNegInf ? 0.f : fast_exp(m_old - m_new);
      vf p = vexp(s - m_new);
      p = lane < static_cast<float>(m) ? p : vsplat(0.f);
      st.max[g] = m_new;
      st.sum[g] = st.sum[g] * corr + hsum(p);
      alignas(64) float w[kLanes];
      vstore(w, p);
      float* accp = st.acc + g * D;
      vf acc[NV];
      for (int c = 0; c < NV; ++c) acc[c] = vload(accp + c * kLanes) * corr;
      for (int64_t j = 0; j < m; ++j) {
        const float* vr = kr + j * ks + D;
        for (int c = 0; c < NV; ++c) acc[c] += w[j] * vload(vr + c * kLanes);
      }
      for (int c = 0; c < NV; ++c) vstore(accp + c * kLanes, acc[c]);
    }
  }
}

struct Args {
  const float* q;       // [T, H, d]: rows q_row apart, heads d apart
  const float* q_sink;  // the same query rotated at its in-cache position (== q without sinks), or null:
  const float* cos_sin;  // then each row rotates q back by p - c itself with this RoPE table [P, rd]
  int64_t rd;            // (cos | sin halves), neox (halves) or GPT-J (pairs) style
  bool neox;
  const float* cache;   // the logical view's element [0, 0, 0, 0]
  float* out;           // [T, H, d]: rows out_row apart, heads d apart
  const int32_t* table;
  const int32_t* qsl;
  const int32_t* seq_lens;
  int64_t q_row, out_row, s_block, s_head, s_slot, table_row;
  int64_t H, G, d, block_size, window, sinks;
  float scale;
};

// Query rows [row0, row1) of request r, kv head kh. The query at stream index p sees
// the sinks [0, min(S, p + 1)) with q_sink and its window [max(S, p - W + 1), p] with q.
template <int NV>
void attend(const Args& a, int64_t r, int64_t kh, int64_t row0, int64_t row1, std::vector<float>& scratch) {
  const int64_t G = a.G, d = a.d, bs = a.block_size;
  scratch.resize(G * (2 + 2 * d));
  Running st{scratch.data(), scratch.data() + G, scratch.data() + 2 * G};
  float* q = scratch.data() + G * (2 + d);
  float* q_sink = q;  // filled below
  std::vector<float> qs_buf(G * d);
  const int32_t* blocks = a.table + r * a.table_row;
  const int64_t last = a.qsl[r + 1];
  const int64_t len = a.seq_lens[r];
  auto run = [&](const float* qq, int64_t k0, int64_t k1) {  // keys [k0, k1), block by block
    while (k0 < k1) {
      const int64_t b = k0 / bs, off = k0 % bs;
      const int64_t n = std::min(bs - off, k1 - k0);
      const float* k = a.cache + blocks[b] * a.s_block + kh * a.s_head + off * a.s_slot;
      fold<NV>(qq, k, a.s_slot, n, G, st);
      k0 += n;
    }
  };
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t p = len - last + row;
    const int64_t n_sink = std::min(a.sinks, p + 1);
    const int64_t lo = std::max(a.sinks, p - a.window + 1);
    const float* qr = a.q + row * a.q_row + kh * G * d;
    for (int64_t i = 0; i < G * d; ++i) q[i] = qr[i] * a.scale;
    std::fill(st.max, st.max + G, kNegInf);
    std::fill(st.sum, st.sum + G, 0.f);
    std::fill(st.acc, st.acc + G * d, 0.f);
    if (n_sink > 0) {
      // the query's in-cache position: sinks seen + window seen - 1
      const int64_t delta = p - (n_sink + std::max<int64_t>(p - lo + 1, 0) - 1);
      if (a.q_sink != nullptr && a.q_sink != a.q) {
        const float* qsr = a.q_sink + row * a.q_row + kh * G * d;
        for (int64_t i = 0; i < G * d; ++i) qs_buf[i] = qsr[i] * a.scale;
        q_sink = qs_buf.data();
      } else if (a.q_sink == nullptr && delta > 0) {
        // rotated back by delta: a RoPE score depends on the difference of the two angles, so
        // rotating the query at p back by p - c gives the query at c
        const float* cs = a.cos_sin + delta * a.rd;
        const int64_t half = a.rd / 2;
        std::copy(q, q + G * d, qs_buf.data());
        for (int64_t g = 0; g < G; ++g) {
          float* x = qs_buf.data() + g * d;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t i1 = a.neox ? i : 2 * i, i2 = a.neox ? i + half : 2 * i + 1;
            const float x1 = x[i1], x2 = x[i2], c = cs[i], sn = cs[half + i];
            x[i1] = x1 * c + x2 * sn;
            x[i2] = x2 * c - x1 * sn;
          }
        }
        q_sink = qs_buf.data();
      } else {
        q_sink = q;
      }
      run(q_sink, 0, n_sink);
    }
    run(q, lo, p + 1);
    float* o = a.out + row * a.out_row + kh * G * d;
    for (int64_t g = 0; g < G; ++g) {
      const float inv = 1.f / st.sum[g];
      for (int64_t i = 0; i < d; ++i) o[g * d + i] = st.acc[g * d + i] * inv;
    }
  }
}

void check_rows(const at::Tensor& t, const char* name, int64_t T, int64_t H, int64_t d) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu(), name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() == 3 && t.size(0) == T && t.size(1) == H && t.size(2) == d, name, " must be [T, H, d]");
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == d, name, ": heads must be contiguous within a row");
}

void check_i32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kInt && t.device().is_cpu() && t.is_contiguous(),
              name, " must be a contiguous int32 CPU tensor");
}

// out[T, H, d] = sinks + window attention of q (q_sink for the sinks) over the cache.
// Request r owns query rows [qsl[r], qsl[r + 1]), the last at stream index seq_lens[r] - 1,
// and its stream's blocks table[r, :]. Rows past qsl[R] (padding) are left as they are.
void sink_window_attention(const at::Tensor& q, const std::optional<at::Tensor>& q_sink,
                           const std::optional<at::Tensor>& cos_sin, bool neox, const at::Tensor& kv_cache,
                           const at::Tensor& block_table, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, int64_t window, int64_t sinks, double scale, at::Tensor& out) {
  TORCH_CHECK(q.dim() == 3, "q must be [T, H, d]");
  const int64_t T = q.size(0), H = q.size(1), d = q.size(2);
  check_rows(q, "q", T, H, d);
  if (q_sink.has_value()) check_rows(*q_sink, "q_sink", T, H, d);
  check_rows(out, "out", T, H, d);
  TORCH_CHECK(!q_sink.has_value() || q_sink->stride(0) == q.stride(0), "q and q_sink must share a row stride");
  TORCH_CHECK(sinks == 0 || q_sink.has_value() || cos_sin.has_value(),
              "with sinks, pass the query at its in-cache position or the RoPE table to rotate it");
  int64_t table_rows = 0;
  if (!q_sink.has_value() && cos_sin.has_value()) {
    const at::Tensor& t = *cos_sin;
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(),
                "the RoPE table must be a contiguous float32 CPU [positions, rotary_dim]");
    TORCH_CHECK(t.size(1) % 2 == 0 && t.size(1) <= d, "the RoPE table's rotary_dim must be even and at most d");
    table_rows = t.size(0);
  }
  TORCH_CHECK(kv_cache.scalar_type() == at::kFloat && kv_cache.device().is_cpu(), "the cache must be float32 on CPU");
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(3) == 2 * d && kv_cache.stride(3) == 1,
              "the cache must be [blocks, kv_heads, block_size, 2 * d], K|V contiguous");
  const int64_t kvh = kv_cache.size(1), num_blocks = kv_cache.size(0), bs = kv_cache.size(2);
  TORCH_CHECK(kvh > 0 && H % kvh == 0, "the query heads must be a multiple of the kv heads");
  TORCH_CHECK(d % kLanes == 0 && d <= 16 * kLanes, "head size must be a multiple of 16, at most 256");
  TORCH_CHECK(window > 0 && sinks >= 0, "window must be > 0 and sinks >= 0");
  check_i32(block_table, "block_table");
  check_i32(query_start_loc, "query_start_loc");
  check_i32(seq_lens, "seq_lens");
  const int64_t R = seq_lens.size(0);
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) >= R && query_start_loc.size(0) >= R + 1,
              "one block table row and one query start per request, plus one");
  Args a{};
  a.qsl = query_start_loc.data_ptr<int32_t>();
  a.seq_lens = seq_lens.data_ptr<int32_t>();
  a.table = block_table.data_ptr<int32_t>();
  a.table_row = block_table.size(1);
  TORCH_CHECK(a.qsl[0] == 0 && a.qsl[R] <= T, "query_start_loc must start at 0 and end within q");
  // every block a query reads is in the pool: its sink blocks and its window's
  for (int64_t r = 0; r < R; ++r) {
    const int64_t qlen = a.qsl[r + 1] - a.qsl[r];
    TORCH_CHECK(qlen >= 0 && a.seq_lens[r] >= qlen, "request ", r, ": seq_len shorter than its query");
    if (qlen == 0) continue;
    const int64_t len = a.seq_lens[r];
    if (table_rows > 0) {  // the last row rotates back the furthest: p - c grows with p
      const int64_t p = len - 1, lo = std::max(sinks, p - window + 1);
      const int64_t delta = p - (std::min(sinks, p + 1) + std::max<int64_t>(p - lo + 1, 0) - 1);
      TORCH_CHECK(delta < table_rows, "request ", r, ": the RoPE table has no angle for ", delta, " positions");
    }
    TORCH_CHECK((len + bs - 1) / bs <= a.table_row, "request ", r, ": its blocks overrun the block table");
    const int64_t first = std::max<int64_t>(sinks, len - qlen - window + 1) / bs;
    const int64_t sink_end = (std::min(sinks, len) + bs - 1) / bs;
    for (int64_t b = 0; b < (len + bs - 1) / bs; ++b) {
      if (b >= sink_end && b < first) continue;  // between the sinks and the window: never read
      const int64_t id = a.table[r * a.table_row + b];
      TORCH_CHECK(id >= 0 && id < num_blocks, "request ", r, ": block ", id, " is not in the cache");
    }
  }
  a.q = q.data_ptr<float>();
  a.q_sink = q_sink.has_value() ? q_sink->data_ptr<float>() : (sinks > 0 ? nullptr : a.q);
  if (a.q_sink == nullptr) {
    a.cos_sin = cos_sin->data_ptr<float>();
    a.rd = cos_sin->size(1);
    a.neox = neox;
  }
  a.cache = kv_cache.data_ptr<float>();
  a.out = out.data_ptr<float>();
  a.q_row = q.stride(0);
  a.out_row = out.stride(0);
  a.s_block = kv_cache.stride(0);
  a.s_head = kv_cache.stride(1);
  a.s_slot = kv_cache.stride(2);
  a.H = H;
  a.G = H / kvh;
  a.d = d;
  a.block_size = bs;
  a.window = window;
  a.sinks = sinks;
  a.scale = static_cast<float>(scale);
  // a task: one (request, kv head) and up to kRows of its query rows, so that a long
  // chunk (a prompt) spreads over every thread
  constexpr int64_t kRows = 8;
  struct Task {
    int64_t r, kh, row0, row1, cost;
  };
  std::vector<Task> tasks;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t kh = 0; kh < kvh; ++kh) {
      for (int64_t row = a.qsl[r]; row < a.qsl[r + 1]; row += kRows) {
        const int64_t row1 = std::min<int64_t>(row + kRows, a.qsl[r + 1]);
        const int64_t keys = std::min<int64_t>(a.seq_lens[r], window + sinks);
        tasks.push_back({r, kh, row, row1, keys * (row1 - row)});
      }
    }
  }
  // the costliest first, each thread taking the next when it is free: requests differ in length
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.cost > y.cost; });
  std::atomic<int64_t> next{0};
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n_tasks), 1, [&](int64_t, int64_t) {
    std::vector<float> scratch;
    for (int64_t i = next++; i < n_tasks; i = next++) {
      const Task& t = tasks[i];
      switch (d / kLanes) {
#define METRONOME_CASE(nv) \
  case nv:                 \
    attend<nv>(a, t.r, t.kh, t.row0, t.row1, scratch); \
    break;
        METRONOME_CASE(1)
        METRONOME_CASE(2)
        METRONOME_CASE(3)
        METRONOME_CASE(4)
        METRONOME_CASE(5)
        METRONOME_CASE(6)
        METRONOME_CASE(7)
        METRONOME_CASE(8)
        METRONOME_CASE(10)
        METRONOME_CASE(12)
        METRONOME_CASE(16)
#undef METRONOME_CASE
        default:
          TORCH_CHECK(false, "no kernel for head size ", d);
      }
    }
  });
}

// Stores this step's K and V at their slots of the cache (any layout): one call a layer,
// where the torch path concatenates, converts and scatters. Padding slots (-1) are skipped.
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv_cache.scalar_type() == at::kFloat && kv_cache.device().is_cpu() && kv_cache.dim() == 4 &&
                  kv_cache.stride(3) == 1,
              "the cache must be a float32 CPU [blocks, kv_heads, block_size, 2 * d] view, K|V contiguous");
  const int64_t kvh = kv_cache.size(1), bs = kv_cache.size(2), d = kv_cache.size(3) / 2;
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 && slot_mapping.is_contiguous(),
              "slot_mapping must be a contiguous int64 vector");
  const int64_t n = slot_mapping.size(0);
  check_rows(key, "key", key.size(0), kvh, d);
  check_rows(value, "value", value.size(0), kvh, d);
  TORCH_CHECK(key.size(0) >= n && value.size(0) >= n, "fewer keys or values than slots");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t capacity = kv_cache.size(0) * bs;
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(slots[i] < capacity, "slot ", slots[i], " is not in the cache");
  const float* k = key.data_ptr<float>();
  const float* v = value.data_ptr<float>();
  float* cache = kv_cache.data_ptr<float>();
  const int64_t kr = key.stride(0), vr = value.stride(0);
  const int64_t sb = kv_cache.stride(0), sh = kv_cache.stride(1), ss = kv_cache.stride(2);
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    float* row = cache + (slots[i] / bs) * sb + (slots[i] % bs) * ss;
    for (int64_t h = 0; h < kvh; ++h) {
      std::memcpy(row + h * sh, k + i * kr + h * d, d * sizeof(float));
      std::memcpy(row + h * sh + d, v + i * vr + h * d, d * sizeof(float));
    }
  }
}

}  // namespace

TORCH_LIBRARY(metronome_vllm, m) {
  m.def("store_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()", &store_kv);
  m.def(
      "sink_window_attention(Tensor q, Tensor? q_sink, Tensor? cos_sin, bool neox, Tensor kv_cache, "
      "Tensor block_table, Tensor query_start_loc, "
      "Tensor seq_lens, int window, int sinks, float scale, Tensor(a!) out) -> ()",
      &sink_window_attention);
}
