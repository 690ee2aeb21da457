// fp32 and bf16 linear layer on the CPU, any number of rows: y = x . W^T + bias, W [N, K] row-major as loaded.
//
// Batch invariant: y[m, n] is computed by the same instructions in the same order whatever M is and
// wherever row m sits in x. Each (row, channel) pair owns one vector accumulator that walks K in
// chunks (16 fp32, or 32 bf16 taken in pairs by vdpbf16ps), is reduced by one fixed tree at the end
// of K, then the tail of K is added in order. Tiles of up to 4 rows x 4 channels only decide which
// accumulators share a weight load, never a sum. (torch's GEMM picks its algorithm and its
// reduction split by row count: a row's result changes with the batch around it.)
//
// A thread owns blocks of 4 output channels; within its blocks, rows go in groups of 64 (x's group
// stays in L2) and each block's 4 weight rows are walked side by side against 1-4 rows of x.
// With 1-4 rows this streams W once at memory speed (a matrix-vector product).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kRows = 4;        // rows of x per register tile
constexpr int64_t kChannels = 4;    // output channels per block
constexpr int64_t kRowGroup = 64;   // rows per pass over a thread's blocks
constexpr int64_t kLanes = 16;      // fp32 lanes of one accumulator

template <typename T>
struct Problem {
  int64_t M, N, K;
  const T* x;         // [M, K]
  const T* w;         // [N, K]
  const float* bias;  // [N] fp32 or null
  float* y;           // [M, N] fp32
};

inline float as_float(float v) { return v; }
inline float as_float(c10::BFloat16 v) { return static_cast<float>(v); }

// one (row, channel) pair the portable way: 16 lane sums over K in chunks, a fixed pairwise tree, the tail
// NOTE: explicit lanes, not an `omp simd` reduction: the compiler may peel a reduction loop by the
// address's alignment, and a row's address depends on where it sits in the batch
template <typename T>
float dot_lanes(const T* __restrict x, const T* __restrict w, int64_t K) {
  float acc[kLanes] = {};
  const int64_t k_vec = K / kLanes * kLanes;
  for (int64_t k = 0; k < k_vec; k += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += as_float(x[k + l]) * as_float(w[k + l]);
  }
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t l = 0; l < width; ++l) acc[l] += acc[l + width];
  }
  float s = acc[0];
  for (int64_t k = k_vec; k < K; ++k) s += as_float(x[k]) * as_float(w[k]);
  return s;
}

template <typename T>
void block_portable(const Problem<T>& P, int64_t m0, int64_t rows, int64_t n0, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const float s = dot_lanes(P.x + (m0 + r) * P.K, P.w + (n0 + c) * P.K, P.K);
      P.y[(m0 + r) * P.N + n0 + c] = s + (P.bias ? P.bias[n0 + c] : 0.f);
    }
  }
}

#if defined(__AVX512F__)
// the end of one (row, channel) pair: reduce the accumulator, add the tail of K in order, then the bias
template <typename T>
inline void finish(const Problem<T>& P, __m512 acc, int64_t m, int64_t n, int64_t k_vec) {
  float s = _mm512_reduce_add_ps(acc);
  const T* x = P.x + m * P.K;
  const T* w = P.w + n * P.K;
  for (int64_t k = k_vec; k < P.K; ++k) s += as_float(x[k]) * as_float(w[k]);
  P.y[m * P.N + n] = s + (P.bias ? P.bias[n] : 0.f);
}

template <int R>
void block_avx512(const Problem<float>& P, int64_t m0, int64_t n0) {  // R rows x 4 whole channels
  __m512 acc[R][kChannels];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm512_setzero_ps();
  const float* x0 = P.x + m0 * P.K;
  const float* w0 = P.w + n0 * P.K;
  const int64_t k_vec = P.K / 16 * 16;
  for (int64_t k = 0; k < k_vec; k += 16) {
    __m512 w[kChannels];
    for (int c = 0; c < kChannels; ++c) w[c] = _mm512_loadu_ps(w0 + c * P.K + k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x0 + r * P.K + k);
      for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c) finish(P, acc[r][c], m0 + r, n0 + c, k_vec);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
template <int R>
void block_avx512(const Problem<c10::BFloat16>& P, int64_t m0, int64_t n0) {  // R rows x 4 whole channels
  __m512 acc[R][kChannels];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm512_setzero_ps();
  const c10::BFloat16* x0 = P.x + m0 * P.K;
  const c10::BFloat16* w0 = P.w + n0 * P.K;
  const int64_t k_vec = P.K / 32 * 32;
  for (int64_t k = 0; k < k_vec; k += 32) {
    __m512bh w[kChannels];
    for (int c = 0; c < kChannels; ++c) {
      const __m512i v = _mm512_loadu_si512(w0 + c * P.K + k);
      w[c] = reinterpret_cast<const __m512bh&>(v);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i v = _mm512_loadu_si512(x0 + r * P.K + k);
      const __m512bh xv = reinterpret_cast<const __m512bh&>(v);
      for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, w[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c) finish(P, acc[r][c], m0 + r, n0 + c, k_vec);
}
#define INFER_DENSE_BF16_AVX512 1
#endif

template <typename T>
constexpr bool has_avx512_block() {
#if defined(INFER_DENSE_BF16_AVX512)
  return true;
#elif defined(__AVX512F__)
  return std::is_same_v<T, float>;
#else
  return false;
#endif
}

template <typename T>
void block(const Problem<T>& P, int64_t m0, int64_t rows, int64_t n0, int64_t width) {
#if defined(__AVX512F__)
  if constexpr (has_avx512_block<T>()) {
    if (width == kChannels) {
      switch (rows) {
        case 4: block_avx512<4>(P, m0, n0); return;
        case 3: block_avx512<3>(P, m0, n0); return;
        case 2: block_avx512<2>(P, m0, n0); return;
        default: block_avx512<1>(P, m0, n0); return;
      }
    }
  }
#endif
  block_portable(P, m0, rows, n0, width);
}

template <typename T>
void run(const Problem<T>& P) {
  const int64_t num_blocks = (P.N + kChannels - 1) / kChannels;
  // NOTE: 16 blocks (64 rows of W) per task at least: a thread streams a long, contiguous stretch of W
  at::parallel_for(0, num_blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t g0 = 0; g0 < P.M; g0 += kRowGroup) {
      const int64_t g1 = std::min(P.M, g0 + kRowGroup);
      for (int64_t b = begin; b < end; ++b) {
        const int64_t n0 = b * kChannels, width = std::min(kChannels, P.N - n0);
        for (int64_t m0 = g0; m0 < g1; m0 += kRows) block(P, m0, std::min(kRows, g1 - m0), n0, width);
      }
    }
  });
}

template <typename T>
void launch(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, at::Tensor& y) {
  const Problem<T> P{x.size(0), w.size(0), w.size(1), x.const_data_ptr<T>(), w.const_data_ptr<T>(),
                     bias.defined() ? bias.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
  if (P.M > 0 && P.N > 0) run(P);
}

}  // namespace

bool dense_linear_bf16_dot() {
#if defined(INFER_DENSE_BF16_AVX512)
  return true;
#else
  return false;
#endif
}

// x: [M, K] fp32 or bf16; weight: [N, K] of x's dtype (contiguous rows); bias: [N] or none -> [M, N], x's dtype
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "dense_linear: x [M, K] and weight [N, K] expected, got ", x.sizes(), " and ", weight.sizes());
  const auto dtype = x.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && weight.scalar_type() == dtype,
              "dense_linear: x and weight must both be fp32 or both bf16, got ", x.scalar_type(), " and ",
              weight.scalar_type());
  TORCH_CHECK(weight.stride(1) == 1, "dense_linear: the weight's rows must be contiguous");
  const at::Tensor xc = x.contiguous();
  const at::Tensor w = weight.stride(0) == weight.size(1) ? weight : weight.contiguous();
  at::Tensor b;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == weight.size(0), "dense_linear: bias must be [N]");
    b = bias->to(at::kFloat).contiguous();
  }
  auto y = at::empty({x.size(0), weight.size(0)}, x.options().dtype(at::kFloat));
  if (dtype == at::kFloat) {
    launch<float>(xc, w, b, y);
    return y;
  }
  launch<c10::BFloat16>(xc, w, b, y);
  return y.to(at::kBFloat16);  // one rounding, as torch's bf16 GEMM does
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("dense_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("dense_linear_bf16_dot() -> bool", &infer_cpu::dense_linear_bf16_dot);
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("dense_linear", &infer_cpu::dense_linear); }
