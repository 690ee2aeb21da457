// The compiled kernels' C++ entry points, as the fused decoder stack (decoder_stack.cpp) calls them: directly,
// not through the dispatcher. Each is defined, documented and registered as an op in its own source.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace infer_cpu {

// dense_linear.cpp: fp32 or bf16 x [M, K] . weight [N, K]^T + bias, each row the same whatever M
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias);

// int8_linear.cpp: x [M, K] . (scale * q)^T + bias, q packed by kernels/int8.py
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t out_features);

// int4_linear.cpp: x [M, K] . dequantize(packed)^T + bias, packed by kernels/int4.py (fp16, fp32 or two-level
// scales)
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features);
// the same for 5-bit codes (kernels/int4.py: Int5Weight, a group's fifth bits after its nibbles)
at::Tensor int5_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features);

// int6_linear.cpp: x [M, K] . dequantize(packed)^T + bias, packed by kernels/int6.py (Q6_K's 6-bit codes and
// two-level scales)
at::Tensor int6_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features);

// int8g_linear.cpp: x [M, K] . dequantize(packed)^T + bias, packed by kernels/int8g.py (groups of 16 or 32;
// scale_bytes 2: fp16, 4: fp32, 1: two-level)
at::Tensor int8g_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                        int64_t out_features, int64_t group, int64_t scale_bytes, bool has_min);

// rms_norm.cpp
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps);

// rotary.cpp
at::Tensor rotary(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cache,
                  const std::optional<at::Tensor>& out_arg);

// paged_attention.cpp: writes this step's K/V into the caches, then attends
at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping,
                           const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, double scale, int64_t sliding_window, double softcap);

}  // namespace infer_cpu
