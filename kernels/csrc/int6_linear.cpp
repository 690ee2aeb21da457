// Weight-only int6 linear layers on the CPU: y = x . W^T + bias, W symmetric 6-bit with GGUF Q6_K's two-level
// scales, at the file's 0.8203 bytes per weight.
//
// The weight comes packed by kernels/int6.py: one byte stream per strip of 16 output channels, a 3360-byte
// super-block per 256 input features: the 16 channels' d_super (fp16, 32 bytes), then per group of 16 inputs
// (Q6_K's sub-block) a 208-byte block: 2 x 64 bytes of nibbles (bytes 4c + b of the j-th 64 hold k = 8j + b in
// the low and 8j + 4 + b in the high nibble for channel c, as int4's), 64 bytes of high bits (channel c's 32-bit
// lane holds at bits 2i, 2i + 1 (i = 4j + p, 0..7) the two high bits of the k whose nibble `(raw_j >> 4p) &
// 0x000F000F` puts in the lane's low word, and at bits 16 + 2i, 17 + 2i those of its high word's k: one shift by
// 2i - 4 and a mask move both to bits 4-5 of their word), then the 16 d_sub (int8). A code q is 0..63 and
// w = (d_super * d_sub) * (q - 32), the scale an exact fp32 product, as gguf's dequantize computes it.
//
// Inputs are quantized per row and group of 16 to int16: s = max|x| / 32767, xq = round(x / s) (half to even),
// kernels/packed.py's `quantize_activations` at groups of 16. A group's contribution to channel c:
//   dot = sum_k xq_k * q_ck - 32 * sum_k xq_k  (int32; |dot| <= 16 * 32767 * 32 < 2^24, so exact in fp32)
//   acc = fma(s, d_c * dot, acc)               (groups in order; y = acc + bias)
// The -32 sum is the dot's starting value (one integer a row and group, from the quantizing pass). The integer
// dot runs 32 products per instruction (vpdpwssd, or vpmaddwd + add) on codes unpacked with two shifts, two masks
// and an or a pair of k, no conversion to float per weight. A thread owns whole strips; rows go through in
// register tiles of 1-8, each row the same sequence of operations whatever the tile, the thread or the number
// of rows (batch invariance). With AVX2 only the same integers and fp32 epilogue come from two halves of 8
// channels (tiles of 1-3 rows), elsewhere from plain loops.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <utility>
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
constexpr int64_t kHighBytes = kStrip * 4;                 // 64: a 32-bit lane of high bits a channel
constexpr int64_t kBlockBytes = kNibbleBytes + kHighBytes + kStrip;  // 208: codes, then 16 int8 d_sub
constexpr int64_t kHeadBytes = kStrip * 2;                 // 32: 16 fp16 d_super
constexpr int64_t kSuperBytes = kHeadBytes + kGroups * kBlockBytes;  // 3360
constexpr int64_t kPairs = kGroup / 2;                     // int16 input pairs per group
constexpr int32_t kOffset = 32;                            // w = d * (q - 32)
#ifdef INFER_INT6_AVX2
constexpr int kTileRows = 3;  // rows per register tile: 6 int32 sums of 8 channels, 16 ymm registers in all
#else
constexpr int kTileRows = 8;
#endif
constexpr float kInt16Max = 32767.f;
constexpr int64_t kQuantizeGrain = 8;  // rows per task when quantizing in parallel

// the k of each pair's low and high int16 within 8: pair 4j + p holds k 8j + kPairLow[p] and 8j + kPairHigh[p]
constexpr int kPairLow[4] = {0, 4, 1, 5}, kPairHigh[4] = {2, 6, 3, 7};

struct Problem {
  int64_t M, N, K;        // K a multiple of 256
  const uint8_t* packed;  // [N_pad / 16][K / 256][3360]
  const int32_t* xq;      // [M][K / 2]: int16 pairs, per group in kPairLow/kPairHigh order
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

// one row's inputs [K] fp32 -> pairs [K / 2], s and -32 * sum per group of 16
void quantize_row(const float* x, int64_t K, int32_t* pairs, float* s, int32_t* xbias) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    float amax = 0.f;
    for (int64_t k = 0; k < kGroup; ++k) amax = std::max(amax, std::fabs(xg[k]));
    const float scale = amax / kInt16Max;
    int32_t q[kGroup];
    for (int64_t k = 0; k < kGroup; ++k) q[k] = scale > 0.f ? static_cast<int32_t>(std::nearbyint(xg[k] / scale)) : 0;
    int32_t total = 0;
    for (int64_t k = 0; k < kGroup; ++k) total += q[k];
    for (int j = 0; j < 2; ++j)
      for (int p = 0; p < 4; ++p) {
        const uint32_t lo = static_cast<uint16_t>(q[8 * j + kPairLow[p]]);
        const uint32_t hi = static_cast<uint16_t>(q[8 * j + kPairHigh[p]]);
        pairs[g * kPairs + 4 * j + p] = static_cast<int32_t>(lo | (hi << 16));
      }
    s[g] = scale, xbias[g] = -kOffset * total;
  }
}

// f(j, p) for the 8 pairs of a group's codes, j and p compile-time constants
template <typename F, int... I>
inline void for_pairs_of(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I / 4>{}, std::integral_constant<int, I % 4>{}), ...);
}
template <typename F>
inline void for_pairs(F& f) {
  for_pairs_of(f, std::make_integer_sequence<int, kPairs>{});
}

// y[m, n0 : n0 + width] = acc (+ bias), for the channels that exist
inline void store_row(const Problem& P, int64_t m, int64_t n0, const float* acc) {
  const int64_t width = std::min(kStrip, P.N - n0);
  for (int64_t j = 0; j < width; ++j) P.y[m * P.N + n0 + j] = P.bias ? acc[j] + P.bias[n0 + j] : acc[j];
}

#ifdef INFER_INT6_AVX512
inline __m512i dot_pairs(__m512i acc, __m512i w, __m512i x) {
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}

// a lane's high bits of pair i (bits 2i, 2i + 1 and 16 + 2i, 17 + 2i) at bits 4-5 of its low and high words
template <int I>
inline __m512i high_bits(__m512i high) {
  const __m512i at4 = _mm512_set1_epi32(0x00300030);
  if constexpr (2 * I >= 4) return _mm512_and_si512(_mm512_srli_epi32(high, 2 * I - 4), at4);
  else return _mm512_and_si512(_mm512_slli_epi32(high, 4 - 2 * I), at4);
}

template <int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup, row_pairs = P.K / 2;
  const __m512i low4 = _mm512_set1_epi32(0x000F000F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int32_t* xq = P.xq + m0 * row_pairs;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *head = head_of(strip, g), *block = block_of(strip, g);
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_set1_epi32(P.xbias[(m0 + r) * groups + g]);
    const __m512i high = _mm512_loadu_si512(block + kNibbleBytes);
    const auto pairs = [&](auto jc, auto pc) {
      constexpr int j = decltype(jc)::value, p = decltype(pc)::value;
      const __m512i raw = _mm512_loadu_si512(block + 64 * j);  // lane c: channel c's 4 bytes
      const __m512i w = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(raw, 4 * p), low4),
                                        high_bits<4 * j + p>(high));  // two k a lane, 0..63 as int16 each
      for (int r = 0; r < R; ++r)
        dot[r] = dot_pairs(dot[r], w, _mm512_set1_epi32(xq[r * row_pairs + g * kPairs + 4 * j + p]));
    };
    for_pairs(pairs);
    const __m512 sup = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(head)));
    const __m128i sub = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kNibbleBytes + kHighBytes));
    const __m512 d = _mm512_mul_ps(sup, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sub)));
    for (int r = 0; r < R; ++r) {
      const __m512 t = _mm512_mul_ps(d, _mm512_cvtepi32_ps(dot[r]));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(P.xs[(m0 + r) * groups + g]), t, acc[r]);
    }
  }
  alignas(64) float out[kStrip];
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(out, acc[r]);
    store_row(P, m0 + r, n0, out);
  }
}
#elif defined(INFER_INT6_AVX2)
template <int I>
inline __m256i high_bits(__m256i high) {
  const __m256i at4 = _mm256_set1_epi32(0x00300030);
  if constexpr (2 * I >= 4) return _mm256_and_si256(_mm256_srli_epi32(high, 2 * I - 4), at4);
  else return _mm256_and_si256(_mm256_slli_epi32(high, 4 - 2 * I), at4);
}

// the AVX-512 tile's operations on two halves of 8 channels (vpmaddwd + add: 16 products each)
template <int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup, row_pairs = P.K / 2;
  const __m256i low4 = _mm256_set1_epi32(0x000F000F);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int32_t* xq = P.xq + m0 * row_pairs;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *head = head_of(strip, g), *block = block_of(strip, g);
    __m256i dot[R][2];
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm256_set1_epi32(P.xbias[(m0 + r) * groups + g]);
    __m256i high[2];  // lane c: channel 8h + c's high bits
    for (int h = 0; h < 2; ++h)
      high[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes + 32 * h));
    const auto pairs = [&](auto jc, auto pc) {
      constexpr int j = decltype(jc)::value, p = decltype(pc)::value;
      __m256i w[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * j + 32 * h));
        w[h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(raw, 4 * p), low4), high_bits<4 * j + p>(high[h]));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_set1_epi32(xq[r * row_pairs + g * kPairs + 4 * j + p]);
        for (int h = 0; h < 2; ++h) dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(w[h], x));
      }
    };
    for_pairs(pairs);
    __m256 d[2];
    for (int h = 0; h < 2; ++h) {
      const __m256 sup = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(head + 16 * h)));
      const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kNibbleBytes + kHighBytes + 8 * h));
      d[h] = _mm256_mul_ps(sup, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sub)));
    }
    for (int r = 0; r < R; ++r) {
      const __m256 xs = _mm256_set1_ps(P.xs[(m0 + r) * groups + g]);
      for (int h = 0; h < 2; ++h)
        acc[r][h] = _mm256_fmadd_ps(xs, _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(dot[r][h])), acc[r][h]);
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
  const int64_t groups = P.K / kGroup, row_pairs = P.K / 2;
  float acc[R][kStrip] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *head = head_of(strip, g), *block = block_of(strip, g);
    int32_t dot[R][kStrip];
    for (int r = 0; r < R; ++r)
      for (int64_t c = 0; c < kStrip; ++c) dot[r][c] = P.xbias[(m0 + r) * groups + g];
    for (int j = 0; j < 2; ++j)
      for (int p = 0; p < 4; ++p)
        for (int64_t c = 0; c < kStrip; ++c) {
          uint32_t raw, high;
          std::memcpy(&raw, block + 64 * j + 4 * c, sizeof raw);
          std::memcpy(&high, block + kNibbleBytes + 4 * c, sizeof high);
          const int i = 4 * j + p;
          const int32_t lo = ((raw >> (4 * p)) & 15) | (((high >> (2 * i)) & 3) << 4);
          const int32_t hi = ((raw >> (4 * p + 16)) & 15) | (((high >> (16 + 2 * i)) & 3) << 4);
          for (int r = 0; r < R; ++r) {
            const int32_t x = P.xq[(m0 + r) * row_pairs + g * kPairs + i];
            dot[r][c] += lo * static_cast<int16_t>(x & 0xFFFF) + hi * static_cast<int16_t>(x >> 16);
          }
        }
    for (int64_t c = 0; c < kStrip; ++c) {
      const float d = scale_at(head, block, c);
      for (int r = 0; r < R; ++r)
        acc[r][c] = std::fma(P.xs[(m0 + r) * groups + g], d * static_cast<float>(dot[r][c]), acc[r][c]);
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
    thread_local std::vector<int32_t> xq, xbias;
    thread_local std::vector<float> xs;
    xq.resize(M * (K / 2)), xs.resize(M * groups), xbias.resize(M * groups);
    const float* x_data = xf.const_data_ptr<float>();
    int32_t *xq_data = xq.data(), *xbias_data = xbias.data();
    float* xs_data = xs.data();
    const auto quantize = [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m)
        quantize_row(x_data + m * K, K, xq_data + m * (K / 2), xs_data + m * groups, xbias_data + m * groups);
    };
    if (M >= 2 * kQuantizeGrain) at::parallel_for(0, M, kQuantizeGrain, quantize);
    else quantize(0, M);
    const Problem P{M, out_features, K, packed.const_data_ptr<uint8_t>(), xq_data, xs_data, xbias_data,
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
