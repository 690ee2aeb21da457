// Small fp32 helpers shared by the CPU kernels, written so that -O3 vectorises them
// (the build targets the machine that runs `make setup`: see kernels/cpu_build.py).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace infer_cpu {

// int4 and int5 (kernels/int4.py): the k of each int16 pair's low and high word, in the order a group's pairs are
// stored: pair 4j + p holds the two ks whose nibbles `(raw >> 4p) & 0x000F000F` put in a lane's low and high word
// (raw: the group's j-th 64 bytes)
constexpr int kPairLow[4] = {0, 4, 1, 5}, kPairHigh[4] = {2, 6, 3, 7};

// int5's fifth bits: the bit of a channel's 32-bit lane that holds code k's (the pairs' order: a pair's low word
// at bit 4j + p, its high word at 16 + 4j + p)
constexpr std::array<int, 32> int5_lane_bits() {
  std::array<int, 32> bit{};
  for (int j = 0; j < 4; ++j)
    for (int p = 0; p < 4; ++p) bit[8 * j + kPairLow[p]] = 4 * j + p, bit[8 * j + kPairHigh[p]] = 16 + 4 * j + p;
  return bit;
}
constexpr std::array<int, 32> kInt5LaneBit = int5_lane_bits();

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy(float a, const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

inline void scale_in_place(float a, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// n values of T as fp32 (bf16 -> fp32 is exact: the high half of the fp32 bits)
inline void to_float(const float* __restrict src, float* __restrict dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
inline void to_float(const c10::BFloat16* __restrict src, float* __restrict dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(bits[i]);
}

inline void from_float(const float* __restrict src, float* __restrict dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
inline void from_float(const float* __restrict src, c10::BFloat16* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = c10::BFloat16(src[i]);  // round to nearest even
}

// e^x for x <= 0, as softmax needs after subtracting the row maximum; 0 below -87.
// 2^n * e^r with |r| <= ln2 / 2 and a degree-6 Taylor polynomial: relative error ~1.2e-7.
inline float exp_nonpositive(float x) {
  const float clamped = std::max(x, -87.f);
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  const float r = clamped - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.f ? 0.f : p * two_n;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// acc + sum of 4 products of unsigned bytes of a by signed bytes of b, a 32-bit lane each (int4's and int6's
// integer dots: vpdpbusd, or vpmaddubsw + vpmaddwd without VNNI, no saturation for their operands)
inline __m512i dot_bytes(__m512i acc, __m512i a, __m512i b) {
#ifdef __AVX512VNNI__
  return _mm512_dpbusd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), _mm512_set1_epi16(1)));
#endif
}
#endif

}  // namespace infer_cpu
