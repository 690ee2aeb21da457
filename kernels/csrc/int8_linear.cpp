// Weight-only int8 linear layer on the CPU: y = x . (scale * q)^T + bias.
//
// q is int8 with one scale per output channel, packed by kernels/int8.py as
// [N / 16][K / 2][16][2]: strips of 16 output channels, k in pairs, so one
// 32-byte load is 16 channels x 2 k. A thread owns whole strips:
// - with AVX-512 BF16 (chosen at build time, -march=native): weights become
//   bf16 (exact for int8), activations are rounded to bf16, and
//   vdpbf16ps accumulates pairs in fp32. Up to 8 rows (one register tile),
//   each 32-byte load is converted in registers and used by every row; with
//   more rows a strip is first expanded into a bf16 scratch (L1) shared by
//   all row tiles.
// - elsewhere: the strip is expanded to fp32 [K][16] and rows accumulate in
//   fp32 (plain loops, vectorised by the compiler).
// Both are batch invariant: a row's sums run in one order whatever the number
// of rows in the call (tests/unit/kernels/test_batch_invariance.py).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define INFER_INT8_BF16 1
#endif

#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kStrip = 16;   // output channels per strip
constexpr int64_t kMaxRows = 8;  // rows per register tile
constexpr int kChains = 2;       // accumulators per (row, channel)

struct Problem {
  int64_t M, N, K;          // K even (the packer pads)
  const int8_t* packed;     // [N_pad / 16][K / 2][16][2]
  const float* scale;       // [N_pad]
  const float* bias;        // [N] or null
  float* y;                 // [M, N] fp32
};

// y[m, n0 : n0 + width] = acc * scale (+ bias), for the channels that exist
inline void store_row(const Problem& P, int64_t m, int64_t n0, const float* acc) {
  const int64_t width = std::min(kStrip, P.N - n0);
  for (int64_t j = 0; j < width; ++j) {
    P.y[m * P.N + n0 + j] = acc[j] * P.scale[n0 + j] + (P.bias ? P.bias[n0 + j] : 0.f);
  }
}

#ifdef INFER_INT8_BF16
// 32 int8 (16 channels x 2 k) -> 32 bf16 in the same order
inline __m512bh int8x32_to_bf16(const int8_t* src) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// R rows of x (bf16 pairs, [rows][K / 2] uint32) against S strips side by side (S > 1: one row only).
// Every (row, channel) sums its k pairs in kChains accumulators taken round-robin, the last odd pairs in
// the first, then adds them in order: the same order for any R and S, so a row's result never depends on
// how many rows share the call (batch invariance). Latency: one chain of dependent vdpbf16ps ran at a
// third of the memory bandwidth at batch 1; one row therefore walks two strips at once (4 chains).
template <int R, int S, bool kScratch>
void tile_bf16(const Problem& P, const void* strip, const uint32_t* xb, int64_t m0, int64_t n0) {
  static_assert(S == 1 || (R == 1 && !kScratch), "several strips side by side: one row, no scratch");
  __m512 acc[S][kChains][R];
  for (int s = 0; s < S; ++s)
    for (int u = 0; u < kChains; ++u)
      for (int r = 0; r < R; ++r) acc[s][u][r] = _mm512_setzero_ps();
  const int64_t pairs = P.K / 2, strip_bytes = P.K * kStrip;
  auto step = [&](int u, int64_t kp) {
    __m512bh w[S];
    for (int s = 0; s < S; ++s) {
      w[s] = kScratch ? reinterpret_cast<const __m512bh*>(strip)[kp]
                      : int8x32_to_bf16(static_cast<const int8_t*>(strip) + s * strip_bytes + kp * 32);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_set1_epi32(static_cast<int>(xb[(m0 + r) * pairs + kp]));
      for (int s = 0; s < S; ++s) {
        acc[s][u][r] = _mm512_dpbf16_ps(acc[s][u][r], reinterpret_cast<const __m512bh&>(x), w[s]);
      }
    }
  };
  int64_t kp = 0;
  for (; kp + kChains <= pairs; kp += kChains) {
    for (int u = 0; u < kChains; ++u) step(u, kp + u);
  }
  for (; kp < pairs; ++kp) step(0, kp);
  alignas(64) float out[kStrip];
  for (int s = 0; s < S; ++s) {
    for (int r = 0; r < R; ++r) {
      __m512 sum = acc[s][0][r];
      for (int u = 1; u < kChains; ++u) sum = _mm512_add_ps(sum, acc[s][u][r]);
      _mm512_store_ps(out, sum);
      store_row(P, m0 + r, n0 + s * kStrip, out);
    }
  }
}

template <bool kScratch>
void rows_bf16(const Problem& P, const void* strip, const uint32_t* xb, int64_t n0) {
  for (int64_t m0 = 0; m0 < P.M; m0 += kMaxRows) {
    switch (std::min(kMaxRows, P.M - m0)) {
      case 8: tile_bf16<8, 1, kScratch>(P, strip, xb, m0, n0); break;
      case 7: tile_bf16<7, 1, kScratch>(P, strip, xb, m0, n0); break;
      case 6: tile_bf16<6, 1, kScratch>(P, strip, xb, m0, n0); break;
      case 5: tile_bf16<5, 1, kScratch>(P, strip, xb, m0, n0); break;
      case 4: tile_bf16<4, 1, kScratch>(P, strip, xb, m0, n0); break;
      case 3: tile_bf16<3, 1, kScratch>(P, strip, xb, m0, n0); break;
      case 2: tile_bf16<2, 1, kScratch>(P, strip, xb, m0, n0); break;
      default: tile_bf16<1, 1, kScratch>(P, strip, xb, m0, n0); break;
    }
  }
}

// x -> bf16 pairs (round to nearest even), [M][K / 2] uint32, row by row
// NOTE: each row vectorised alike (its tail in scalar code): over the flat [M * K] the vector/scalar
// split fell at a place that moved with M, and the two round a subnormal differently
std::vector<uint32_t> to_bf16_pairs(const Problem& P, const float* x) {
  std::vector<uint32_t> xb(P.M * P.K / 2);
  auto* bits = reinterpret_cast<uint16_t*>(xb.data());
  const int64_t vec_end = P.K / 16 * 16;
  for (int64_t m = 0; m < P.M; ++m) {
    const float* row = x + m * P.K;
    uint16_t* out = bits + m * P.K;
    for (int64_t k = 0; k < vec_end; k += 16) {
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(row + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), reinterpret_cast<const __m256i&>(h));
    }
    for (int64_t k = vec_end; k < P.K; ++k) out[k] = c10::BFloat16(row[k]).x;
  }
  return xb;
}

void run_bf16(const Problem& P, const float* x) {
  const std::vector<uint32_t> xb = to_bf16_pairs(P, x);
  const int64_t num_strips = (P.N + kStrip - 1) / kStrip, strip_bytes = P.K * kStrip;
  at::parallel_for(0, num_strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<__m512bh> scratch(P.K / 2);
    for (int64_t s = begin; s < end; ++s) {
      const int8_t* strip = P.packed + s * strip_bytes;
      if (P.M > kMaxRows) {  // several row tiles: expand the strip once for all of them
        for (int64_t kp = 0; kp < P.K / 2; ++kp) scratch[kp] = int8x32_to_bf16(strip + kp * 32);
        rows_bf16<true>(P, scratch.data(), xb.data(), s * kStrip);
      } else if (P.M == 1 && s + 1 < end) {  // one row: two strips at once
        tile_bf16<1, 2, false>(P, strip, xb.data(), 0, s * kStrip);
        ++s;
      } else {
        rows_bf16<false>(P, strip, xb.data(), s * kStrip);
      }
    }
  });
}
#endif

// fp32 fallback: expand a strip to [K][16] fp32, then R rows at a time
template <int R>
void tile_fp32(const Problem& P, const float* w, const float* x, int64_t m0, int64_t n0) {
  float acc[R][kStrip] = {};
  for (int64_t k = 0; k < P.K; ++k) {
    for (int r = 0; r < R; ++r) {
      const float xv = x[(m0 + r) * P.K + k];
#pragma omp simd
      for (int64_t j = 0; j < kStrip; ++j) acc[r][j] += xv * w[k * kStrip + j];
    }
  }
  for (int r = 0; r < R; ++r) store_row(P, m0 + r, n0, acc[r]);
}

void run_fp32(const Problem& P, const float* x) {
  const int64_t num_strips = (P.N + kStrip - 1) / kStrip, strip_bytes = P.K * kStrip;
  at::parallel_for(0, num_strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(P.K * kStrip);
    for (int64_t s = begin; s < end; ++s) {
      const int8_t* strip = P.packed + s * strip_bytes;  // [K / 2][16][2]
      for (int64_t kp = 0; kp < P.K / 2; ++kp) {
        for (int64_t j = 0; j < kStrip; ++j) {
          w[(2 * kp) * kStrip + j] = strip[(kp * kStrip + j) * 2];
          w[(2 * kp + 1) * kStrip + j] = strip[(kp * kStrip + j) * 2 + 1];
        }
      }
      int64_t m0 = 0;
      for (; m0 + 4 <= P.M; m0 += 4) tile_fp32<4>(P, w.data(), x, m0, s * kStrip);
      for (; m0 < P.M; ++m0) tile_fp32<1>(P, w.data(), x, m0, s * kStrip);
    }
  });
}

}  // namespace

bool int8_linear_uses_bf16() {
#ifdef INFER_INT8_BF16
  return true;
#else
  return false;
#endif
}

// x: [M, K] fp32 or bf16; packed: [N_pad / 16, K_pad / 2, 16, 2] int8; scale: [N_pad] fp32 -> [M, N], x's dtype
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t out_features) {
  TORCH_CHECK(x.dim() == 2, "int8_linear: x must be [M, K]");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 4 && packed.is_contiguous() &&
                  packed.size(2) == kStrip && packed.size(3) == 2, "int8_linear: packed must be [N/16, K/2, 16, 2] int8");
  const int64_t K = packed.size(1) * 2;
  TORCH_CHECK(x.size(1) <= K && K - x.size(1) <= 1, "int8_linear: x has ", x.size(1), " features, weight ", K);
  TORCH_CHECK(out_features <= packed.size(0) * kStrip, "int8_linear: out_features exceeds the packed rows");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == packed.size(0) * kStrip,
              "int8_linear: scale must be [N_pad] fp32");
  at::Tensor xf = x.to(at::kFloat);
  if (xf.size(1) != K) xf = at::constant_pad_nd(xf, {0, K - xf.size(1)});  // an odd K, padded by the packer
  xf = xf.contiguous();
  at::Tensor bias_f;
  if (bias.has_value()) bias_f = bias->to(at::kFloat).contiguous();
  auto y = at::empty({x.size(0), out_features}, x.options().dtype(at::kFloat));
  const Problem P{x.size(0), out_features, K, packed.const_data_ptr<int8_t>(), scale.const_data_ptr<float>(),
                  bias.has_value() ? bias_f.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
  if (P.M > 0) {
#ifdef INFER_INT8_BF16
    run_bf16(P, xf.const_data_ptr<float>());
#else
    run_fp32(P, xf.const_data_ptr<float>());
#endif
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor packed, Tensor scale, Tensor? bias, int out_features) -> Tensor");
  m.def("int8_linear_uses_bf16() -> bool", &infer_cpu::int8_linear_uses_bf16);
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("int8_linear", &infer_cpu::int8_linear); }
