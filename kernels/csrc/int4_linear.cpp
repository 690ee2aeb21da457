// Weight-only int4 linear layer on the CPU: y = x . W^T + bias, W group-wise asymmetric int4 (like Q4_1).
//
// The weight comes packed by kernels/int4.py: one byte stream per strip of 16 output channels, a 320-byte
// block per group of 32 input features: 4 x 64 bytes of nibbles (bytes 4c + b of the j-th 64 hold k = 8j + b
// in the low and 8j + 4 + b in the high nibble for channel c), then d and m (16 fp16 each), w = d * q + m.
//
// Each input row is first quantized per group of 32 to int8 (dx = max|x| / 127, qx = round(x / dx), nearest
// even; sx = dx * sum(qx)), as llama.cpp's Q8_1. Then per strip, group by group:
//   acc_int = sum_k q * qx                    (int32, exact: any order gives the same integer)
//   yq     += float(acc_int) * (d * dx)       (fp32 fma, groups in order)
//   ym     += m * sx                          (fp32 fma, groups in order; two chains: half the latency)
// and y = yq + ym (+ bias), so a row's result depends on that row alone, never on how many rows share the call or which thread runs
// a strip (batch invariance: one reduction order per row). With AVX-512 VNNI the int32 dot products are
// vpdpbusd (the nibbles are the unsigned operand); elsewhere plain loops the compiler vectorises. A thread
// owns whole strips and reads each once per call (all row tiles of a strip run while it is in L1): at 1-8
// rows the call streams the packed weights once, at memory speed.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define INFER_INT4_VNNI 1
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
  const int8_t* xq;        // [M][K] quantized inputs
  const float* dx;         // [M][K / 32] their scales
  const float* sx;         // [M][K / 32] dx * sum(qx)
  const float* bias;       // [N] or null
  float* y;                // [M, N] fp32
};

#ifdef INFER_INT4_VNNI
// one group of 32 (n of them real, the rest zeros): the same values as the plain loop below, 32 lanes at once
inline void quantize_group(const float* x, int64_t n, int8_t* q, float* dx, float* sx) {
  const __mmask16 m0 = n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
  const __mmask16 m1 = n >= 32 ? 0xFFFF : n <= 16 ? 0 : static_cast<__mmask16>((1u << (n - 16)) - 1);
  const __m512 a = _mm512_maskz_loadu_ps(m0, x), b = _mm512_maskz_loadu_ps(m1, x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *dx = amax / 127.f;
  *sx = *dx * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
}
#endif

// x [M, K_in] fp32 -> qx [M, K] int8, dx and sx [M, K / 32]; features past K_in are zeros
void quantize_rows(const float* x, int64_t M, int64_t k_in, int64_t K, int8_t* qx, float* dx, float* sx) {
  const int64_t groups = K / kGroup;
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    float buf[kGroup];
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t k0 = g * kGroup, n = std::min(kGroup, k_in - k0);
#ifdef INFER_INT4_VNNI
        quantize_group(x + m * k_in + k0, n, qx + m * K + k0, dx + m * groups + g, sx + m * groups + g);
        continue;
#endif
        for (int64_t i = 0; i < kGroup; ++i) buf[i] = i < n ? x[m * k_in + k0 + i] : 0.f;
        float amax = 0.f;
        for (int64_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(buf[i]));
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int64_t i = 0; i < kGroup; ++i) {
          const int8_t q = static_cast<int8_t>(std::nearbyint(buf[i] * inv));
          qx[m * K + k0 + i] = q;
          sum += q;
        }
        dx[m * groups + g] = amax / 127.f;
        sx[m * groups + g] = dx[m * groups + g] * static_cast<float>(sum);
      }
    }
  });
}

inline float half_bits_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// y[m, n0 : n0 + width] = yq + ym (+ bias), for the channels that exist
inline void store_row(const Problem& P, int64_t m, int64_t n0, const float* yq, const float* ym) {
  const int64_t width = std::min(kStrip, P.N - n0);
  for (int64_t j = 0; j < width; ++j) P.y[m * P.N + n0 + j] = yq[j] + ym[j] + (P.bias ? P.bias[n0 + j] : 0.f);
}

#ifdef INFER_INT4_VNNI
inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// R rows of qx against one strip; the low and high nibbles accumulate apart (two short int32 chains)
template <int R>
void tile_vnni(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R], acc_m[R];
  for (int r = 0; r < R; ++r) acc[r] = acc_m[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* block = strip + g * kBlockBytes;
    __m512i lo_sum[R], hi_sum[R];
    for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      const __m512i raw = _mm512_loadu_si512(block + 64 * j);
      const __m512i lo = _mm512_and_si512(raw, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = P.xq + (m0 + r) * P.K + g * kGroup + 8 * j;
        lo_sum[r] = _mm512_dpbusd_epi32(lo_sum[r], lo, _mm512_set1_epi32(load_i32(xr)));
        hi_sum[r] = _mm512_dpbusd_epi32(hi_sum[r], hi, _mm512_set1_epi32(load_i32(xr + 4)));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes + 32)));
    for (int r = 0; r < R; ++r) {
      const int64_t mg = (m0 + r) * groups + g;
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo_sum[r], hi_sum[r]));
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(P.dx[mg])), acc[r]);
      acc_m[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(P.sx[mg]), acc_m[r]);
    }
  }
  alignas(64) float yq[kStrip], ym[kStrip];
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(yq, acc[r]);
    _mm512_store_ps(ym, acc_m[r]);
    store_row(P, m0 + r, n0, yq, ym);
  }
}

void strip_rows(const Problem& P, const uint8_t* strip, int64_t n0, std::vector<uint8_t>&) {
  for (int64_t m0 = 0; m0 < P.M; m0 += kTileRows) {
    switch (std::min(kTileRows, P.M - m0)) {
      case 4: tile_vnni<4>(P, strip, m0, n0); break;
      case 3: tile_vnni<3>(P, strip, m0, n0); break;
      case 2: tile_vnni<2>(P, strip, m0, n0); break;
      default: tile_vnni<1>(P, strip, m0, n0); break;
    }
  }
}
#else
// plain: unpack the strip's codes to [group][channel][32] bytes once, then each row on its own
void strip_rows(const Problem& P, const uint8_t* strip, int64_t n0, std::vector<uint8_t>& codes) {
  const int64_t groups = P.K / kGroup;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* block = strip + g * kBlockBytes;
    uint8_t* out = codes.data() + g * kStrip * kGroup;
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t c = 0; c < kStrip; ++c)
        for (int64_t b = 0; b < 4; ++b) {
          const uint8_t byte = block[64 * j + 4 * c + b];
          out[c * kGroup + 8 * j + b] = byte & 15;
          out[c * kGroup + 8 * j + 4 + b] = byte >> 4;
        }
  }
  for (int64_t m = 0; m < P.M; ++m) {
    float acc[kStrip] = {}, acc_m[kStrip] = {};
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = strip + g * kBlockBytes;
      const int8_t* xr = P.xq + m * P.K + g * kGroup;
      const float dx = P.dx[m * groups + g], sx = P.sx[m * groups + g];
      for (int64_t c = 0; c < kStrip; ++c) {
        const uint8_t* q = codes.data() + (g * kStrip + c) * kGroup;
        int32_t dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t k = 0; k < kGroup; ++k) dot += static_cast<int32_t>(q[k]) * xr[k];
        const float d = half_bits_to_float(block + kNibbleBytes + 2 * c);
        const float mn = half_bits_to_float(block + kNibbleBytes + 32 + 2 * c);
        acc[c] = std::fma(static_cast<float>(dot), d * dx, acc[c]);  // NOTE: the same fmas as the VNNI path
        acc_m[c] = std::fma(mn, sx, acc_m[c]);
      }
    }
    store_row(P, m, n0, acc, acc_m);
  }
}
#endif

void run(const Problem& P) {
  const int64_t num_strips = (P.N + kStrip - 1) / kStrip, strip_bytes = (P.K / kGroup) * kBlockBytes;
  at::parallel_for(0, num_strips, 1, [&](int64_t begin, int64_t end) {
#ifdef INFER_INT4_VNNI
    std::vector<uint8_t> codes;
#else
    std::vector<uint8_t> codes(P.K * kStrip);
#endif
    for (int64_t s = begin; s < end; ++s) strip_rows(P, P.packed + s * strip_bytes, s * kStrip, codes);
  });
}

}  // namespace

bool int4_linear_uses_vnni() {
#ifdef INFER_INT4_VNNI
  return true;
#else
  return false;
#endif
}

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
  const int64_t M = x.size(0), groups = K / kGroup;
  if (M > 0) {
    std::vector<int8_t> xq(M * K);
    std::vector<float> dx(M * groups), sx(M * groups);
    quantize_rows(xf.const_data_ptr<float>(), M, k_in, K, xq.data(), dx.data(), sx.data());
    const Problem P{M, out_features, K, packed.const_data_ptr<uint8_t>(), xq.data(), dx.data(), sx.data(),
                    bias.has_value() ? bias_f.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
    run(P);
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("int4_linear_uses_vnni() -> bool", &infer_cpu::int4_linear_uses_vnni);
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("int4_linear", &infer_cpu::int4_linear); }
