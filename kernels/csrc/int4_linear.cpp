// Weight-only int4 linear layer on the CPU: y = x . W^T + bias, W group-wise asymmetric int4 (like Q4_1).
//
// The weight comes packed by kernels/int4.py: one byte stream per strip of 16 output channels, a 320-byte
// block per group of 32 input features: 4 x 64 bytes of nibbles (bytes 4c + b of the j-th 64 hold k = 8j + b
// in the low and 8j + 4 + b in the high nibble for channel c), then d and m (16 fp16 each), w = d * q + m.
//
// The inputs stay fp32 (bf16 inputs are widened exactly). A thread owns whole strips: it decodes a strip once
// per call into fp32 weights w = fma(q, d, m) ([K][16] in a scratch that stays in L1/L2), then every row of
// the call runs against it, R rows (1-4) per register tile:
//   acc[k % 4] = fma(x[k], w[k], acc[k % 4])   (16 channels a lane each, k in order)
//   y = (acc[0] + acc[1]) + (acc[2] + acc[3]) (+ bias)
// (with AVX-512, calls of 1-4 rows decode in registers instead: the same w and the same fmas in the same order)
// so a row's result is the same sequence of fp32 operations whatever the number of rows in the call, the
// tile it lands in or the thread that runs the strip (batch invariance: one reduction order per row). Four
// accumulators a row keep four fma chains in flight. AVX-512 intrinsics where available, elsewhere the same
// operations as plain loops the compiler vectorises (std::fma: no contraction choices left to it).
// NOTE: int8 inputs per group of 32 (Q8_1's scheme) were tried first: a group holding one large activation
// rounds its small ones to a step of max|x| / 127, which moved SmolLM2 layers by 0.3-1% (1.7% a row) and changed
// greedy answers; fp32 inputs cost more arithmetic per weight but agree with dequantize-and-matmul to ~1e-6.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define INFER_INT4_AVX512 1
#endif

#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kStrip = 16;                          // output channels per strip
constexpr int64_t kGroup = 32;                          // input features per scale and minimum
constexpr int64_t kNibbleBytes = kStrip * kGroup / 2;   // 256
constexpr int64_t kBlockBytes = kNibbleBytes + 4 * kStrip;  // 320: nibbles, d, m
constexpr int64_t kTileRows = 4;                        // rows per register tile

struct Problem {
  int64_t M, N, K;         // K padded to a multiple of 32
  const uint8_t* packed;   // [N_pad / 16][K / 32][320]
  const float* x;          // [M][K] fp32 (zeros past the real features)
  const float* bias;       // [N] or null
  float* y;                // [M, N] fp32
};

inline float half_bits_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// y[m, n0 : n0 + width] = (a0 + a1) + (a2 + a3) (+ bias), for the channels that exist
inline void store_row(const Problem& P, int64_t m, int64_t n0, const float (*acc)[kStrip]) {
  const int64_t width = std::min(kStrip, P.N - n0);
  for (int64_t j = 0; j < width; ++j) {
    const float s = (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]);
    P.y[m * P.N + n0 + j] = P.bias ? s + P.bias[n0 + j] : s;
  }
}

#ifdef INFER_INT4_AVX512
// strip -> w [K][16] fp32: w = fma(q, d, m), the same values as the plain loop below
void decode_strip(const uint8_t* strip, int64_t groups, float* w) {
  const __m512i low4 = _mm512_set1_epi32(0x0F);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* block = strip + g * kBlockBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes + 32)));
    float* wg = w + g * kGroup * kStrip;
    for (int j = 0; j < 4; ++j) {
      const __m512i raw = _mm512_loadu_si512(block + 64 * j);  // lane c: channel c's 4 bytes
      for (int b = 0; b < 8; ++b) {  // b < 4: low nibble of byte b (k = 8j + b); else high of byte b - 4
        const int shift = b < 4 ? 8 * b : 8 * (b - 4) + 4;
        const __m512i q = _mm512_and_si512(_mm512_srli_epi32(raw, shift), low4);
        _mm512_storeu_ps(wg + (8 * j + b) * kStrip, _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, mn));
      }
    }
  }
}

template <int R>
void tile(const Problem& P, const float* w, int64_t m0, int64_t n0) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < 4; ++a) acc[r][a] = _mm512_setzero_ps();
  const float* x = P.x + m0 * P.K;
  for (int64_t k = 0; k < P.K; k += 4) {
    for (int a = 0; a < 4; ++a) {
      const __m512 wk = _mm512_loadu_ps(w + (k + a) * kStrip);
      for (int r = 0; r < R; ++r) acc[r][a] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * P.K + k + a]), wk, acc[r][a]);
    }
  }
  alignas(64) float out[4][kStrip];
  for (int r = 0; r < R; ++r) {
    for (int a = 0; a < 4; ++a) _mm512_store_ps(out[a], acc[r][a]);
    store_row(P, m0 + r, n0, out);
  }
}

// up to 4 rows: decode in registers, no scratch; the same w values and the same fmas per row in the same order
// as decode_strip + tile (so a row's result does not depend on which of the two ran it)
template <int R>
void tile_direct(const Problem& P, const uint8_t* strip, int64_t n0) {
  const __m512i low4 = _mm512_set1_epi32(0x0F);
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < 4; ++a) acc[r][a] = _mm512_setzero_ps();
  for (int64_t g = 0; g < P.K / kGroup; ++g) {
    const uint8_t* block = strip + g * kBlockBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes + 32)));
    for (int j = 0; j < 4; ++j) {
      const __m512i raw = _mm512_loadu_si512(block + 64 * j);
      for (int b = 0; b < 8; ++b) {
        const int shift = b < 4 ? 8 * b : 8 * (b - 4) + 4;
        const __m512 wk = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(raw, shift), low4)), d, mn);
        const int64_t k = g * kGroup + 8 * j + b;
        for (int r = 0; r < R; ++r) acc[r][b % 4] = _mm512_fmadd_ps(_mm512_set1_ps(P.x[r * P.K + k]), wk, acc[r][b % 4]);
      }
    }
  }
  alignas(64) float out[4][kStrip];
  for (int r = 0; r < R; ++r) {
    for (int a = 0; a < 4; ++a) _mm512_store_ps(out[a], acc[r][a]);
    store_row(P, r, n0, out);
  }
}
#else
void decode_strip(const uint8_t* strip, int64_t groups, float* w) {
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* block = strip + g * kBlockBytes;
    float d[kStrip], mn[kStrip];
    for (int64_t c = 0; c < kStrip; ++c) {
      d[c] = half_bits_to_float(block + kNibbleBytes + 2 * c);
      mn[c] = half_bits_to_float(block + kNibbleBytes + 32 + 2 * c);
    }
    float* wg = w + g * kGroup * kStrip;
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t b = 0; b < 4; ++b)
#pragma omp simd
        for (int64_t c = 0; c < kStrip; ++c) {
          const uint8_t byte = block[64 * j + 4 * c + b];
          wg[(8 * j + b) * kStrip + c] = std::fma(static_cast<float>(byte & 15), d[c], mn[c]);
          wg[(8 * j + 4 + b) * kStrip + c] = std::fma(static_cast<float>(byte >> 4), d[c], mn[c]);
        }
  }
}

template <int R>
void tile(const Problem& P, const float* w, int64_t m0, int64_t n0) {
  float acc[R][4][kStrip] = {};
  const float* x = P.x + m0 * P.K;
  for (int64_t k = 0; k < P.K; k += 4)
    for (int a = 0; a < 4; ++a)
      for (int r = 0; r < R; ++r) {
        const float xk = x[r * P.K + k + a];
        const float* wk = w + (k + a) * kStrip;
#pragma omp simd
        for (int64_t c = 0; c < kStrip; ++c) acc[r][a][c] = std::fma(xk, wk[c], acc[r][a][c]);
      }
  for (int r = 0; r < R; ++r) store_row(P, m0 + r, n0, acc[r]);
}
#endif

void strip_rows(const Problem& P, const uint8_t* strip, int64_t n0, std::vector<float>& w) {
#ifdef INFER_INT4_AVX512
  switch (P.M) {
    case 1: tile_direct<1>(P, strip, n0); return;
    case 2: tile_direct<2>(P, strip, n0); return;
    case 3: tile_direct<3>(P, strip, n0); return;
    case 4: tile_direct<4>(P, strip, n0); return;
    default: break;
  }
#endif
  decode_strip(strip, P.K / kGroup, w.data());
  for (int64_t m0 = 0; m0 < P.M; m0 += kTileRows) {
    switch (std::min(kTileRows, P.M - m0)) {
      case 4: tile<4>(P, w.data(), m0, n0); break;
      case 3: tile<3>(P, w.data(), m0, n0); break;
      case 2: tile<2>(P, w.data(), m0, n0); break;
      default: tile<1>(P, w.data(), m0, n0); break;
    }
  }
}

void run(const Problem& P) {
  const int64_t num_strips = (P.N + kStrip - 1) / kStrip, strip_bytes = (P.K / kGroup) * kBlockBytes;
  at::parallel_for(0, num_strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(P.K * kStrip);
    for (int64_t s = begin; s < end; ++s) strip_rows(P, P.packed + s * strip_bytes, s * kStrip, w);
  });
}

}  // namespace

// x: [M, K_in] fp32 or bf16; packed: [N_pad / 16, K / 32, 320] uint8 -> [M, N], x's dtype
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features) {
  TORCH_CHECK(x.dim() == 2, "int4_linear: x must be [M, K]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == kBlockBytes, "int4_linear: packed must be [N/16, K/32, 320] uint8");
  const int64_t K = packed.size(1) * kGroup, k_in = x.size(1);
  TORCH_CHECK(k_in <= K && K - k_in < kGroup, "int4_linear: x has ", k_in, " features, weight ", K);
  TORCH_CHECK(out_features > 0 && out_features <= packed.size(0) * kStrip && out_features > (packed.size(0) - 1) * kStrip,
              "int4_linear: out_features does not fit the packed strips");
  if (bias.has_value()) TORCH_CHECK(bias->numel() == out_features, "int4_linear: bias must be [out_features]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor bias_f;
  if (bias.has_value()) bias_f = bias->to(at::kFloat).contiguous();
  auto y = at::empty({x.size(0), out_features}, x.options().dtype(at::kFloat));
  const int64_t M = x.size(0);
  if (M > 0) {
    // NOTE: inputs short of the padded K get zero columns (the padding weights are finite: 0 * w adds nothing)
    const at::Tensor xp = k_in == K ? xf : at::constant_pad_nd(xf, {0, K - k_in}, 0.0);
    const Problem P{M, out_features, K, packed.const_data_ptr<uint8_t>(), xp.const_data_ptr<float>(),
                    bias.has_value() ? bias_f.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
    run(P);
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("int4_linear", &infer_cpu::int4_linear); }
