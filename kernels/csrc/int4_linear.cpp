// Weight-only int4 and int5 linear layers on the CPU: y = x . W^T + bias, W group-wise asymmetric 4- or 5-bit
// (like Q4_1, Q5_1).
//
// The weight comes packed by kernels/int4.py: one byte stream per strip of 16 output channels, a block per
// group of 32 input features: 4 x 64 bytes of nibbles (bytes 4c + b of the j-th 64 hold k = 8j + b in the low
// and 8j + 4 + b in the high nibble for channel c), then d and m, w = d * q + m: 16 fp16 each (a 320-byte
// block) or 16 fp32 each (384 bytes: K-quants' scales, exact). Or two-level, as K-quants ship them (`Super`):
// a 2368-byte block per super-block of 8 groups, its 16 d_super and 16 m_super (fp16), then per group the
// nibbles, 16 d_sub and 16 m_sub (int8); a group's d = d_super * d_sub and m = m_super * m_sub, both exact fp32
// products, decoded per group in registers. The block size picks the kernel (`Scale`).
// int5 (kernels/int4.py: Int5Weight, `int5_linear`): the same blocks with each group's fifth bits after its
// nibbles, 64 bytes: channel c's 32-bit lane holds, at bit i = 4 j + p (0..15), the fifth bit of the k whose
// nibble `(raw_j >> 4p) & 0x000F000F` puts in the lane's low word, and at bit 16 + i that of the high word's k;
// one shift by i - 4 and a mask move both to bit 4 of their word. Blocks of 384 (fp16), 448 (fp32), 2880
// (two-level: 64 + 8 x 352) bytes: 0.6875, 0.8125, 0.703 bytes per weight (Q5_0's, Q5_1's 0.75, Q5_K's 0.6875).
//
// Inputs are quantized per row and group of 32 to int16: s = max|x| / 32767, xq = round(x / s) (half to
// even), the same operations as kernels/int4.py's `quantize_activations`. Then a group's contribution to
// channel c is exact integer arithmetic and three roundings:
//   dot = sum_k xq_k * q_ck          (int32: at most 32 * 32767 * 15 < 2^24, so exact in fp32 too)
//   t   = fma(m_c, sum_k xq_k, d_c * dot)
//   acc = fma(s, t, acc)             (groups in order; y = acc + bias)
// The integer dot runs 32 products per instruction (VNNI's vpdpwssd, or vpmaddwd + add): a 64-byte load of
// nibbles gives four pairs of k a lane with a shift and a mask, no conversion to float per weight. int4 on
// AVX-512 multiplies bytes instead (as csrc/int6_linear.cpp): a 64-byte load is two registers of codes (a mask;
// a shift and a mask), 4 consecutive k a lane, and xq = 256 xh + xl (xh = xq >> 8 signed, xl = xq & 255
// unsigned) gives sum q * xq = 256 sum q * xh + sum xl * q, each a vpdpbusd of 64 products: 3 operations per
// 128 weights for the unpack where the pairs took 8, the same integer dot. int5 too where vpmultishiftqb is
// (AVX-512 VBMI): it moves each fifth bit from the lane to bit 4 of its k's byte, and one ternary-logic op ors
// it in (8 operations per 128 weights where the pairs took 20). Bytes take register tiles of up to 4 rows
// (decode), pairs larger ones (prefill; `kBytesRows`). A thread owns whole strips; rows go through in register
// tiles of 1-8, each row the same integers and the same fp32 operations whatever the tile, the thread or the
// number of rows in the call (batch invariance). With AVX2 only, the same
// integers and the same fp32 epilogue come from two halves of 8 channels (vpmaddwd, tiles of 1-3 rows), and
// elsewhere from plain loops.
// NOTE: the step max|x| / 32767 is 258x finer than int8's (Q8_1's max|x| / 127, tried first: a group holding
// one outlier rounded its small inputs coarsely enough to move SmolLM2's layers by 0.3-1.7% and change greedy
// answers); int16 inputs move a layer by ~1e-5, far below the int4 weights' own error. fp32 inputs (the
// version before this one) cost a float conversion and an fma per weight, twice the instructions.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define INFER_INT4_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFER_INT4_AVX2 1
#endif

#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kStrip = 16;                          // output channels per strip
constexpr int64_t kGroup = 32;                          // input features per scale and minimum
constexpr int64_t kNibbleBytes = kStrip * kGroup / 2;   // 256
template <int Bits>
constexpr int64_t kHighBytes = Bits == 5 ? kStrip * 4 : 0;  // int5: a group's fifth bits, a 32-bit lane a channel

// how a strip stores its groups' d and m: `Scale` (c10::Half, float) in each group's block, or two-level
// (`Super`: int8 in each group's block, times the fp16 in its super-block's head)
struct Super {};
template <typename Scale, int Bits>
struct Blocks {
  static constexpr int64_t kGroups = 1;     // groups a super-block
  static constexpr int64_t kHeadBytes = 0;  // a super-block's d_super and m_super
  static constexpr int64_t kScaleBytes = kStrip * static_cast<int64_t>(sizeof(Scale));  // a group's 16 d (or m)
  static constexpr int64_t kCodeBytes = kNibbleBytes + kHighBytes<Bits>;                // 256, 320
  static constexpr int64_t kBlockBytes = kCodeBytes + 2 * kScaleBytes;                  // 320, 384; 384, 448
};
template <int Bits>
struct Blocks<Super, Bits> {
  static constexpr int64_t kGroups = 8;
  static constexpr int64_t kHeadBytes = 2 * kStrip * 2;
  static constexpr int64_t kScaleBytes = kStrip;  // int8
  static constexpr int64_t kCodeBytes = kNibbleBytes + kHighBytes<Bits>;
  static constexpr int64_t kBlockBytes = kCodeBytes + 2 * kScaleBytes;  // 288, 352
};
// the packed tensor's last dimension: a group's block (320, 384; 384, 448), or a super-block's (2368; 2880)
template <typename Scale, int Bits>
constexpr int64_t kSuperBytes =
    Blocks<Scale, Bits>::kHeadBytes + Blocks<Scale, Bits>::kGroups * Blocks<Scale, Bits>::kBlockBytes;

// group g of a strip: its block (nibbles, fifth bits, then its scales) and its super-block's head
template <typename Scale, int Bits>
inline const uint8_t* group_head(const uint8_t* strip, int64_t g) {
  return strip + (g / Blocks<Scale, Bits>::kGroups) * kSuperBytes<Scale, Bits>;
}
template <typename Scale, int Bits>
inline const uint8_t* group_block(const uint8_t* strip, int64_t g) {
  using B = Blocks<Scale, Bits>;
  return group_head<Scale, Bits>(strip, g) + B::kHeadBytes + (g % B::kGroups) * B::kBlockBytes;
}
constexpr int64_t kPairs = kGroup / 2;                  // int16 input pairs per group
#ifdef INFER_INT4_AVX2
constexpr int kTileRows = 3;  // rows per register tile: 6 int32 sums of 8 channels, 16 ymm registers in all
#else
constexpr int kTileRows = 8;  // rows per register tile
#endif
constexpr float kInt16Max = 32767.f;
constexpr int64_t kQuantizeGrain = 8;                   // rows per task when quantizing in parallel

struct Problem {
  int64_t M, N, K;          // K padded to a multiple of 32
  const uint8_t* packed;    // [N_pad / 16][K / 32][block] or [N_pad / 16][K / 256][super-block]
  const int32_t* xq;        // [M][K / 2]: int16 pairs, per group in kPairLow/kPairHigh order
  const int32_t* xb;        // [M][K / 32][16]: per group xh of k 0..31 (bytes, 8 quads), then xl (int4, AVX-512)
  const float* xs;          // [M][K / 32]: s
  const float* xsum;        // [M][K / 32]: sum of the group's xq (an integer)
  const float* bias;        // [N] or null
  float* y;                 // [M, N] fp32
};

// channel c's d (which 0) or m (which 1) of the group whose block and head are given, as fp32
template <typename Scale, int Bits>
inline float scale_at(const uint8_t* head, const uint8_t* block, int which, int64_t c) {
  const uint8_t* p = block + Blocks<Scale, Bits>::kCodeBytes + which * Blocks<Scale, Bits>::kScaleBytes;
  if constexpr (std::is_same_v<Scale, Super>) {
    uint16_t bits;
    std::memcpy(&bits, head + 2 * (which * kStrip + c), sizeof bits);
    return static_cast<float>(c10::Half(bits, c10::Half::from_bits())) * static_cast<float>(static_cast<int8_t>(p[c]));
  } else if constexpr (std::is_same_v<Scale, float>) {
    float v;
    std::memcpy(&v, p + 4 * c, sizeof v);
    return v;
  } else {
    uint16_t bits;
    std::memcpy(&bits, p + 2 * c, sizeof bits);
    return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
  }
}

// one row's inputs [K] fp32 -> pairs [K / 2], bytes [K / 32][16] (null: not wanted), s and sum per group
void quantize_row(const float* x, int64_t K, int32_t* pairs, int32_t* bytes, float* s, float* sum) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    float amax = 0.f;
    for (int64_t k = 0; k < kGroup; ++k) amax = std::max(amax, std::fabs(xg[k]));
    const float scale = amax / kInt16Max;
    int32_t q[kGroup];
    if (scale > 0.f) {
      for (int64_t k = 0; k < kGroup; ++k) q[k] = static_cast<int32_t>(std::nearbyint(xg[k] / scale));
    } else {
      for (int64_t k = 0; k < kGroup; ++k) q[k] = 0;
    }
    int32_t total = 0;
    for (int64_t k = 0; k < kGroup; ++k) total += q[k];
    for (int j = 0; j < 4 && pairs; ++j)
      for (int p = 0; p < 4; ++p) {
        const uint32_t lo = static_cast<uint16_t>(q[8 * j + kPairLow[p]]), hi = static_cast<uint16_t>(q[8 * j + kPairHigh[p]]);
        pairs[g * kPairs + 4 * j + p] = static_cast<int32_t>(lo | (hi << 16));
      }
    if (bytes) {
      uint8_t b[2 * kGroup];  // xh of k 0..31, then xl
      for (int64_t k = 0; k < kGroup; ++k)
        b[k] = static_cast<uint8_t>(static_cast<int8_t>(q[k] >> 8)), b[kGroup + k] = static_cast<uint8_t>(q[k] & 255);
      std::memcpy(bytes + g * 16, b, sizeof b);
    }
    s[g] = scale, sum[g] = static_cast<float>(total);
  }
}

// f(j, p) for the 16 pairs of a group's codes, j and p compile-time constants (std::integral_constant)
template <typename F, int... I>
inline void for_pairs_of(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I / 4>{}, std::integral_constant<int, I % 4>{}), ...);
}
template <typename F>
inline void for_pairs(F& f) {
  for_pairs_of(f, std::make_integer_sequence<int, 16>{});
}

// y[m, n0 : n0 + width] = acc (+ bias), for the channels that exist
inline void store_row(const Problem& P, int64_t m, int64_t n0, const float* acc) {
  const int64_t width = std::min(kStrip, P.N - n0);
  for (int64_t j = 0; j < width; ++j) P.y[m * P.N + n0 + j] = P.bias ? acc[j] + P.bias[n0 + j] : acc[j];
}

#ifdef INFER_INT4_AVX512
inline __m512i dot_pairs(__m512i acc, __m512i w, __m512i x) {
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}

// the 16 d (which 0) or m (which 1) of the group whose block and head are given
template <typename Scale, int Bits>
inline __m512 load_scales(const uint8_t* head, const uint8_t* block, int which) {
  const uint8_t* p = block + Blocks<Scale, Bits>::kCodeBytes + which * Blocks<Scale, Bits>::kScaleBytes;
  if constexpr (std::is_same_v<Scale, Super>) {
    const __m512 sup = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(head + 32 * which)));
    return _mm512_mul_ps(sup, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
  } else if constexpr (std::is_same_v<Scale, float>) {
    return _mm512_loadu_ps(p);
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// a lane's fifth bits for pair i = 4 j + p (bits i and 16 + i) at bit 4 of its low and high words
template <int I>
inline __m512i fifth_bits(__m512i high) {
  const __m512i at4 = _mm512_set1_epi32(0x00100010);
  if constexpr (I >= 4) return _mm512_and_si512(_mm512_srli_epi32(high, I - 4), at4);
  else return _mm512_and_si512(_mm512_slli_epi32(high, 4 - I), at4);
}

#ifdef __AVX512VBMI__
constexpr bool kInt5Bytes = true;  // int5 by bytes too: vpmultishiftqb moves its fifth bits
#else
constexpr bool kInt5Bytes = false;
#endif

// vpmultishiftqb's offsets that put the fifth bit of k = 8j + 4h + b (lane bit kInt5LaneBit[8j + 4h + b]) at bit
// 4 of lane byte b, both lanes of a 64-bit element
struct FifthShifts {
  uint64_t at[8];  // [2j + h]
  constexpr FifthShifts() : at() {
    for (int i = 0; i < 8; ++i)
      for (int b = 0; b < 4; ++b) {
        const int pos = kInt5LaneBit[8 * (i / 2) + 4 * (i % 2) + b];
        at[i] |= static_cast<uint64_t>((pos - 4) & 63) << (8 * b) | static_cast<uint64_t>((pos + 28) & 63) << (8 * (4 + b));
      }
  }
};
constexpr FifthShifts kFifthShifts{};

// int4's (and int5's) integer dots of a group by bytes: dot[r] = sum_k xq_k * q_ck, the pairs' integers
// NOTE: bytes (vpdpbusd) take a tile of up to 4 rows, int16 pairs (vpdpwssd) a larger one: the bytes' two sums a
// row (hi and lo) and their final combine cost more than the pairs' unpack saves once the unpack is shared by 5+
// rows (one [8960 x 1536] int4 weight at 2 threads: 4 rows 0.39 -> 0.33 ms by bytes, 8 rows 0.73 -> 0.94 ms, 256
// rows 39 -> 51 ms: the prefill's tiles). The integer dots are the same either way, so a row's result does not
// depend on its tile.
constexpr int kBytesRows = 4;
template <int Bits>
constexpr bool by_bytes(int rows) {
  return (Bits == 4 || kInt5Bytes) && rows <= kBytesRows;
}

template <int Bits, int R>
inline void dot_by_bytes(const Problem& P, const uint8_t* block, int64_t m0, int64_t g, __m512i* dot) {
  const int64_t groups = P.K / kGroup;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // NOTE: up to 2 rows, a sum per half of the codes (4 chains of 4 vpdpbusd a group, not 2 of 8): one row's
  // group waited on its chains' latency (~22 GB/s a core); the integer sums are the same whatever the order
  constexpr int S = R <= 2 ? 2 : 1;
  __m512i hi[R][S], lo[R][S];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < S; ++h) hi[r][h] = lo[r][h] = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j) {
    const __m512i raw = _mm512_loadu_si512(block + 64 * j);  // lane c: k 8j + b (low nibbles), 8j + 4 + b (high)
    __m512i codes[2] = {_mm512_and_si512(raw, low4), _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4)};
#ifdef __AVX512VBMI__
    if constexpr (Bits == 5) {  // codes | (fifth bits at bit 4 & 0x10)
      const __m512i high = _mm512_loadu_si512(block + kNibbleBytes), bit4 = _mm512_set1_epi8(0x10);
      for (int h = 0; h < 2; ++h) {
        const __m512i moved = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(kFifthShifts.at[2 * j + h]), high);
        codes[h] = _mm512_ternarylogic_epi32(codes[h], moved, bit4, 0xF8);
      }
    }
#endif
    for (int r = 0; r < R; ++r) {
      const int32_t* xb = P.xb + ((m0 + r) * groups + g) * 16;  // quad 2j + h: k 8j + 4h .. 8j + 4h + 3
      for (int h = 0; h < 2; ++h) {
        hi[r][h % S] = dot_bytes(hi[r][h % S], codes[h], _mm512_set1_epi32(xb[2 * j + h]));      // codes by xh
        lo[r][h % S] = dot_bytes(lo[r][h % S], _mm512_set1_epi32(xb[8 + 2 * j + h]), codes[h]);  // xl by codes
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (S == 2) hi[r][0] = _mm512_add_epi32(hi[r][0], hi[r][1]), lo[r][0] = _mm512_add_epi32(lo[r][0], lo[r][1]);
    dot[r] = _mm512_add_epi32(_mm512_slli_epi32(hi[r][0], 8), lo[r][0]);
  }
}

template <typename Scale, int Bits, int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup, row_pairs = P.K / 2;
  const __m512i low4 = _mm512_set1_epi32(0x000F000F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *block = group_block<Scale, Bits>(strip, g), *head = group_head<Scale, Bits>(strip, g);
    __m512i dot[R];
    if constexpr (by_bytes<Bits>(R)) {
      dot_by_bytes<Bits, R>(P, block, m0, g, dot);
    } else {  // pairs of int16: tiles of 5-8 rows, and int5 without VBMI
      const int32_t* xq = P.xq + m0 * row_pairs;
      for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
      const __m512i high = Bits == 5 ? _mm512_loadu_si512(block + kNibbleBytes) : _mm512_setzero_si512();
      const auto pairs = [&](auto jc, auto pc) {
        constexpr int j = decltype(jc)::value, p = decltype(pc)::value;
        const __m512i raw = _mm512_loadu_si512(block + 64 * j);  // lane c: channel c's 4 bytes
        __m512i w = _mm512_and_si512(_mm512_srli_epi32(raw, 4 * p), low4);  // two k a lane, int16 each
        if constexpr (Bits == 5) w = _mm512_or_si512(w, fifth_bits<4 * j + p>(high));
        for (int r = 0; r < R; ++r)
          dot[r] = dot_pairs(dot[r], w, _mm512_set1_epi32(xq[r * row_pairs + g * kPairs + 4 * j + p]));
      };
      for_pairs(pairs);
    }
    const __m512 d = load_scales<Scale, Bits>(head, block, 0), mn = load_scales<Scale, Bits>(head, block, 1);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (m0 + r) * groups + g;
      const __m512 t = _mm512_fmadd_ps(mn, _mm512_set1_ps(P.xsum[i]), _mm512_mul_ps(d, _mm512_cvtepi32_ps(dot[r])));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(P.xs[i]), t, acc[r]);
    }
  }
  alignas(64) float out[kStrip];
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(out, acc[r]);
    store_row(P, m0 + r, n0, out);
  }
}
#elif defined(INFER_INT4_AVX2)
// the 16 d (which 0) or m (which 1) of the group whose block and head are given: channels 0-7, 8-15
template <typename Scale, int Bits>
inline void load_scales(const uint8_t* head, const uint8_t* block, int which, __m256* half) {
  const uint8_t* p = block + Blocks<Scale, Bits>::kCodeBytes + which * Blocks<Scale, Bits>::kScaleBytes;
  for (int h = 0; h < 2; ++h) {
    if constexpr (std::is_same_v<Scale, Super>) {
      const __m256 sup = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(head + 32 * which + 16 * h)));
      const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h));
      half[h] = _mm256_mul_ps(sup, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sub)));
    } else if constexpr (std::is_same_v<Scale, float>) {
      half[h] = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * h);
    } else {
      half[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    }
  }
}

// a lane's fifth bits for pair i = 4 j + p (bits i and 16 + i) at bit 4 of its low and high words
template <int I>
inline __m256i fifth_bits(__m256i high) {
  const __m256i at4 = _mm256_set1_epi32(0x00100010);
  if constexpr (I >= 4) return _mm256_and_si256(_mm256_srli_epi32(high, I - 4), at4);
  else return _mm256_and_si256(_mm256_slli_epi32(high, 4 - I), at4);
}

// the AVX-512 tile's operations on two halves of 8 channels (vpmaddwd + add: 16 products each)
template <typename Scale, int Bits, int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup, row_pairs = P.K / 2;
  const __m256i low4 = _mm256_set1_epi32(0x000F000F);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int32_t* xq = P.xq + m0 * row_pairs;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *block = group_block<Scale, Bits>(strip, g), *head = group_head<Scale, Bits>(strip, g);
    __m256i dot[R][2];
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
    __m256i high[2];  // lane c: channel 8h + c's fifth bits
    for (int h = 0; h < 2; ++h)
      high[h] = Bits == 5 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kNibbleBytes + 32 * h))
                          : _mm256_setzero_si256();
    const auto pairs = [&](auto jc, auto pc) {
      constexpr int j = decltype(jc)::value, p = decltype(pc)::value;
      __m256i w[2];  // two k a lane, int16 each
      for (int h = 0; h < 2; ++h) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * j + 32 * h));
        w[h] = _mm256_and_si256(_mm256_srli_epi32(raw, 4 * p), low4);
        if constexpr (Bits == 5) w[h] = _mm256_or_si256(w[h], fifth_bits<4 * j + p>(high[h]));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_set1_epi32(xq[r * row_pairs + g * kPairs + 4 * j + p]);
        for (int h = 0; h < 2; ++h) dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(w[h], x));
      }
    };
    for_pairs(pairs);
    __m256 d[2], mn[2];
    load_scales<Scale, Bits>(head, block, 0, d);
    load_scales<Scale, Bits>(head, block, 1, mn);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (m0 + r) * groups + g;
      const __m256 xs = _mm256_set1_ps(P.xs[i]), xsum = _mm256_set1_ps(P.xsum[i]);
      for (int h = 0; h < 2; ++h) {
        const __m256 t = _mm256_fmadd_ps(mn[h], xsum, _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(dot[r][h])));
        acc[r][h] = _mm256_fmadd_ps(xs, t, acc[r][h]);
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
template <typename Scale, int Bits, int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  const int64_t groups = P.K / kGroup, row_pairs = P.K / 2;
  float acc[R][kStrip] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t *block = group_block<Scale, Bits>(strip, g), *head = group_head<Scale, Bits>(strip, g);
    int32_t dot[R][kStrip] = {};
    for (int j = 0; j < 4; ++j)
      for (int p = 0; p < 4; ++p)
        for (int64_t c = 0; c < kStrip; ++c) {
          uint32_t raw, high = 0;
          std::memcpy(&raw, block + 64 * j + 4 * c, sizeof raw);
          if (Bits == 5) std::memcpy(&high, block + kNibbleBytes + 4 * c, sizeof high);
          const int i = 4 * j + p;
          const int32_t lo = ((raw >> (4 * p)) & 15) | (((high >> i) & 1) << 4);
          const int32_t hi = ((raw >> (4 * p + 16)) & 15) | (((high >> (16 + i)) & 1) << 4);
          for (int r = 0; r < R; ++r) {
            const int32_t x = P.xq[(m0 + r) * row_pairs + g * kPairs + 4 * j + p];
            dot[r][c] += lo * static_cast<int16_t>(x & 0xFFFF) + hi * static_cast<int16_t>(x >> 16);
          }
        }
    for (int64_t c = 0; c < kStrip; ++c) {
      const float d = scale_at<Scale, Bits>(head, block, 0, c), mn = scale_at<Scale, Bits>(head, block, 1, c);
      for (int r = 0; r < R; ++r) {
        const int64_t i = (m0 + r) * groups + g;
        const float t = std::fma(mn, P.xsum[i], d * static_cast<float>(dot[r][c]));
        acc[r][c] = std::fma(P.xs[i], t, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) store_row(P, m0 + r, n0, acc[r]);
}
#endif

template <typename Scale, int Bits>
void strip_rows(const Problem& P, const uint8_t* strip, int64_t n0) {
  for (int64_t m0 = 0; m0 < P.M; m0 += kTileRows) {
    switch (std::min<int64_t>(kTileRows, P.M - m0)) {
#ifndef INFER_INT4_AVX2
      case 8: tile<Scale, Bits, 8>(P, strip, m0, n0); break;
      case 7: tile<Scale, Bits, 7>(P, strip, m0, n0); break;
      case 6: tile<Scale, Bits, 6>(P, strip, m0, n0); break;
      case 5: tile<Scale, Bits, 5>(P, strip, m0, n0); break;
      case 4: tile<Scale, Bits, 4>(P, strip, m0, n0); break;
#endif
      case 3: tile<Scale, Bits, 3>(P, strip, m0, n0); break;
      case 2: tile<Scale, Bits, 2>(P, strip, m0, n0); break;
      default: tile<Scale, Bits, 1>(P, strip, m0, n0); break;
    }
  }
}

template <typename Scale, int Bits>
void run(const Problem& P) {
  const int64_t num_strips = (P.N + kStrip - 1) / kStrip;
  const int64_t strip_bytes = (P.K / (kGroup * Blocks<Scale, Bits>::kGroups)) * kSuperBytes<Scale, Bits>;
  at::parallel_for(0, num_strips, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) strip_rows<Scale, Bits>(P, P.packed + s * strip_bytes, s * kStrip);
  });
}

// y = x . W^T + bias for W packed with `Bits`-bit codes (see the top of the file)
template <int Bits>
at::Tensor grouped_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                          int64_t out_features, const char* name) {
  TORCH_CHECK(x.dim() == 2, name, ": x must be [M, K]");
  const int64_t block = packed.dim() == 3 ? packed.size(2) : 0;
  const bool super = block == kSuperBytes<Super, Bits>;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  (block == kSuperBytes<c10::Half, Bits> || block == kSuperBytes<float, Bits> || super),
              name, ": packed must be [N/16, K/32, ", kSuperBytes<c10::Half, Bits>, " or ", kSuperBytes<float, Bits>,
              "] or [N/16, K/256, ", kSuperBytes<Super, Bits>, "] uint8");
  const int64_t K = packed.size(1) * kGroup * (super ? Blocks<Super, Bits>::kGroups : 1), k_in = x.size(1);
  TORCH_CHECK(k_in <= K && K - k_in < kGroup, name, ": x has ", k_in, " features, weight ", K);
  TORCH_CHECK(out_features > 0 && out_features <= packed.size(0) * kStrip && out_features > (packed.size(0) - 1) * kStrip,
              name, ": out_features does not fit the packed strips");
  if (bias.has_value()) TORCH_CHECK(bias->numel() == out_features, name, ": bias must be [out_features]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor bias_f;
  if (bias.has_value()) bias_f = bias->to(at::kFloat).contiguous();
  auto y = at::empty({x.size(0), out_features}, x.options().dtype(at::kFloat));
  const int64_t M = x.size(0);
  if (M > 0) {
    // NOTE: inputs short of the padded K get zero columns (the padding weights are finite: 0 * w adds nothing)
    const at::Tensor xp = k_in == K ? xf : at::constant_pad_nd(xf, {0, K - k_in}, 0.0);
    const int64_t groups = K / kGroup;
    // the quantized inputs: buffers of the calling thread, reused (no allocation per call on the decode path)
    thread_local std::vector<int32_t> xq, xb;
    thread_local std::vector<float> xs, xsum;
#ifdef INFER_INT4_AVX512
    // which forms of the inputs the row tiles read: bytes (dot_by_bytes) for tiles of up to kBytesRows rows, pairs
    // for larger ones (a tile is kTileRows rows, the last one what is left)
    const int64_t last_tile = M % kTileRows ? M % kTileRows : kTileRows;
    const int first_tile = static_cast<int>(std::min<int64_t>(M, kTileRows));
    const bool pairs = !by_bytes<Bits>(first_tile) || !by_bytes<Bits>(static_cast<int>(last_tile));
    const bool bytes = by_bytes<Bits>(first_tile) || by_bytes<Bits>(static_cast<int>(last_tile));
#else
    const bool pairs = true, bytes = false;
#endif
    xq.resize(pairs ? M * (K / 2) : 0), xb.resize(bytes ? M * groups * 16 : 0);
    xs.resize(M * groups), xsum.resize(M * groups);
    const float* xp_data = xp.const_data_ptr<float>();
    int32_t *xq_data = pairs ? xq.data() : nullptr, *xb_data = bytes ? xb.data() : nullptr;
    float *xs_data = xs.data(), *xsum_data = xsum.data();
    const auto quantize = [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m)
        quantize_row(xp_data + m * K, K, xq_data ? xq_data + m * (K / 2) : nullptr, xb_data ? xb_data + m * groups * 16 : nullptr,
                     xs_data + m * groups, xsum_data + m * groups);
    };
    if (M >= 2 * kQuantizeGrain) at::parallel_for(0, M, kQuantizeGrain, quantize);
    else quantize(0, M);
    const Problem P{M, out_features, K, packed.const_data_ptr<uint8_t>(), xq_data, xb_data, xs_data, xsum_data,
                    bias.has_value() ? bias_f.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
    if (super) run<Super, Bits>(P);
    else if (block == kSuperBytes<float, Bits>) run<float, Bits>(P);
    else run<c10::Half, Bits>(P);
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace

// x: [M, K_in] fp32 or bf16; packed: [N_pad / 16, K / 32, 320 | 384] or [N_pad / 16, K / 256, 2368] uint8
// -> [M, N], x's dtype
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features) {
  return grouped_linear<4>(x, packed, bias, out_features, "int4_linear");
}

// x: [M, K_in] fp32 or bf16; packed: [N_pad / 16, K / 32, 384 | 448] or [N_pad / 16, K / 256, 2880] uint8
// -> [M, N], x's dtype
at::Tensor int5_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features) {
  return grouped_linear<5>(x, packed, bias, out_features, "int5_linear");
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("int5_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) {
  m.impl("int4_linear", &infer_cpu::int4_linear);
  m.impl("int5_linear", &infer_cpu::int5_linear);
}
