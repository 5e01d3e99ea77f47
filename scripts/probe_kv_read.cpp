// Probe: how fast can a decode step's K/V be read in paged attention's access pattern,
// with no attention arithmetic (or a fixed amount of stand-in FMAs per cache line)?
// SmolLM2-135M's shapes: 30 layers, 3 kv heads, head_dim 64, blocks of 16 slots (4 KB of K
// and 4 KB of V per head), 32 sessions at contexts 128-272; one task per (session, kv
// head), the longest first, taken by whichever thread is free (as ops.cpp's paged_attention).
//
//   g++ -O3 -march=x86-64-v3 -fopenmp scripts/probe_kv_read.cpp -o /tmp/probe_kv_read
//   OMP_NUM_THREADS=2 /tmp/probe_kv_read [reps]
//
// Prints ms and GB/s (of the K/V the tasks read) per access pattern, each rep taking every
// pattern in turn (a shared machine's load drifts), medians.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kLayers = 30, kKvh = 3, kHd = 64, kBs = 16, kBatch = 32;
constexpr int64_t kBlockFloats = kBs * kHd;  // 1024 floats = 4 KB
constexpr int kLines = kBlockFloats * 4 / 64;

float* pool_alloc(size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  auto* f = static_cast<float*>(p);
  for (size_t i = 0; i < bytes / 4; ++i) f[i] = static_cast<float>(i % 97) * 1e-3f;
  return f;
}

struct Pool {
  std::vector<float*> k, v;  // per layer [kvh, slots, hd]
  int64_t slots;
  std::vector<std::vector<int64_t>> blocks;  // per session, physical blocks in stream order
};

Pool make_pool(bool scattered, bool huge) {
  Pool p;
  int64_t total = 0;
  std::vector<int64_t> counts;
  for (int b = 0; b < kBatch; ++b) {
    const int ctx = 128 + (b * (272 - 128)) / kBatch;
    counts.push_back((ctx + kBs - 1) / kBs);
    total += counts.back();
  }
  const int64_t nblocks = total + 8;
  p.slots = nblocks * kBs;
  std::vector<int64_t> order(nblocks);
  std::iota(order.begin(), order.end(), 0);
  if (scattered) std::shuffle(order.begin(), order.end(), std::mt19937(0));
  int64_t at = 0;
  for (int64_t c : counts) {
    p.blocks.emplace_back(order.begin() + at, order.begin() + at + c);
    at += c;
  }
  const size_t bytes = static_cast<size_t>(kKvh) * p.slots * kHd * 4;
  for (int l = 0; l < kLayers; ++l) {
    p.k.push_back(pool_alloc(bytes, huge));
    p.v.push_back(pool_alloc(bytes, huge));
  }
  return p;
}

enum class Fetch { none, bulk_t0, spread_t0, spread_t2, bulk2_t0 };

// `work` stand-in FMAs per 64-byte line read (8 independent chains), like the fold's
// scores and weighted sums for the three query heads of a kv head.
template <int Work>
float walk(const Pool& p, Fetch fetch) {
  struct Task {
    int b, kh;
  };
  std::vector<Task> tasks;
  for (int b = 0; b < kBatch; ++b)
    for (int kh = 0; kh < kKvh; ++kh) tasks.push_back({b, kh});
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](const Task& x, const Task& y) { return p.blocks[x.b].size() > p.blocks[y.b].size(); });
  float total = 0.f;
  for (int l = 0; l < kLayers; ++l) {
    const float* kc = p.k[l];
    const float* vc = p.v[l];
    std::atomic<int64_t> next{0};
    const int64_t n = static_cast<int64_t>(tasks.size());
#pragma omp parallel reduction(+ : total)
    {
      __m256 acc[8];
      for (auto& a : acc) a = _mm256_setzero_ps();
      const __m256 q = _mm256_set1_ps(1.0001f);
      for (int64_t i = next++; i < n; i = next++) {
        const auto& bl = p.blocks[tasks[i].b];
        const int64_t kh = tasks[i].kh;
        auto at = [&](size_t j) { return (kh * p.slots + bl[j] * kBs) * kHd; };
        for (size_t j = 0; j < bl.size(); ++j) {
          const float* kb = kc + at(j);
          const float* vb = vc + at(j);
          const bool has_next = j + 1 < bl.size();
          const float* kn = has_next ? kc + at(j + 1) : nullptr;
          const float* vn = has_next ? vc + at(j + 1) : nullptr;
          if (fetch == Fetch::bulk_t0 && has_next) {
            for (int c = 0; c < kLines; ++c) {
              _mm_prefetch(reinterpret_cast<const char*>(kn + 16 * c), _MM_HINT_T0);
              _mm_prefetch(reinterpret_cast<const char*>(vn + 16 * c), _MM_HINT_T0);
            }
          }
          if (fetch == Fetch::bulk2_t0 && j + 2 < bl.size()) {
            const float* k2 = kc + at(j + 2);
            const float* v2 = vc + at(j + 2);
            for (int c = 0; c < kLines; ++c) {
              _mm_prefetch(reinterpret_cast<const char*>(k2 + 16 * c), _MM_HINT_T0);
              _mm_prefetch(reinterpret_cast<const char*>(v2 + 16 * c), _MM_HINT_T0);
            }
          }
          // K then V, one line at a time (the fold reads a block's K for the scores, then V)
          for (int s = 0; s < 2; ++s) {
            const float* base = s == 0 ? kb : vb;
            const float* nb = s == 0 ? kn : vn;
            for (int c = 0; c < kLines; ++c) {
              if (nb != nullptr && fetch == Fetch::spread_t0) {
                _mm_prefetch(reinterpret_cast<const char*>(nb + 16 * c), _MM_HINT_T0);
              }
              if (nb != nullptr && fetch == Fetch::spread_t2) {
                _mm_prefetch(reinterpret_cast<const char*>(nb + 16 * c), _MM_HINT_T2);
              }
              const __m256 x0 = _mm256_loadu_ps(base + 16 * c);
              const __m256 x1 = _mm256_loadu_ps(base + 16 * c + 8);
              acc[c & 7] = _mm256_add_ps(acc[c & 7], _mm256_add_ps(x0, x1));
              for (int w = 0; w < Work; ++w) acc[w & 7] = _mm256_fmadd_ps(acc[w & 7], q, x0);
            }
          }
        }
      }
      __m256 s = acc[0];
      for (int a = 1; a < 8; ++a) s = _mm256_add_ps(s, acc[a]);
      alignas(32) float f[8];
      _mm256_store_ps(f, s);
      total += f[0];
    }
  }
  return total;
}

// every layer's K and V pools read front to back (the threads split each pool)
float contiguous(const Pool& p) {
  float total = 0.f;
  const int64_t n = static_cast<int64_t>(kKvh) * p.slots * kHd;
  for (int l = 0; l < kLayers; ++l) {
    for (const float* base : {p.k[l], p.v[l]}) {
#pragma omp parallel reduction(+ : total)
      {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = n * t / nt / 32 * 32, hi = t + 1 == nt ? n : n * (t + 1) / nt / 32 * 32;
        for (int64_t i = lo; i < hi; i += 32)
          for (int a = 0; a < 4; ++a) acc[a] = _mm256_add_ps(acc[a], _mm256_loadu_ps(base + i + 8 * a));
        alignas(32) float f[8];
        _mm256_store_ps(f, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        total += f[0];
      }
    }
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  struct Case {
    std::string name;
    int pool;  // 0 engine order, 1 scattered, 2 engine order + THP, 3 scattered + THP
    std::function<float(const Pool&)> run;
  };
  Pool pools[4] = {make_pool(false, false), make_pool(true, false), make_pool(false, true), make_pool(true, true)};
  int64_t kv_floats = 0;
  for (const auto& bl : pools[0].blocks) kv_floats += static_cast<int64_t>(bl.size()) * kBlockFloats;
  const double kv_bytes = 2.0 * kLayers * kKvh * kv_floats * 4;
  const std::vector<Case> cases = {
      {"contiguous read of the pool", 0, contiguous},
      {"blocks, no sw prefetch", 0, [](const Pool& p) { return walk<0>(p, Fetch::none); }},
      {"blocks, next block at its start (t0)", 0, [](const Pool& p) { return walk<0>(p, Fetch::bulk_t0); }},
      {"blocks, next block spread (t0)", 0, [](const Pool& p) { return walk<0>(p, Fetch::spread_t0); }},
      {"scattered blocks, next block at start", 1, [](const Pool& p) { return walk<0>(p, Fetch::bulk_t0); }},
      {"THP blocks, next block at start", 2, [](const Pool& p) { return walk<0>(p, Fetch::bulk_t0); }},
      {"THP blocks, no sw prefetch", 2, [](const Pool& p) { return walk<0>(p, Fetch::none); }},
      {"+12 FMA/line, no sw prefetch", 0, [](const Pool& p) { return walk<12>(p, Fetch::none); }},
      {"+12 FMA/line, next block at start", 0, [](const Pool& p) { return walk<12>(p, Fetch::bulk_t0); }},
      {"+12 FMA/line, 2 blocks ahead at start", 0, [](const Pool& p) { return walk<12>(p, Fetch::bulk2_t0); }},
      {"+12 FMA/line, next block spread (t0)", 0, [](const Pool& p) { return walk<12>(p, Fetch::spread_t0); }},
      {"+12 FMA/line, next block spread (t2)", 0, [](const Pool& p) { return walk<12>(p, Fetch::spread_t2); }},
      {"+12 FMA/line, THP, next spread (t0)", 2, [](const Pool& p) { return walk<12>(p, Fetch::spread_t0); }},
      {"+12 FMA/line, scattered, next at start", 1, [](const Pool& p) { return walk<12>(p, Fetch::bulk_t0); }},
      {"+12 FMA/line, scattered, spread (t2)", 1, [](const Pool& p) { return walk<12>(p, Fetch::spread_t2); }},
      {"+12 FMA/line, scattered THP, spread (t2)", 3, [](const Pool& p) { return walk<12>(p, Fetch::spread_t2); }},
  };
  std::vector<std::vector<double>> ms(cases.size());
  float sink = 0.f;
  for (int r = 0; r < reps + 1; ++r) {
    for (size_t c = 0; c < cases.size(); ++c) {
      const auto t0 = std::chrono::steady_clock::now();
      sink += cases[c].run(pools[cases[c].pool]);
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) ms[c].push_back(dt);  // the first rep warms up
    }
  }
  std::printf("threads %d, K/V the tasks read %.0f MB\n", omp_get_max_threads(), kv_bytes / 1e6);
  for (size_t c = 0; c < cases.size(); ++c) {
    auto v = ms[c];
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    std::printf("  %-42s %7.2f ms  %5.1f GB/s  (min %.2f)\n", cases[c].name.c_str(), med, kv_bytes / med / 1e6, v[0]);
  }
  return sink == 12345.f;  // keeps the sums alive
}
