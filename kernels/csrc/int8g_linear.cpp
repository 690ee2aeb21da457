// Weight-only 8-bit grouped linear layer on the CPU: y = x . W^T + bias, W = d * q + m per group of G inputs.
//
// The weight comes packed by kernels/int8g.py: one byte stream per strip of 16 output channels, a block per
// group of G (16 or 32) input features: the codes as [G / 2][16][2] int8 (32 bytes hold k = 2j and 2j + 1 of
// the 16 channels), then d (16 `Scale`: fp16 or fp32), then m (16 more) unless the format is symmetric
// (Q8_0, Q5_0, Q6_K: w = d * q). Or two-level, as K-quants ship them (scale type int8): a block per super-block
// of 256 inputs, its 16 d_super (then 16 m_super) fp16, then per group its codes as above, 16 d_sub (then 16
// m_sub) int8; a group's d = d_super * d_sub and m = m_super * m_sub, exact fp32 products decoded per group in
// registers. G, the scale type and the minimum are template parameters (`Layout`).
//
// Inputs are quantized per row and group of G to int16: s = max|x| / 32767, xq = round(x / s) (half to even),
// the operations of kernels/packed.py's `quantize_activations`. A group's contribution to channel c:
//   dot = sum_k xq_k * q_ck          (int32, exact: |dot| <= 32 * 32767 * 128 < 2^31)
//   t   = d_c * float(dot)           (symmetric), or fma(m_c, sum_k xq_k, d_c * float(dot))
//   acc = fma(s, t, acc)             (groups in order; y = acc + bias)
// One 32-byte load, sign-extended to int16 pairs, serves every row of a register tile: AVX-512 VNNI's
// vpdpwssd (or vpmaddwd + add) takes 16 channels x 2 k per instruction, AVX2 (or AVX-VNNI) two halves of 8.
// The integer sums may split into several chains (exact, so in any order); every float operation of a row is
// the same whatever the tile, the thread or the number of rows in the call (batch invariance), and the same
// on every instruction set (mul and fma are exactly rounded). Without AVX2, plain loops compute the same.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define INFER_INT8G_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFER_INT8G_AVX2 1
#endif

#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kStrip = 16;           // output channels per strip
constexpr int64_t kPairBytes = 2 * kStrip;  // 32: k 2j and 2j + 1 of the 16 channels
constexpr float kInt16Max = 32767.f;
constexpr int64_t kQuantizeGrain = 8;    // rows per task when quantizing in parallel

// Scale: c10::Half or float per group, or int8_t (two-level: int8 per group times fp16 per super-block)
template <int G, typename Scale, bool kMin>
struct Layout {
  static constexpr bool kSuper = std::is_same_v<Scale, int8_t>;
  static constexpr int kPairs = G / 2;                                          // int16 input pairs per group
  static constexpr int64_t kCodeBytes = kStrip * G;
  static constexpr int64_t kScaleBytes = kStrip * static_cast<int64_t>(sizeof(Scale));  // a group's 16 d (or m)
  static constexpr int64_t kBlockBytes = kCodeBytes + kScaleBytes * (kMin ? 2 : 1);     // a group's
  static constexpr int64_t kGroups = kSuper ? 256 / G : 1;                      // groups a super-block
  static constexpr int64_t kHeadBytes = kSuper ? kStrip * 2 * (kMin ? 2 : 1) : 0;  // fp16 d_super (, m_super)
  static constexpr int64_t kSuperBytes = kHeadBytes + kGroups * kBlockBytes;   // the packed tensor's last dim
};

struct Problem {
  int64_t M, N, K;          // K padded to a multiple of G
  const uint8_t* packed;    // [N_pad / 16][K / G][block] or [N_pad / 16][K / 256][super-block]
  const int32_t* xq;        // [M][K / 2]: int16 pairs (k = 2j low, 2j + 1 high)
  const float* xs;          // [M][K / G]: s
  const float* xsum;        // [M][K / G]: sum of the group's xq (an integer)
  const float* bias;        // [N] or null
  float* y;                 // [M, N] fp32
};

// one row's inputs [K] fp32 -> pairs [K / 2], s and sum per group of G
void quantize_row(const float* x, int64_t K, int64_t G, int32_t* pairs, float* s, float* sum) {
  int32_t q[32];
  for (int64_t g = 0; g < K / G; ++g) {
    const float* xg = x + g * G;
    float amax = 0.f;
    for (int64_t k = 0; k < G; ++k) amax = std::max(amax, std::fabs(xg[k]));
    const float scale = amax / kInt16Max;
    int32_t total = 0;
    for (int64_t k = 0; k < G; ++k) {
      q[k] = scale > 0.f ? static_cast<int32_t>(std::nearbyint(xg[k] / scale)) : 0;
      total += q[k];
    }
    for (int64_t j = 0; j < G / 2; ++j) {
      const uint32_t lo = static_cast<uint16_t>(q[2 * j]), hi = static_cast<uint16_t>(q[2 * j + 1]);
      pairs[g * (G / 2) + j] = static_cast<int32_t>(lo | (hi << 16));
    }
    s[g] = scale, sum[g] = static_cast<float>(total);
  }
}

// 16 channels' values: `Ints` int32 sums, `Floats` fp32, `Codes` one k pair of int16 codes; the three
// instruction sets below give the same results (integers, then IEEE mul and fma)
#if defined(INFER_INT8G_AVX512)
constexpr int kTileRows = 8;
struct Ints { __m512i v; };
struct Floats { __m512 v; };
struct Codes { __m512i v; };
inline Ints izero() { return {_mm512_setzero_si512()}; }
inline Codes load_codes(const uint8_t* p) {  // 32 int8 -> 16 lanes of an int16 pair
  return {_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline Ints dot_pairs(Ints acc, Codes w, int32_t x) {
#ifdef __AVX512VNNI__
  return {_mm512_dpwssd_epi32(acc.v, w.v, _mm512_set1_epi32(x))};
#else
  return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(w.v, _mm512_set1_epi32(x)))};
#endif
}
inline Ints iadd(Ints a, Ints b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline Floats fzero() { return {_mm512_setzero_ps()}; }
inline Floats to_floats(Ints a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline Floats fset1(float v) { return {_mm512_set1_ps(v)}; }
inline Floats fmul(Floats a, Floats b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Floats fmadd(Floats a, Floats b, Floats c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline void fstore(float* out, Floats a) { _mm512_storeu_ps(out, a.v); }
template <typename Scale>
inline Floats load_scales(const uint8_t* p) {
  if constexpr (std::is_same_v<Scale, float>) {
    return {_mm512_loadu_ps(p)};
  } else if constexpr (std::is_same_v<Scale, int8_t>) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
  } else {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
  }
}
#elif defined(INFER_INT8G_AVX2)
// NOTE: 3 rows (6 int32 sums, 2 code and 3 input registers of 16): 4 spilled a sum, and 3 ran vpmaddwd at
// Zen 3's one a cycle (~49 GMAC/s a core at 64 rows, [4864 x 896])
constexpr int kTileRows = 3;
struct Ints { __m256i lo, hi; };  // channels 0-7, 8-15
struct Floats { __m256 lo, hi; };
struct Codes { __m256i lo, hi; };
inline Ints izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Codes load_codes(const uint8_t* p) {
  return {_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}
inline __m256i dot8(__m256i acc, __m256i w, __m256i x) {
#ifdef __AVXVNNI__
  return _mm256_dpwssd_avx_epi32(acc, w, x);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
#endif
}
inline Ints dot_pairs(Ints acc, Codes w, int32_t x) {
  const __m256i xv = _mm256_set1_epi32(x);
  return {dot8(acc.lo, w.lo, xv), dot8(acc.hi, w.hi, xv)};
}
inline Ints iadd(Ints a, Ints b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline Floats fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Floats to_floats(Ints a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline Floats fset1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline Floats fmul(Floats a, Floats b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Floats fmadd(Floats a, Floats b, Floats c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline void fstore(float* out, Floats a) {
  _mm256_storeu_ps(out, a.lo);
  _mm256_storeu_ps(out + 8, a.hi);
}
template <typename Scale>
inline Floats load_scales(const uint8_t* p) {
  if constexpr (std::is_same_v<Scale, float>) {
    return {_mm256_loadu_ps(reinterpret_cast<const float*>(p)), _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8)};
  } else if constexpr (std::is_same_v<Scale, int8_t>) {
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
  } else {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
}
#else
constexpr int kTileRows = 4;
struct Ints { int32_t v[kStrip]; };
struct Floats { float v[kStrip]; };
struct Codes { int16_t v[2 * kStrip]; };
inline Ints izero() { return {}; }
inline Codes load_codes(const uint8_t* p) {
  Codes w;
  for (int64_t i = 0; i < 2 * kStrip; ++i) w.v[i] = static_cast<int8_t>(p[i]);
  return w;
}
inline Ints dot_pairs(Ints acc, Codes w, int32_t x) {
  const int32_t lo = static_cast<int16_t>(x & 0xFFFF), hi = static_cast<int16_t>(static_cast<uint32_t>(x) >> 16);
  for (int64_t c = 0; c < kStrip; ++c) acc.v[c] += w.v[2 * c] * lo + w.v[2 * c + 1] * hi;
  return acc;
}
inline Ints iadd(Ints a, Ints b) {
  for (int64_t c = 0; c < kStrip; ++c) a.v[c] += b.v[c];
  return a;
}
inline Floats fzero() { return {}; }
inline Floats to_floats(Ints a) {
  Floats f;
  for (int64_t c = 0; c < kStrip; ++c) f.v[c] = static_cast<float>(a.v[c]);
  return f;
}
inline Floats fset1(float v) {
  Floats f;
  for (int64_t c = 0; c < kStrip; ++c) f.v[c] = v;
  return f;
}
inline Floats fmul(Floats a, Floats b) {
  for (int64_t c = 0; c < kStrip; ++c) a.v[c] *= b.v[c];
  return a;
}
inline Floats fmadd(Floats a, Floats b, Floats c) {
  for (int64_t i = 0; i < kStrip; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline void fstore(float* out, Floats a) { std::memcpy(out, a.v, sizeof a.v); }
template <typename Scale>
inline Floats load_scales(const uint8_t* p) {
  Floats f;
  for (int64_t c = 0; c < kStrip; ++c) {
    Scale v;
    std::memcpy(&v, p + c * sizeof(Scale), sizeof v);
    f.v[c] = static_cast<float>(v);
  }
  return f;
}
#endif

// the 16 d (which 0) or m (which 1) of the group whose block and super-block head are given
template <typename L, typename Scale>
inline Floats group_scales(const uint8_t* head, const uint8_t* block, int which) {
  const Floats stored = load_scales<Scale>(block + L::kCodeBytes + which * L::kScaleBytes);
  if constexpr (L::kSuper) return fmul(load_scales<c10::Half>(head + which * kStrip * 2), stored);
  else return stored;
}

// y[m, n0 : n0 + width] = acc (+ bias), for the channels that exist
inline void store_row(const Problem& P, int64_t m, int64_t n0, Floats acc) {
  alignas(64) float out[kStrip];
  fstore(out, acc);
  const int64_t width = std::min(kStrip, P.N - n0);
  for (int64_t j = 0; j < width; ++j) P.y[m * P.N + n0 + j] = P.bias ? out[j] + P.bias[n0 + j] : out[j];
}

// R rows x one strip; the integer dot of a group runs in C chains (more for fewer rows: latency), summed exactly
template <typename L, typename Scale, bool kMin, int R>
void tile(const Problem& P, const uint8_t* strip, int64_t m0, int64_t n0) {
  constexpr int C = R == 1 ? 4 : (R == 2 ? 2 : 1);
  static_assert(L::kPairs % C == 0, "chains must divide a group's pairs");
  const int64_t groups = P.K / (2 * L::kPairs), row_pairs = P.K / 2;
  Floats acc[R];
  for (int r = 0; r < R; ++r) acc[r] = fzero();
  const int32_t* xq = P.xq + m0 * row_pairs;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* head = strip + (g / L::kGroups) * L::kSuperBytes;
    const uint8_t* block = head + L::kHeadBytes + (g % L::kGroups) * L::kBlockBytes;
    const int32_t* xg = xq + g * L::kPairs;
    Ints dot[C][R];
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < R; ++r) dot[c][r] = izero();
    for (int j = 0; j < L::kPairs; j += C) {
      for (int c = 0; c < C; ++c) {
        const Codes w = load_codes(block + kPairBytes * (j + c));
        for (int r = 0; r < R; ++r) dot[c][r] = dot_pairs(dot[c][r], w, xg[r * row_pairs + j + c]);
      }
    }
    const Floats d = group_scales<L, Scale>(head, block, 0);
    for (int r = 0; r < R; ++r) {
      Ints total = dot[0][r];
      for (int c = 1; c < C; ++c) total = iadd(total, dot[c][r]);
      const int64_t i = (m0 + r) * groups + g;
      Floats t = fmul(d, to_floats(total));
      if constexpr (kMin) t = fmadd(group_scales<L, Scale>(head, block, 1), fset1(P.xsum[i]), t);
      acc[r] = fmadd(fset1(P.xs[i]), t, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store_row(P, m0 + r, n0, acc[r]);
}

template <typename L, typename Scale, bool kMin>
void strip_rows(const Problem& P, const uint8_t* strip, int64_t n0) {
  for (int64_t m0 = 0; m0 < P.M; m0 += kTileRows) {
    switch (std::min<int64_t>(kTileRows, P.M - m0)) {
#if defined(INFER_INT8G_AVX512)
      case 8: tile<L, Scale, kMin, 8>(P, strip, m0, n0); break;
      case 7: tile<L, Scale, kMin, 7>(P, strip, m0, n0); break;
      case 6: tile<L, Scale, kMin, 6>(P, strip, m0, n0); break;
      case 5: tile<L, Scale, kMin, 5>(P, strip, m0, n0); break;
#endif
      case 4: tile<L, Scale, kMin, 4>(P, strip, m0, n0); break;
      case 3: tile<L, Scale, kMin, 3>(P, strip, m0, n0); break;
      case 2: tile<L, Scale, kMin, 2>(P, strip, m0, n0); break;
      default: tile<L, Scale, kMin, 1>(P, strip, m0, n0); break;
    }
  }
}

template <int G, typename Scale, bool kMin>
void run(const Problem& P) {
  using L = Layout<G, Scale, kMin>;
  const int64_t num_strips = (P.N + kStrip - 1) / kStrip, strip_bytes = (P.K / (G * L::kGroups)) * L::kSuperBytes;
  at::parallel_for(0, num_strips, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) strip_rows<L, Scale, kMin>(P, P.packed + s * strip_bytes, s * kStrip);
  });
}

template <int G, typename Scale>
void run_scale(const Problem& P, bool has_min) {
  if (has_min) run<G, Scale, true>(P);
  else run<G, Scale, false>(P);
}

template <int G>
void run_group(const Problem& P, int64_t scale_bytes, bool has_min) {
  if (scale_bytes == 4) run_scale<G, float>(P, has_min);
  else if (scale_bytes == 1) run_scale<G, int8_t>(P, has_min);
  else run_scale<G, c10::Half>(P, has_min);
}

}  // namespace

// x: [M, K_in] fp32 or bf16; packed: [N_pad / 16, K / G, block] or [N_pad / 16, K / 256, super-block] uint8;
// group G: 16 or 32; scale_bytes: 2 (fp16), 4 (fp32) or 1 (two-level: int8 d_sub, fp16 d_super); has_min: a
// minimum per group after the scales -> [M, N], x's dtype
at::Tensor int8g_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                        int64_t out_features, int64_t group, int64_t scale_bytes, bool has_min) {
  TORCH_CHECK(x.dim() == 2, "int8g_linear: x must be [M, K]");
  TORCH_CHECK(group == 16 || group == 32, "int8g_linear: group must be 16 or 32, not ", group);
  TORCH_CHECK(scale_bytes == 1 || scale_bytes == 2 || scale_bytes == 4,
              "int8g_linear: scale_bytes must be 1, 2 or 4, not ", scale_bytes);
  const int64_t groups_a_block = scale_bytes == 1 ? 256 / group : 1, scales = has_min ? 2 : 1;
  const int64_t head_bytes = scale_bytes == 1 ? kStrip * 2 * scales : 0;
  const int64_t block_bytes = head_bytes + groups_a_block * (kStrip * group + kStrip * scale_bytes * scales);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == block_bytes, "int8g_linear: packed must be [N/16, K/", group * groups_a_block,
              ", ", block_bytes, "] uint8");
  const int64_t K = packed.size(1) * group * groups_a_block, k_in = x.size(1);
  TORCH_CHECK(k_in <= K && K - k_in < group, "int8g_linear: x has ", k_in, " features, weight ", K);
  TORCH_CHECK(out_features > 0 && out_features <= packed.size(0) * kStrip && out_features > (packed.size(0) - 1) * kStrip,
              "int8g_linear: out_features does not fit the packed strips");
  if (bias.has_value()) TORCH_CHECK(bias->numel() == out_features, "int8g_linear: bias must be [out_features]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor bias_f;
  if (bias.has_value()) bias_f = bias->to(at::kFloat).contiguous();
  auto y = at::empty({x.size(0), out_features}, x.options().dtype(at::kFloat));
  const int64_t M = x.size(0);
  if (M > 0) {
    // NOTE: inputs short of the padded K get zero columns (zero codes there: the padding adds nothing)
    const at::Tensor xp = k_in == K ? xf : at::constant_pad_nd(xf, {0, K - k_in}, 0.0);
    const int64_t groups = K / group;
    // the quantized inputs: buffers of the calling thread, reused (no allocation per call on the decode path)
    thread_local std::vector<int32_t> xq;
    thread_local std::vector<float> xs, xsum;
    xq.resize(M * (K / 2)), xs.resize(M * groups), xsum.resize(M * groups);
    const float* xp_data = xp.const_data_ptr<float>();
    int32_t* xq_data = xq.data();
    float *xs_data = xs.data(), *xsum_data = xsum.data();
    const auto quantize = [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m)
        quantize_row(xp_data + m * K, K, group, xq_data + m * (K / 2), xs_data + m * groups, xsum_data + m * groups);
    };
    if (M >= 2 * kQuantizeGrain) at::parallel_for(0, M, kQuantizeGrain, quantize);
    else quantize(0, M);
    const Problem P{M, out_features, K, packed.const_data_ptr<uint8_t>(), xq_data, xs_data, xsum_data,
                    bias.has_value() ? bias_f.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
    if (group == 16) run_group<16>(P, scale_bytes, has_min);
    else run_group<32>(P, scale_bytes, has_min);
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("int8g_linear(Tensor x, Tensor packed, Tensor? bias, int out_features, int group, int scale_bytes, "
        "bool has_min) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("int8g_linear", &infer_cpu::int8g_linear); }
