// Weight-only int6 linear layers on the CPU: y = x . W^T + bias, W symmetric 6-bit with GGUF Q6_K's two-level
// scales, at the file's 0.8203 bytes per weight.
//
// The weight comes packed by kernels/int6.py: one byte stream per strip of 16 output channels, a 3360-byte
// super-block per 256 input features: the 16 channels' d_super (fp16, 32 bytes), then per group of 16 inputs
// (Q6_K's sub-block) a 208-byte block: 2 x 64 bytes of nibbles (the low 4 bits; byte 4c + b of the j-th 64 holds
// k = 8j + b in its low and 8j + 4 + b in its high nibble for channel c), 64 bytes of top bits (byte 4c + b holds
// at bits 2q, 2q + 1 the top two bits of k = 4q + b), then the 16 d_sub (int8). A code q is 0..63 and
// w = (d_super * d_sub) * (q - 32), the scale an exact fp32 product, as gguf's dequantize computes it.
//
// Inputs are quantized per row and group of 16 to int16: s = max|x| / 32767, xq = round(x / s) (half to even),
// kernels/packed.py's `quantize_activations` at groups of 16. A group's contribution to channel c:
//   dot = sum_k xq_k * q_ck - 32 * sum_k xq_k  (int32; |dot| <= 16 * 32767 * 32 < 2^24, so exact in fp32)
//   acc = fma(s, d_c * dot, acc)               (groups in order; y = acc + bias)
// The codes are unpacked to bytes, 4 consecutive k a channel's lane (64 codes a 512-bit register, a shift, a mask
// and an or-with-mask each), and multiplied as bytes: xq = 256 xh + xl (xh = xq >> 8 signed, xl = xq & 255
// unsigned), sum q * xq = 256 sum q * xh + sum xl * q, each a vpdpbusd (unsigned by signed bytes, 64 products;
// the codes are both: 0..63); the -32 sum is the dot's starting value. Every sum is an exact integer, so the dot
// is the same whatever the instructions (vpmaddubsw + vpmaddwd without VNNI: pairs at most 2 * 255 * 63, no
// saturation). A thread owns whole strips; rows go through in register tiles of 1-8, each row the same sequence
// of operations whatever the tile, the thread or the number of rows (batch invariance). With AVX2 only, the same
// integers and fp32 epilogue come from two halves of 8 channels (tiles of 1-3 rows), elsewhere from plain loops.
// NOTE: an earlier version unpacked int16 pairs of k for vpdpwssd (4 operations per 32 weights, against int8g's
// one sign extension): it ran out of instructions at ~18-23 GB/s on one core where int8g streamed at 27.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define INFER_INT6_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFER_INT6_AVX2 1
#endif

#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kStrip = 16;                             // output channels per strip
constexpr int64_t kGroup = 16;                             // input features per scale (Q6_K's sub-block)
constexpr int64_t kSuper = 256;                            // input features per super-block
constexpr int64_t kGroups = kSuper / kGroup;               // 16 groups a super-block
constexpr int64_t kNibbleBytes = kStrip * kGroup / 2;      // 128
constexpr int64_t kHighBytes = kStrip * 4;                 // 64: the top bits, 4 codes' a byte
constexpr int64_t kBlockBytes = kNibbleBytes + kHighBytes + kStrip;  // 208: codes, then 16 int8 d_sub
constexpr int64_t kHeadBytes = kStrip * 2;                 // 32: 16 fp16 d_super
constexpr int64_t kSuperBytes = kHeadBytes + kGroups * kBlockBytes;  // 3360
constexpr int64_t kQuads = kGroup / 4;                     // 4 consecutive k a channel's 32-bit lane
constexpr int32_t kOffset = 32;                            // w = d * (q - 32)
#ifdef INFER_INT6_AVX2
constexpr int kTileRows = 3;  // rows per register tile (as int4's)
#else
constexpr int kTileRows = 8;
#endif
constexpr float kInt16Max = 32767.f;
constexpr int64_t kQuantizeGrain = 8;  // rows per task when quantizing in parallel

struct Problem {
  int64_t M, N, K;        // K a multiple of 256
  const uint8_t* packed;  // [N_pad / 16][K / 256][3360]
  const int32_t* xb;      // [M][K / 16][8]: per group the 4 quads of xh (4 int8 each), then the 4 of xl (uint8)
  const float* xs;        // [M][K / 16]: s
  const int32_t* xbias;   // [M][K / 16]: -32 * the group's sum of xq
  const float* bias;      // [N] or null
  float* y;               // [M, N] fp32
};

inline const uint8_t* head_of(const uint8_t* strip, int64_t g) { return strip + (g / kGroups) * kSuperBytes; }
inline const uint8_t* block_of(const uint8_t* strip, int64_t g) {
  return head_of(strip, g) + kHeadBytes + (g % kGroups) * kBlockBytes;
}

// channel c's scale of the group whose head and block are given: d_super * d_sub (exact in fp32)
inline float scale_at(const uint8_t* head, const uint8_t* block, int64_t c) {
  uint16_t bits;
  std::memcpy(&bits, head + 2 * c, sizeof bits);
  const int8_t sub = static_cast<int8_t>(block[kNibbleBytes + kHighBytes + c]);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits())) * static_cast<float>(sub);
}

// one row's inputs [K] fp32 -> per group of 16: its xh and xl quads, s and -32 * sum of xq
void quantize_row(const float* x, int64_t K, int32_t* xb, float* s, int32_t* xbias) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    float amax = 0.f;
    for (int64_t k = 0; k < kGroup; ++k) amax = std::max(amax, std::fabs(xg[k]));
    const float scale = amax / kInt16Max;
    int32_t q[kGroup];
    for (int64_t k = 0; k < kGroup; ++k) q[k] = scale > 0.f ? static_cast<int32_t>(std::nearbyint(xg[k] / scale)) : 0;
    int32_t total = 0;
    uint8_t bytes[2 * kGroup];  // xh of k 0..15, then xl of k 0..15: quad q is 4 bytes at 4q (xh) and 16 + 4q (xl)
    for (int64_t k = 0; k < kGroup; ++k) {
      total += q[k];
      bytes[k] = static_cast<uint8_t>(static_cast<int8_t>(q[k] >> 8)), bytes[kGroup + k] = static_cast<uint8_t>(q[k] & 255);
    }
    std::memcpy(xb + g * 2 * kQuads, bytes, sizeof bytes);
    s[g] = scale, xbias[g] = -kOffset * total;
  }
}

// y[m, n0 : n0 + width] = acc (+ bias), for the channels that exist
inline void store_row(const Problem& P, int64_t m, int64_t n0, const float* acc) {
  const int64_t width = std::min(kStrip, P.N - n0);
  for (int64_t j = 0; j < width; ++j) P.y[m * P.N + n0 + j] = P.bias ? acc[j] + P.bias[n0 + j] : acc[j];
}

#ifdef INFER_INT6_AVX512
// a group's codes as bytes: quad q (k 4q..4q+3) of channel c in lane c of codes[q]
inline void unpack(const uint8_t* block, __m512i* codes) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const __m512i n0 = _mm512_loadu_si512(block), n1 = _mm512_loadu_si512(block + 64);
  const __m512i t = _mm512_loadu_si512(block + kNibbleBytes);
  codes[0] = _mm512_or_si512(_mm512_and_si512(n0, low4), _mm512_and_si512(_mm512_slli_epi32(t, 4), top));
  codes[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(n0, 4), low4),
                             _mm512_and_si512(_mm512_slli_epi32(t, 2), top));
  codes[2] = _mm512_or_si512(_mm512_and_si512(n1, low4), _mm512_and_si512(t, top));
  codes[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(n1, 4), low4),
                             _mm512_and_si512(_mm512_srli_epi32(t, 2), top));
}

template <int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *head = head_of(strip, g), *block = block_of(strip, g);
    __m512i codes[kQuads];
    unpack(block, codes);
    const __m512 sup = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(head)));
    const __m128i sub = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kNibbleBytes + kHighBytes));
    const __m512 d = _mm512_mul_ps(sup, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sub)));
    for (int r = 0; r < R; ++r) {
      const int64_t i = (m0 + r) * groups + g;
      const int32_t* xb = P.xb + i * 2 * kQuads;
      __m512i hi = _mm512_setzero_si512(), lo = _mm512_set1_epi32(P.xbias[i]);
      for (int q = 0; q < kQuads; ++q) {
        hi = dot_bytes(hi, codes[q], _mm512_set1_epi32(xb[q]));           // codes (unsigned) by xh (signed)
        lo = dot_bytes(lo, _mm512_set1_epi32(xb[kQuads + q]), codes[q]);  // xl (unsigned) by codes (0..63)
      }
      const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(P.xs[i]), _mm512_mul_ps(d, _mm512_cvtepi32_ps(dot)), acc[r]);
    }
  }
  alignas(64) float out[kStrip];
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(out, acc[r]);
    store_row(P, m0 + r, n0, out);
  }
}
#elif defined(INFER_INT6_AVX2)
inline __m256i dot_bytes(__m256i acc, __m256i a, __m256i b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}

// channels 8h..8h+7 of a group's codes as bytes (the AVX-512 unpack on 32-byte halves)
inline void unpack(const uint8_t* block, int h, __m256i* codes) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  const __m256i n0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * h));
  const __m256i n1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 + 32 * h));
  const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes + 32 * h));
  codes[0] = _mm256_or_si256(_mm256_and_si256(n0, low4), _mm256_and_si256(_mm256_slli_epi32(t, 4), top));
  codes[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(n0, 4), low4),
                             _mm256_and_si256(_mm256_slli_epi32(t, 2), top));
  codes[2] = _mm256_or_si256(_mm256_and_si256(n1, low4), _mm256_and_si256(t, top));
  codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(n1, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi32(t, 2), top));
}

// the AVX-512 tile's operations on two halves of 8 channels
template <int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup;
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *head = head_of(strip, g), *block = block_of(strip, g);
    for (int h = 0; h < 2; ++h) {
      __m256i codes[kQuads];
      unpack(block, h, codes);
      const __m256 sup = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(head + 16 * h)));
      const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kNibbleBytes + kHighBytes + 8 * h));
      const __m256 d = _mm256_mul_ps(sup, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sub)));
      for (int r = 0; r < R; ++r) {
        const int64_t i = (m0 + r) * groups + g;
        const int32_t* xb = P.xb + i * 2 * kQuads;
        __m256i hi = _mm256_setzero_si256(), lo = _mm256_set1_epi32(P.xbias[i]);
        for (int q = 0; q < kQuads; ++q) {
          hi = dot_bytes(hi, codes[q], _mm256_set1_epi32(xb[q]));
          lo = dot_bytes(lo, _mm256_set1_epi32(xb[kQuads + q]), codes[q]);
        }
        const __m256i dot = _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo);
        acc[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(P.xs[i]), _mm256_mul_ps(d, _mm256_cvtepi32_ps(dot)), acc[r][h]);
      }
    }
  }
  alignas(32) float out[kStrip];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out, acc[r][0]);
    _mm256_store_ps(out + 8, acc[r][1]);
    store_row(P, m0 + r, n0, out);
  }
}
#else
template <int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup;
  float acc[R][kStrip] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *head = head_of(strip, g), *block = block_of(strip, g);
    for (int64_t c = 0; c < kStrip; ++c) {
      int32_t code[kGroup];  // k = 4 quad + b
      for (int quad = 0; quad < kQuads; ++quad)
        for (int b = 0; b < 4; ++b) {
          const uint8_t nib = block[64 * (quad / 2) + 4 * c + b], top = block[kNibbleBytes + 4 * c + b];
          code[4 * quad + b] = ((nib >> (4 * (quad % 2))) & 15) | (((top >> (2 * quad)) & 3) << 4);
        }
      const float d = scale_at(head, block, c);
      for (int r = 0; r < R; ++r) {
        const int64_t i = (m0 + r) * groups + g;
        const uint8_t* xb = reinterpret_cast<const uint8_t*>(P.xb + i * 2 * kQuads);
        int32_t dot = P.xbias[i];
        for (int64_t k = 0; k < kGroup; ++k)
          dot += code[k] * (static_cast<int8_t>(xb[k]) * 256 + static_cast<int32_t>(xb[kGroup + k]));
        acc[r][c] = std::fma(P.xs[i], d * static_cast<float>(dot), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) store_row(P, m0 + r, n0, acc[r]);
}
#endif

void strip_rows(const Problem& P, const uint8_t* strip, int64_t n0) {
  for (int64_t m0 = 0; m0 < P.M; m0 += kTileRows) {
    switch (std::min<int64_t>(kTileRows, P.M - m0)) {
#ifndef INFER_INT6_AVX2
      case 8: tile<8>(P, strip, m0, n0); break;
      case 7: tile<7>(P, strip, m0, n0); break;
      case 6: tile<6>(P, strip, m0, n0); break;
      case 5: tile<5>(P, strip, m0, n0); break;
      case 4: tile<4>(P, strip, m0, n0); break;
#endif
      case 3: tile<3>(P, strip, m0, n0); break;
      case 2: tile<2>(P, strip, m0, n0); break;
      default: tile<1>(P, strip, m0, n0); break;
    }
  }
}

}  // namespace

// x: [M, K] fp32 or bf16; packed: [N_pad / 16, K / 256, 3360] uint8 (kernels/int6.py) -> [M, N], x's dtype
at::Tensor int6_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features) {
  TORCH_CHECK(x.dim() == 2, "int6_linear: x must be [M, K]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(2) == kSuperBytes,
              "int6_linear: packed must be [N/16, K/256, ", kSuperBytes, "] uint8");
  const int64_t K = packed.size(1) * kSuper;
  TORCH_CHECK(x.size(1) == K, "int6_linear: x has ", x.size(1), " features, weight ", K);
  TORCH_CHECK(out_features > 0 && out_features <= packed.size(0) * kStrip && out_features > (packed.size(0) - 1) * kStrip,
              "int6_linear: out_features does not fit the packed strips");
  if (bias.has_value()) TORCH_CHECK(bias->numel() == out_features, "int6_linear: bias must be [out_features]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor bias_f;
  if (bias.has_value()) bias_f = bias->to(at::kFloat).contiguous();
  auto y = at::empty({x.size(0), out_features}, x.options().dtype(at::kFloat));
  const int64_t M = x.size(0), groups = K / kGroup;
  if (M > 0) {
    // the quantized inputs: buffers of the calling thread, reused (no allocation per call on the decode path)
    thread_local std::vector<int32_t> xb, xbias;
    thread_local std::vector<float> xs;
    xb.resize(M * groups * 2 * kQuads), xs.resize(M * groups), xbias.resize(M * groups);
    const float* x_data = xf.const_data_ptr<float>();
    int32_t *xb_data = xb.data(), *xbias_data = xbias.data();
    float* xs_data = xs.data();
    const auto quantize = [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m)
        quantize_row(x_data + m * K, K, xb_data + m * groups * 2 * kQuads, xs_data + m * groups, xbias_data + m * groups);
    };
    if (M >= 2 * kQuantizeGrain) at::parallel_for(0, M, kQuantizeGrain, quantize);
    else quantize(0, M);
    const Problem P{M, out_features, K, packed.const_data_ptr<uint8_t>(), xb_data, xs_data, xbias_data,
                    bias.has_value() ? bias_f.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
    const int64_t num_strips = packed.size(0), strip_bytes = packed.size(1) * kSuperBytes;
    at::parallel_for(0, num_strips, 1, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) strip_rows(P, P.packed + s * strip_bytes, s * kStrip);
    });
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("int6_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("int6_linear", &infer_cpu::int6_linear); }
