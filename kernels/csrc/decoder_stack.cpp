// The decoder layers of a model in one call: the fused path of the compiled CPU backend (kernels/fused.py).
//
// The per-op path runs ~12 ops per layer from Python (norm, qkv, rotary, attention, o_proj, add + norm,
// gate/up, silu * mul, down, add), each a Python call and a trip through the dispatcher: ~1.5 ms of host
// work per step for 30 layers, as much as the attention. Here a `DecoderStack` holds every layer's weights
// (built once at load) and its forward calls the same kernels directly, layer after layer, in the same
// order with the same arguments, so the result is bit-identical to the per-op path for any rows (decode
// tokens and prefill chunks alike). Linear layers go through one entry, `linear`, that switches on the
// weight's format (kernels/packed.py: a format's `format_id` and `fused_args`); a new format is one more case.
// It knows no model family, only traits: sandwich norms or not, gelu or silu, q/k norms and a qkv bias where a
// layer has them, and each layer's attention scale, soft-cap, window and RoPE table.

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <vector>

#include "ops.h"

namespace infer_cpu {
namespace {

// kernels/fused.py: FLOAT_FORMAT; the packed formats' `format_id` (int8.py, int4.py, int8g.py; int4.py's Int5Weight,
// int6.py)
enum Format : int64_t { kFloat = 0, kInt8 = 1, kInt4 = 2, kInt8G = 3, kInt5 = 4, kInt6 = 5 };

struct Linear {
  int64_t format = kFloat;
  at::Tensor weight;  // kFloat: [N, K] fp32, rows contiguous; kInt8: packed [N_pad / 16, K_pad / 2, 16, 2];
                      // kInt4: packed [N_pad / 16, K_pad / 32, 320 | 384] or [N_pad / 16, K / 256, 2368]
                      // (two-level scales); kInt8G: packed [N_pad / 16, K / G, block] or [.., K / 256, block];
                      // kInt5: as kInt4 with 384 | 448 or 2880; kInt6: packed [N_pad / 16, K / 256, 3360]
  at::Tensor scale;   // kInt8: [N_pad] fp32 (kInt4 and kInt8G keep their scales in the blocks)
  c10::optional<at::Tensor> bias;
  int64_t out_features = 0;
  int64_t group = 0, scale_bytes = 0;  // kInt8G: the layout (its aux tensor: group, scale bytes, has_min;
                                       // scale bytes 2: fp16, 4: fp32, 1: two-level, as int8g_linear takes it)
  bool has_min = false;
};

// each kernel call is a profiler event (benchmarks/profile_step.py counts their time as kernel time)
#define KERNEL_EVENT(name) RECORD_FUNCTION("infer_cpu::" name, std::vector<c10::IValue>())

// x [M, K] -> [M, N]: the kernel the per-op path runs for this weight (any row count: batch-invariant)
at::Tensor linear(const at::Tensor& x, const Linear& w) {
  KERNEL_EVENT("linear");
  switch (w.format) {
    case kInt8: return int8_linear(x, w.weight, w.scale, w.bias, w.out_features);
    case kInt4: return int4_linear(x, w.weight, w.bias, w.out_features);
    case kInt5: return int5_linear(x, w.weight, w.bias, w.out_features);
    case kInt6: return int6_linear(x, w.weight, w.bias, w.out_features);
    case kInt8G: return int8g_linear(x, w.weight, w.bias, w.out_features, w.group, w.scale_bytes, w.has_min);
    default: return dense_linear(x, w.weight, w.bias);
  }
}

struct Layer {
  at::Tensor input_norm, post_attention_norm;
  at::Tensor q_norm, k_norm;                 // per-head norms before RoPE; undefined where the model has none
  at::Tensor pre_ffn_norm, post_ffn_norm;    // the sandwich's norms around the MLP; undefined without one
  Linear qkv, o, gate_up, down;
  double scale = 1.0, softcap = 0.0;         // softcap 0: off
  int64_t window = 0, rope = 0;              // window 0: global; rope: the layer's cos/sin table
};

at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  KERNEL_EVENT("rms_norm");
  return rms_norm(x, weight, eps);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cache) {
  KERNEL_EVENT("rotary");
  return rotary(x, positions, cache, {});
}

at::Tensor optional_tensor(const at::Tensor& t) { return t.numel() > 0 ? t : at::Tensor(); }

}  // namespace

class DecoderStack : public torch::CustomClassHolder {
 public:
  DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, bool sandwich, bool gelu,
               std::vector<at::Tensor> rope_caches)
      : H_(num_heads), KVH_(num_kv_heads), D_(head_dim), eps_(eps), sandwich_(sandwich), gelu_(gelu),
        rope_caches_(std::move(rope_caches)) {}

  // norms: input, post-attention, q, k, pre-ffn, post-ffn (empty tensors where the model has none);
  // linears: qkv, o, gate_up, down as (weight, aux, bias) each, empty where absent (aux: kInt8's scale, kInt8G's
  // layout [group, scale bytes (1: two-level), has_min] int64; kInt4's block size tells its scales); attention:
  // scale, softcap
  void add_layer(std::vector<at::Tensor> norms, std::vector<at::Tensor> linears, std::vector<int64_t> formats,
                 std::vector<int64_t> out_features, std::vector<double> attention, int64_t window, int64_t rope) {
    TORCH_CHECK(norms.size() == 6 && linears.size() == 12 && formats.size() == 4 && out_features.size() == 4 &&
                    attention.size() == 2, "DecoderStack.add_layer: 6 norms, 4 linears (12 tensors), 2 attention values");
    TORCH_CHECK(rope >= 0 && rope < static_cast<int64_t>(rope_caches_.size()), "DecoderStack.add_layer: no rope ", rope);
    Layer L;
    L.input_norm = norms[0], L.post_attention_norm = norms[1];
    L.q_norm = optional_tensor(norms[2]), L.k_norm = optional_tensor(norms[3]);
    L.pre_ffn_norm = optional_tensor(norms[4]), L.post_ffn_norm = optional_tensor(norms[5]);
    Linear* targets[4] = {&L.qkv, &L.o, &L.gate_up, &L.down};
    for (int i = 0; i < 4; ++i) {
      TORCH_CHECK(formats[i] >= kFloat && formats[i] <= kInt6, "DecoderStack.add_layer: unknown format ", formats[i]);
      const at::Tensor& weight = linears[3 * i];
      TORCH_CHECK(formats[i] != kFloat || (weight.scalar_type() == at::kFloat && weight.is_contiguous()),
                  "DecoderStack.add_layer: a float weight must be contiguous fp32");
      const at::Tensor bias = optional_tensor(linears[3 * i + 2]);
      *targets[i] = Linear{formats[i], weight, linears[3 * i + 1],
                           bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, out_features[i]};
      if (formats[i] == kInt8G) {
        const at::Tensor layout = linears[3 * i + 1].contiguous();
        TORCH_CHECK(layout.scalar_type() == at::kLong && layout.numel() == 3,
                    "DecoderStack.add_layer: an int8g layout is [group, scale_bytes, has_min] int64");
        const int64_t* v = layout.const_data_ptr<int64_t>();
        targets[i]->group = v[0], targets[i]->scale_bytes = v[1], targets[i]->has_min = v[2] != 0;
      }
    }
    L.scale = attention[0], L.softcap = attention[1], L.window = window, L.rope = rope;
    TORCH_CHECK(sandwich_ == L.pre_ffn_norm.defined() && sandwich_ == L.post_ffn_norm.defined(),
                "DecoderStack.add_layer: sandwich norms expected ", sandwich_);
    layers_.push_back(std::move(L));
  }

  // the KV cache of every layer, [num_blocks, block_size, kv_heads, head_dim] each (bound once per runner)
  void set_caches(std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches) {
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
                "DecoderStack.set_caches: one K and one V cache per layer");
    k_caches_ = std::move(k_caches), v_caches_ = std::move(v_caches);
  }

  // x: [num_tokens, hidden] -> [num_tokens, hidden], every layer in turn
  at::Tensor forward(at::Tensor x, const at::Tensor& positions, const at::Tensor& slots, const at::Tensor& tables,
                     const at::Tensor& query_start_loc, const at::Tensor& seq_lens) {
    TORCH_CHECK(k_caches_.size() == layers_.size(), "DecoderStack.forward: no KV caches bound (set_caches)");
    const Step s{positions, slots, tables.contiguous(), query_start_loc, seq_lens};
    for (size_t i = 0; i < layers_.size(); ++i) x = layer(layers_[i], x, s, k_caches_[i], v_caches_[i]);
    return x;
  }

 private:
  struct Step {
    const at::Tensor& positions;
    const at::Tensor& slots;
    at::Tensor tables;
    const at::Tensor& query_start_loc;
    const at::Tensor& seq_lens;
  };

  // NOTE: each line is the per-op path's (engine/models/base.py): the same kernels on the same views
  at::Tensor layer(const Layer& L, const at::Tensor& x, const Step& s, at::Tensor& kc, at::Tensor& vc) const {
    const int64_t q_size = H_ * D_, kv_size = KVH_ * D_;
    const at::Tensor qkv = linear(norm(x, L.input_norm, eps_), L.qkv);  // [T, q_size + 2 * kv_size]
    const at::Tensor v = qkv.slice(1, q_size + kv_size).view({-1, KVH_, D_});
    const at::Tensor& cache = rope_caches_[L.rope];
    at::Tensor q, k;
    if (L.q_norm.defined()) {
      q = rope(norm(qkv.slice(1, 0, q_size).view({-1, H_, D_}), L.q_norm, eps_), s.positions, cache);
      k = rope(norm(qkv.slice(1, q_size, q_size + kv_size).view({-1, KVH_, D_}), L.k_norm, eps_), s.positions,
               cache);
    } else {
      const at::Tensor qk = rope(qkv.slice(1, 0, q_size + kv_size).view({-1, H_ + KVH_, D_}), s.positions, cache);
      q = qk.slice(1, 0, H_), k = qk.slice(1, H_);
    }
    at::Tensor attn;
    {
      KERNEL_EVENT("paged_attention");
      attn = paged_attention(q, k, v, kc, vc, s.slots, s.tables, s.query_start_loc, s.seq_lens, L.scale, L.window,
                             L.softcap);
    }
    const at::Tensor o = linear(attn.reshape({-1, q_size}), L.o);
    if (!sandwich_) {
      // pre-norm: one norm before the MLP, fused with the residual add
      at::Tensor normed, h;
      {
        KERNEL_EVENT("fused_add_rms_norm");
        std::tie(normed, h) = fused_add_rms_norm(o, x, L.post_attention_norm, eps_);
      }
      return at::add(h, mlp(L, normed));
    }
    // sandwich norms: after attention, and before and after the MLP
    const at::Tensor residual = at::add(x, norm(o, L.post_attention_norm, eps_));
    return at::add(residual, norm(mlp(L, norm(residual, L.pre_ffn_norm, eps_)), L.post_ffn_norm, eps_));
  }

  at::Tensor mlp(const Layer& L, const at::Tensor& x) const {
    const at::Tensor gate_up = linear(x, L.gate_up);  // [T, 2 * intermediate]
    const std::vector<at::Tensor> halves = gate_up.chunk(2, -1);
    const at::Tensor act = gelu_ ? at::gelu(halves[0], "tanh") : at::silu(halves[0]);
    return linear(at::mul(act, halves[1]), L.down);
  }

  int64_t H_, KVH_, D_;
  double eps_;
  bool sandwich_, gelu_;
  std::vector<at::Tensor> rope_caches_;
  std::vector<Layer> layers_;
  std::vector<at::Tensor> k_caches_, v_caches_;
};

at::Tensor decoder_stack(const c10::intrusive_ptr<DecoderStack>& stack, const at::Tensor& x,
                         const at::Tensor& positions, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& query_start_loc, const at::Tensor& seq_lens) {
  return stack->forward(x, positions, slot_mapping, block_tables, query_start_loc, seq_lens);
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.class_<infer_cpu::DecoderStack>("DecoderStack")
      .def(torch::init<int64_t, int64_t, int64_t, double, bool, bool, std::vector<at::Tensor>>())
      .def("add_layer", &infer_cpu::DecoderStack::add_layer)
      .def("set_caches", &infer_cpu::DecoderStack::set_caches);
  m.def(
      "decoder_stack(__torch__.torch.classes.infer_cpu.DecoderStack stack, Tensor x, Tensor positions, "
      "Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("decoder_stack", &infer_cpu::decoder_stack); }
