// fp32 linear layer for a few rows (decode at batch 1-4): y = x . W^T + bias, W [N, K] row-major as loaded.
//
// With one to four rows the layer is a matrix-vector product: the time is reading W once from memory.
// (torch's matmul reaches 11-15 GB/s there on 2 threads; streaming reaches the machine's bandwidth.)
// A thread owns blocks of 4 output channels and walks their 4 weight rows side by side, 16 floats at a
// time, with one accumulator per (row of x, channel); the sums are reduced once at the end of K.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kMaxSmallRows = 4;  // rows of x this kernel takes; more rows go to torch's GEMM
constexpr int64_t kChannels = 4;      // output channels per block

struct Gemv {
  int64_t N, K;
  const float* x;     // [R, K]
  const float* w;     // [N, K]
  const float* bias;  // [N] or null
  float* y;           // [R, N]
};

template <int R>
void block_generic(const Gemv& G, int64_t n0, int64_t width) {
  float acc[R][kChannels] = {};
  for (int64_t c = 0; c < width; ++c) {
    for (int r = 0; r < R; ++r) acc[r][c] = dot(G.x + r * G.K, G.w + (n0 + c) * G.K, G.K);
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t c = 0; c < width; ++c) G.y[r * G.N + n0 + c] = acc[r][c] + (G.bias ? G.bias[n0 + c] : 0.f);
  }
}

#if defined(__AVX512F__)
template <int R>
void block_avx512(const Gemv& G, int64_t n0) {  // 4 whole channels
  __m512 acc[R][kChannels];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const float* w0 = G.w + n0 * G.K;
  const int64_t k_vec = G.K / 16 * 16;
  for (int64_t k = 0; k < k_vec; k += 16) {
    __m512 w[kChannels];
    for (int c = 0; c < kChannels; ++c) w[c] = _mm512_loadu_ps(w0 + c * G.K + k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(G.x + r * G.K + k);
      for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kChannels; ++c) {
      float s = _mm512_reduce_add_ps(acc[r][c]);
      for (int64_t k = k_vec; k < G.K; ++k) s += G.x[r * G.K + k] * w0[c * G.K + k];
      G.y[r * G.N + n0 + c] = s + (G.bias ? G.bias[n0 + c] : 0.f);
    }
  }
}
#endif

template <int R>
void run(const Gemv& G) {
  const int64_t num_blocks = (G.N + kChannels - 1) / kChannels;
  // NOTE: 16 blocks (64 rows of W) per task at least: a thread streams a long, contiguous stretch of W
  at::parallel_for(0, num_blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kChannels, width = std::min(kChannels, G.N - n0);
#if defined(__AVX512F__)
      if (width == kChannels) {
        block_avx512<R>(G, n0);
        continue;
      }
#endif
      block_generic<R>(G, n0, width);
    }
  });
}

}  // namespace

// x: [M, K] fp32, M <= 4; weight: [N, K] fp32 (contiguous rows); bias: [N] fp32 or none -> [M, N] fp32
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "small_linear: x [M, K] and weight [N, K] expected, got ", x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(x.size(0) <= kMaxSmallRows, "small_linear: at most ", kMaxSmallRows, " rows, got ", x.size(0));
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "small_linear: fp32 only");
  TORCH_CHECK(weight.stride(1) == 1, "small_linear: the weight's rows must be contiguous");
  const at::Tensor xc = x.contiguous();
  at::Tensor w = weight.stride(0) == weight.size(1) ? weight : weight.contiguous();
  at::Tensor b;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == weight.size(0), "small_linear: bias must be [N]");
    b = bias->to(at::kFloat).contiguous();
  }
  auto y = at::empty({x.size(0), weight.size(0)}, x.options());
  const Gemv G{weight.size(0), weight.size(1), xc.const_data_ptr<float>(), w.const_data_ptr<float>(),
               bias.has_value() ? b.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>()};
  switch (x.size(0)) {
    case 0: break;
    case 1: run<1>(G); break;
    case 2: run<2>(G); break;
    case 3: run<3>(G); break;
    default: run<4>(G); break;
  }
  return y;
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) { m.def("small_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("small_linear", &infer_cpu::small_linear); }
