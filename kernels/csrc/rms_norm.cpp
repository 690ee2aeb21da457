// RMSNorm and residual-add + RMSNorm for fp32 rows on the CPU: y = weight * x / sqrt(mean(x^2) + eps).
//
// torch's CPU rms_norm is a composite of five or six ops (pow, mean, add, rsqrt, mul), ~13 us a call for
// one 576-wide row here; a decode step calls it twice per layer. This does one pass to sum the squares
// and one to scale, per row; rows are split over threads only when there are many (a decode row runs
// on the calling thread, with no fork). The residual variant writes x + residual into a new tensor and
// normalises that, leaving both inputs untouched, like the reference.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

namespace infer_cpu {
namespace {

constexpr int64_t kRowsPerTask = 16;  // rows below this stay on the calling thread

inline void norm_row(const float* __restrict x, const float* __restrict w, float* __restrict y, int64_t n,
                     float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * inv);
}

// x: [rows, n] viewed through its row stride (the last dimension contiguous)
void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, name, ": fp32 only");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && x.size(-1) == weight.size(0), name,
              ": weight must be [hidden], hidden = x's last dimension");
  TORCH_CHECK(x.stride(-1) == 1, name, ": x's last dimension must be contiguous");
}

}  // namespace

// x: [T, n] or [T, heads, n] fp32, the last dimension contiguous, the others any stride (Qwen3's q/k norm
// runs on the heads of a fused qkv projection)
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "rms_norm");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "rms_norm: x must be [T, n] or [T, heads, n]");
  const int64_t n = x.size(-1);
  at::Tensor out = at::empty(x.sizes(), x.options());  // contiguous
  if (out.numel() == 0) return out;
  const int64_t inner = x.dim() == 3 ? x.size(1) : 1, outer_stride = x.stride(0);
  const int64_t inner_stride = x.dim() == 3 ? x.stride(1) : 0;
  const float* xp = x.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  float* yp = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, x.size(0) * inner, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      norm_row(xp + (r / inner) * outer_stride + (r % inner) * inner_stride, wp, yp + r * n, n, e);
    }
  });
  return out;
}

// (weight * norm(x + residual), x + residual); x, residual: [T, n] fp32
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps) {
  check_rows(x, weight, "fused_add_rms_norm");
  TORCH_CHECK(x.dim() == 2 && residual.sizes() == x.sizes() && residual.scalar_type() == at::kFloat &&
                  residual.stride(-1) == 1,
              "fused_add_rms_norm: x and residual must be [T, hidden] fp32, rows contiguous");
  const int64_t num_rows = x.size(0), n = x.size(1);
  at::Tensor summed = at::empty(x.sizes(), x.options());
  at::Tensor out = at::empty(x.sizes(), x.options());
  const float* xp = x.const_data_ptr<float>();
  const float* rp = residual.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  float* sp = summed.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  const int64_t xs = x.stride(0), rs = residual.stride(0);
  const float e = static_cast<float>(eps);
  at::parallel_for(0, num_rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* __restrict a = xp + r * xs;
      const float* __restrict b = rp + r * rs;
      float* __restrict s = sp + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) s[i] = a[i] + b[i];
      norm_row(s, wp, yp + r * n, n, e);
    }
  });
  return {out, summed};
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) {
  m.impl("rms_norm", &infer_cpu::rms_norm);
  m.impl("fused_add_rms_norm", &infer_cpu::fused_add_rms_norm);
}
