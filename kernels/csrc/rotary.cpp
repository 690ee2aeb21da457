// Neox (half-split) rotary embedding for fp32 [tokens, heads, head_dim] on the CPU, at explicit positions.
//
// The reference (kernels/rotary.py) is eight torch ops a call (slice, cast, chunk, cat, two muls, add, cast);
// at batch 1 that is ~10 us of dispatch per layer for 15 heads of 64. Here one pass per (token, head):
// out[i] = x1 cos - x2 sin, out[half + i] = x2 cos + x1 sin, with (x1, x2) the two halves of the first
// rotary_dim values and (cos, sin) read from the cos/sin table at the token's position; dimensions past
// rotary_dim are copied. Each pair is read before it is written, so `out` may be `x` itself (in place).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>

namespace infer_cpu {
namespace {

constexpr int64_t kRowsPerTask = 64;  // (token, head) rows below this stay on the calling thread

}  // namespace

// x: [T, H, D] fp32, last dim contiguous, other strides free; positions: [T] int64;
// cache: [max_positions, rotary_dim] fp32 (cos | sin); out: like x (may be x), or a new contiguous tensor
at::Tensor rotary(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cache,
                  const std::optional<at::Tensor>& out_arg) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && cache.scalar_type() == at::kFloat, "rotary: fp32 only");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "rotary: x must be [tokens, heads, head_dim], rows contiguous");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 && positions.size(0) == x.size(0),
              "rotary: positions must be [tokens] int64");
  TORCH_CHECK(cache.dim() == 2 && cache.is_contiguous() && cache.size(1) % 2 == 0 && cache.size(1) <= x.size(2),
              "rotary: cache must be [max_positions, rotary_dim], rotary_dim even and <= head_dim");
  at::Tensor out = out_arg.has_value() ? *out_arg : at::empty(x.sizes(), x.options());
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == at::kFloat && out.stride(2) == 1,
              "rotary: out must be shaped like x, fp32, rows contiguous");
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = cache.size(1) / 2;
  const int64_t max_pos = cache.size(0);
  const at::Tensor pos = positions.contiguous();
  const int64_t* pp = pos.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pp[t] >= 0 && pp[t] < max_pos, "rotary: position ", pp[t], " outside the table of ", max_pos);
  }
  const float* xp = x.const_data_ptr<float>();
  const float* cp = cache.const_data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), os0 = out.stride(0), os1 = out.stride(1);
  at::parallel_for(0, T * H, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r / H, h = r % H;
      const float* __restrict cs = cp + pp[t] * 2 * half;
      const float* src = xp + t * xs0 + h * xs1;
      float* dst = op + t * os0 + h * os1;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = src[i], x2 = src[half + i], c = cs[i], s = cs[half + i];
        dst[i] = x1 * c - x2 * s;
        dst[half + i] = x2 * c + x1 * s;
      }
      if (dst != src) {
        for (int64_t i = 2 * half; i < D; ++i) dst[i] = src[i];
      }
    }
  });
  return out;
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("rotary(Tensor x, Tensor positions, Tensor cache, Tensor? out) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("rotary", &infer_cpu::rotary); }
