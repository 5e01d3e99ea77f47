// Dense layers on the CPU's matrix tiles (Intel AMX, bfloat16 products into float32).
//
// Why: at 8-32 rows the float32 FMA kernel in ops.cpp runs at the vector unit's rate;
// the tile unit multiplies bfloat16 pairs several times faster. The result keeps
// float32's accuracy because nothing is rounded to bfloat16:
// - the weights are GGUF blocks, W[k, n] = scale * q + offset per 32 k, and q is a small
//   integer (4 or 8 bits), exact in bfloat16; scale and offset are applied in float32;
// - each activation is split into three bfloat16 parts whose sum is the activation exactly
//   (8 significant bits each), and all three are multiplied: a tile product sums 32 exact
//   products in float32.
// The products are summed in another order than a float32 GEMM's, so results agree with
// it to float32 rounding, not bit for bit.
//
// What bounds it (measured): the tile unit. A tile product costs the same at 1 row as at
// 16, each block takes three (one per part), and each block's sums leave the tiles to be
// scaled in float32 (four tile stores a block); the widening and the scaling run on the
// vector unit between the products. Whole steps took about 0.6 of the float32 panels'
// time at 1-8 rows and 0.76 at 32, before the last two changes (docs/engine.md, Speed).

#include "tiles.h"

#include "checks.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#define METRONOME_TILES 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace metronome {

#ifdef METRONOME_TILES
namespace {

constexpr int64_t kBlock = 32;  // k per GGUF block, and per tile product (16 bf16 pairs)
constexpr int64_t kCols = 16;   // output columns per tile
constexpr int64_t kTileElems = 16 * 32;
constexpr int kRowsPerTile = 16;
// how many blocks ahead a pass fetches its weights: each layer's tiles come from DRAM,
// not cache, and waiting on them cost 15-20% of the dense layers' time (measured: 4 to
// 17 blocks ahead all did about as well)
constexpr int64_t kAhead = 8;

// palette 1, set per row group by tile_linear: tiles 0-3 accumulate, 4-5 hold activations,
// 6-7 weights (see tile_pass)
struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// x = hi + mid + lo exactly: each part takes the next 8 significant bits (truncation
// leaves an exact remainder, and 3 x 8 bits cover float32's 24)
void split_bf16(const float* x, int64_t count, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  int64_t i = 0;
  auto part = [&](__m512 v, __m512* rest) {
    const __m512i h = _mm512_and_si512(_mm512_castps_si512(v), top);
    *rest = _mm512_sub_ps(v, _mm512_castsi512_ps(h));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16));
  };
  for (; i + 16 <= count; i += 16) {
    __m512 r1, r2, r3;
    const __m256i h = part(_mm512_loadu_ps(x + i), &r1);
    const __m256i m = part(r1, &r2);
    const __m256i l = part(r2, &r3);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid + i), m);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), l);
  }
  for (; i < count; ++i) {
    float v = x[i];
    for (uint16_t* dst : {hi + i, mid + i, lo + i}) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const uint32_t h = u & 0xFFFF0000u;
      float hf;
      std::memcpy(&hf, &h, 4);
      *dst = static_cast<uint16_t>(h >> 16);
      v -= hf;
    }
  }
}

// One block's weights of one tile (16 columns x 32 k) as the bfloat16 pairs a tile
// product reads: row i holds, for column j, k = 2i and 2i + 1 at lanes 2j and 2j + 1.
// Q4: 16 bytes a row, lane t in the low nibble of byte t (t < 16) or the high one of
// byte t - 16. Q8: 32 signed bytes a row.
inline void expand_q4(const uint8_t* src, uint16_t* dst) {
  alignas(64) static const uint16_t kValues[32] = {  // bfloat16 of 0..15
      0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120,
      0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const __m512i table = _mm512_load_si512(kValues);
  const __m256i low = _mm256_set1_epi16(0x0F);
  for (int i = 0; i < 16; ++i) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * i)));
    const __m512i nibbles = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, low)),
                                               _mm256_srli_epi16(bytes, 4), 1);
    _mm512_store_si512(dst + 32 * i, _mm512_permutexvar_epi16(nibbles, table));
  }
}

inline void expand_q8(const int8_t* src, uint16_t* dst) {
  for (int i = 0; i < 16; ++i) {
    const __m128i* row = reinterpret_cast<const __m128i*>(src + 32 * i);
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row + 1)));
    _mm512_store_si512(dst + 32 * i, (__m512i)_mm512_cvtne2ps_pbh(b, a));  // a in the low half
  }
}

struct TileArgs {
  const uint16_t* parts;  // [3, M, K] bfloat16 parts of x
  const float* sums;      // [M, nb] block sums of x, with an offset
  const uint8_t* q;       // [P, nb, 16, 16 or 32]
  const float* scale;     // [P, nb, 16]
  const float* offset;    // [P, nb, 16] or null
  int64_t M, K, nb, tile_bytes;
  bool q4;
};

// Panels p .. p + NP - 1 (NP <= 2) for rows g0 .. g0 + rows - 1 (<= 32): accumulator tiles
// 0-3 are (rows 0-15 | 16-31) x (panel p | p + 1), four independent sums; tiles 4-5 hold
// activations, 6-7 the panels' weights. Each block's product is scaled in float32 and
// added to acc [NP][32][16].
//
// Software-pipelined: the tiles read what plain stores just wrote (and the other way
// round) only through memory, which stalls until the stores land; so while block b's
// products run, the vector unit widens block b + 1's weights and scales block b - 1's sums.
// That work is cut in six parts, one after each pair of products: placed in one piece
// after all twelve, it did not fit in the core's reorder window beside them, and the
// products and the vector work ran one after the other (measured: the dense layers took
// the sum of the two alone; in six parts, 14% less).
template <int NP>
void tile_pass(const TileArgs& a, int64_t g0, int64_t rows, int64_t p, int64_t prefetch_end, float* acc) {
  const bool two = rows > kRowsPerTile;
  const int64_t half = std::min<int64_t>(rows, kRowsPerTile);
  alignas(64) uint16_t weights[2][NP][kTileElems];
  alignas(64) float cbuf[2][NP][2 * kRowsPerTile * kCols];
  std::memset(acc, 0, NP * 2 * kRowsPerTile * kCols * sizeof(float));
  auto widen = [&](int64_t b, int j) {
    const int64_t tile = (p + j) * a.nb + b;
    // fetch the tile, scale and offset this pass (or the next, panels p + 2 and p + 3)
    // reads kAhead blocks on, into L1
    const int64_t ahead_b = b + kAhead;
    const int64_t ahead = ahead_b < a.nb ? tile + kAhead : (p + 2 + j) * a.nb + ahead_b - a.nb;
    if (ahead < prefetch_end) {
      const char* t = reinterpret_cast<const char*>(a.q + ahead * a.tile_bytes);
      for (int64_t l = 0; l < a.tile_bytes; l += 64) _mm_prefetch(t + l, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a.scale + ahead * kCols), _MM_HINT_T0);
      if (a.offset != nullptr) _mm_prefetch(reinterpret_cast<const char*>(a.offset + ahead * kCols), _MM_HINT_T0);
    }
    if (a.q4) {
      expand_q4(a.q + tile * a.tile_bytes, weights[b & 1][j]);
    } else {
      expand_q8(reinterpret_cast<const int8_t*>(a.q + tile * a.tile_bytes), weights[b & 1][j]);
    }
  };
  // rows r0 .. r1 - 1 of panel p + j's sums of block b, scaled into acc
  auto scale = [&](int64_t b, int j, int64_t r0, int64_t r1) {
    const int64_t tile = (p + j) * a.nb + b;
    const float* c = cbuf[b & 1][j];
    const __m512 sv = _mm512_loadu_ps(a.scale + tile * kCols);
    float* acc_j = acc + j * 2 * kRowsPerTile * kCols;
    if (a.offset != nullptr) {
      const __m512 ov = _mm512_loadu_ps(a.offset + tile * kCols);
      for (int64_t r = r0; r < r1; ++r) {
        __m512 v = _mm512_fmadd_ps(sv, _mm512_load_ps(c + r * kCols), _mm512_load_ps(acc_j + r * kCols));
        v = _mm512_fmadd_ps(ov, _mm512_set1_ps(a.sums[(g0 + r) * a.nb + b]), v);
        _mm512_store_ps(acc_j + r * kCols, v);
      }
    } else {
      for (int64_t r = r0; r < r1; ++r) {
        _mm512_store_ps(acc_j + r * kCols,
                        _mm512_fmadd_ps(sv, _mm512_load_ps(c + r * kCols), _mm512_load_ps(acc_j + r * kCols)));
      }
    }
  };
  for (int j = 0; j < NP; ++j) widen(0, j);
  for (int64_t b = 0; b < a.nb; ++b) {
    // part i of the vector work beside block b's products
    auto vector_part = [&](int i) {
      const bool next = b + 1 < a.nb, prev = b > 0;
      switch (i) {
        case 0: if (next) widen(b + 1, 0); break;
        case 1: if (prev) scale(b - 1, 0, 0, half); break;
        case 2: if (NP == 2 && next) widen(b + 1, NP - 1); break;
        case 3: if (prev) scale(b - 1, 0, half, rows); break;
        case 4: if (NP == 2 && prev) scale(b - 1, NP - 1, 0, half); break;
        default: if (NP == 2 && prev) scale(b - 1, NP - 1, half, rows); break;
      }
    };
    _tile_zero(0);
    if (two) _tile_zero(1);
    if (NP == 2) {
      _tile_zero(2);
      if (two) _tile_zero(3);
    }
    _tile_loadd(6, weights[b & 1][0], 64);
    if (NP == 2) _tile_loadd(7, weights[b & 1][NP - 1], 64);
    for (int s = 0; s < 3; ++s) {
      const uint16_t* x = a.parts + s * a.M * a.K + g0 * a.K + b * kBlock;
      _tile_loadd(4, x, a.K * 2);
      _tile_dpbf16ps(0, 4, 6);
      if (NP == 2) _tile_dpbf16ps(2, 4, 7);
      vector_part(2 * s);
      if (two) {
        _tile_loadd(5, x + kRowsPerTile * a.K, a.K * 2);
        _tile_dpbf16ps(1, 5, 6);
        if (NP == 2) _tile_dpbf16ps(3, 5, 7);
      }
      vector_part(2 * s + 1);
    }
    _tile_stored(0, cbuf[b & 1][0], 64);
    if (two) _tile_stored(1, cbuf[b & 1][0] + kRowsPerTile * kCols, 64);
    if (NP == 2) {
      _tile_stored(2, cbuf[b & 1][NP - 1], 64);
      if (two) _tile_stored(3, cbuf[b & 1][NP - 1] + kRowsPerTile * kCols, 64);
    }
  }
  for (int j = 0; j < NP; ++j) scale(a.nb - 1, j, 0, rows);
}

// A pass's sums (acc [np][32][16], rows g0 .. g0 + rows - 1, columns col0 on) into out
// [M, n], plus the residual's if there is one. Streaming stores, where asked, for the
// aligned full panels; masked plain ones for the rest.
void store_pass(const float* acc, int np, int64_t col0, int64_t g0, int64_t rows, int64_t n, const float* residual,
                float* out, bool stream) {
  for (int j = 0; j < np; ++j) {
    const int64_t col = col0 + j * kCols;
    const int64_t cols = std::min(kCols, n - col);
    const auto mask = static_cast<__mmask16>((1u << cols) - 1);
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = out + (g0 + r) * n + col;
      __m512 v = _mm512_load_ps(acc + j * 2 * kRowsPerTile * kCols + r * kCols);
      if (residual != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual + (g0 + r) * n + col));
      if (stream && cols == kCols && (reinterpret_cast<uintptr_t>(dst) & 63) == 0) {
        _mm512_stream_ps(dst, v);
      } else {
        _mm512_mask_storeu_ps(dst, mask, v);
      }
    }
  }
}

}  // namespace

bool tiles_ready() {
  // Linux hands out the tile state only to processes that ask (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA); without it the first tile instruction faults
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

at::Tensor tile_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const std::optional<at::Tensor>& offset, int64_t n, const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(tiles_ready(), "this process cannot use the CPU's matrix tiles (AMX)");
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  const bool q4 = q.scalar_type() == at::kByte;
  TORCH_CHECK((q4 || q.scalar_type() == at::kChar) && q.is_contiguous() && q.dim() == 4 && q.size(2) == 16 &&
                  q.size(3) == (q4 ? 16 : 32),
              "q must be contiguous tiles [P, K / 32, 16, 16] uint8 (4-bit pairs) or [P, K / 32, 16, 32] int8");
  TORCH_CHECK(q4 == offset.has_value(), "4-bit tiles take an offset, 8-bit ones none");
  const int64_t M = x.size(0), K = x.size(1), P = q.size(0), nb = q.size(1);
  TORCH_CHECK(K == nb * kBlock, "x has ", K, " columns, the tiles cover ", nb * kBlock);
  TORCH_CHECK(n > (P - 1) * kCols && n <= P * kCols, "n does not match the tiles' columns");
  for (const at::Tensor* t : {&scale, offset.has_value() ? &*offset : &scale}) {
    check_f32(*t, "scale and offset");
    TORCH_CHECK(t->dim() == 3 && t->size(0) == P && t->size(1) == nb && t->size(2) == kCols,
                "scale and offset must be [P, K / 32, 16]");
  }
  const float* rp = nullptr;
  if (residual.has_value()) {
    check_f32(*residual, "residual");
    TORCH_CHECK(residual->dim() == 2 && residual->size(0) == M && residual->size(1) == n, "residual must be [M, N]");
    rp = residual->data_ptr<float>();
  }
  auto out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const float* xp = x.data_ptr<float>();
  float* outp = out.data_ptr<float>();
  const int64_t pairs = (P + 1) / 2;
  // An output larger than a core's L2 (the output head's logits: 6 MB at 32 rows) goes
  // to memory anyway; streaming stores skip reading each line before writing it
  // (measured: the head 4-7% faster, its logits still read at memory speed after).
  const bool stream = M * n * static_cast<int64_t>(sizeof(float)) > (int64_t{4} << 20);
  // Each thread owns a run of panel pairs (its weights stream in order, fetched ahead),
  // takes them one by one from its run's counter, and when done, takes what is left of
  // the other runs: a core's tile unit at times runs at half speed (another tenant on the
  // same physical core), and with fixed halves the other core then waited for it.
  const int64_t groups = (M + 2 * kRowsPerTile - 1) / (2 * kRowsPerTile);
  const int64_t runs = std::min<int64_t>(at::get_num_threads(), pairs);
  auto run_start = [&](int64_t r) { return r * pairs / runs; };
  std::vector<std::atomic<int64_t>> next(groups * runs);  // per row group and run
  for (int64_t i = 0; i < groups * runs; ++i) next[i] = run_start(i % runs);
  at::parallel_for(0, runs, 1, [&](int64_t own, int64_t) {
    // Every thread splits all of x for itself: it reads each part once per pass, and a
    // copy in its own core's cache beats one fetched from the core that split it. The
    // parts are aligned to a cache line, so that each 64-byte row of a tile is one line,
    // not two, and kept per thread between calls (growing to the largest x seen), so
    // that a call neither allocates nor zeroes them.
    thread_local std::vector<uint16_t> parts_store;
    if (parts_store.size() < static_cast<size_t>(3 * M * K + 32)) parts_store.resize(3 * M * K + 32);
    uint16_t* parts = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(parts_store.data()) + 63) & ~uintptr_t{63});
    split_bf16(xp, M * K, parts, parts + M * K, parts + 2 * M * K);
    std::vector<float> sums;  // the offset multiplies each block's plain sum of x
    if (offset.has_value()) {
      sums.resize(M * nb);
      for (int64_t r = 0; r < M; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
          const float* xb = xp + r * K + b * kBlock;
          sums[r * nb + b] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)));
        }
      }
    }
    const TileArgs args{parts,
                        sums.data(),
                        reinterpret_cast<const uint8_t*>(q.data_ptr()),
                        scale.data_ptr<float>(),
                        offset.has_value() ? offset->data_ptr<float>() : nullptr,
                        M,
                        K,
                        nb,
                        q.size(2) * q.size(3),
                        q4};
    alignas(64) float acc[2 * 2 * kRowsPerTile * kCols];  // a pass's sums: [panel][row][column]
    for (int64_t g0 = 0; g0 < M; g0 += 2 * kRowsPerTile) {
      const int64_t rows = std::min<int64_t>(2 * kRowsPerTile, M - g0);
      const auto r0 = static_cast<uint8_t>(std::min<int64_t>(kRowsPerTile, rows));
      const auto r1 = static_cast<uint8_t>(rows - r0);
      TileConfig cfg;
      for (int t : {0, 2, 4}) cfg.rows[t] = r0, cfg.colsb[t] = 64;
      if (r1 > 0) {
        for (int t : {1, 3, 5}) cfg.rows[t] = r1, cfg.colsb[t] = 64;
      }
      for (int t : {6, 7}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
      _tile_loadconfig(&cfg);
      // its own run first, then what is left of the others
      for (int64_t i = 0; i < runs; ++i) {
        const int64_t run = (own + i) % runs, run_end = run_start(run + 1);
        std::atomic<int64_t>& counter = next[(g0 / (2 * kRowsPerTile)) * runs + run];
        for (int64_t pair = counter++; pair < run_end; pair = counter++) {
          const int64_t p = 2 * pair;
          const int np = p + 1 < P ? 2 : 1;
          const int64_t prefetch_end = std::min(P, 2 * run_end) * nb;
          if (np == 2) {
            tile_pass<2>(args, g0, rows, p, prefetch_end, acc);
          } else {
            tile_pass<1>(args, g0, rows, p, prefetch_end, acc);
          }
          store_pass(acc, np, p * kCols, g0, rows, n, rp, outp, stream);
        }
      }
    }
    if (stream) _mm_sfence();  // streaming stores are weakly ordered: land them before the join
    _tile_release();
  });
  return out;
}

#else  // no tiles in this build: the engine packs float32 panels instead

bool tiles_ready() { return false; }

at::Tensor tile_linear(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                       int64_t, const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "these kernels were built without the CPU's matrix tiles (AMX)");
}

#endif

}  // namespace metronome
