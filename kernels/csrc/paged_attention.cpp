// Paged, variable-length attention on the CPU: the compiled twin of
// kernels/attention.py's paged_attention_ref (same metadata, same results).
//
// One call serves a flat batch of decode tokens and prefill chunks. K/V are
// read in place through the block tables (no gather). A work item is one
// (sequence, KV head, chunk of up to kQueryChunk query tokens); its rows are
// the chunk's tokens times the query heads sharing that KV head (GQA folded),
// so each K/V row is loaded once per item. Online softmax in fp32; fp32 or
// bf16 caches. Items run on at::parallel_for threads, longest first, pulled
// from a shared counter. With fewer items than threads (one decode token on
// one KV head: Gemma 3) an item's query heads are split between items, each
// row computed exactly as it would be whole.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "attention_avx512.h"
#include "common.h"

namespace infer_cpu {
namespace {

constexpr int64_t kQueryChunk = 16;  // query tokens per work item of a prefill chunk
constexpr int64_t kPrefetchBlocks = 2;
constexpr int kPrefetchLocality = 2;

struct Layout {
  int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks;
  int64_t q_token_stride, q_head_stride;  // query may be a strided view (the fused qkv)
  int64_t out_token_stride;
  float scale, softcap;  // softcap 0: off
  int64_t window;        // 0: off; else a query sees keys at distance < window
};

struct WorkItem {
  int64_t seq, kv_head, q_begin, q_end;  // query tokens [q_begin, q_end) of the sequence's new tokens
  int64_t g_begin, g_end;                // the query heads [g_begin, g_end) of the KV head's group
  int64_t cost;
};

// Per-thread scratch for one item: rows = chunk tokens x group heads.
struct Scratch {
  std::vector<float> q, acc, m, l, scores, k_tile, v_tile, row_scores;  // row_scores: [rows][16] (AVX-512 tiles)
  std::vector<int64_t> row_first, row_count;                            // [rows]: a row's keys in the chunk
  void resize(int64_t rows, int64_t head_dim, int64_t block_size) {
    q.resize(rows * head_dim);
    acc.assign(rows * head_dim, 0.f);
    m.assign(rows, -std::numeric_limits<float>::infinity());
    l.assign(rows, 0.f);
    scores.resize(block_size);
    k_tile.resize(block_size * head_dim);
    v_tile.resize(block_size * head_dim);
    row_scores.resize(rows * 16);
    row_first.resize(rows);
    row_count.resize(rows);
  }
};

// n cache rows of one KV head (head_dim values each, `stride` apart) towards the cache: the next block's, read
// while this one is computed (a block sits anywhere in the cache, past the hardware prefetcher's streams: a
// decode at 1,000 tokens of context waited on memory for 2/3 of its time)
template <typename T>
inline void prefetch_rows(const T* first, int64_t stride, int64_t n, int64_t head_dim) {
  const int64_t bytes = head_dim * static_cast<int64_t>(sizeof(T));
  for (int64_t t = 0; t < n; ++t) {
    const char* row = reinterpret_cast<const char*>(first + t * stride);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, kPrefetchLocality);
  }
}

// n cache rows of one KV head as fp32 rows: in place for fp32, converted into `tile` for bf16.
template <typename T>
const float* rows_as_float(const T* first, int64_t stride, int64_t n, int64_t head_dim, float* tile,
                           int64_t* out_stride) {
  if constexpr (std::is_same_v<T, float>) {
    *out_stride = stride;
    return first;
  } else {
    for (int64_t t = 0; t < n; ++t) to_float(first + t * stride, tile + t * head_dim, head_dim);
    *out_stride = head_dim;
    return tile;
  }
}

// One row's online-softmax update over visible keys [t0, t1) of a tile starting at key `tile_start`.
inline void attend_row(const Layout& L, const float* q, float* acc, float& m, float& l, const float* k,
                       int64_t k_stride, const float* v, int64_t v_stride, int64_t t0, int64_t t1,
                       float* scores) {
  const int64_t D = L.head_dim, n = t1 - t0;
  float tile_max = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) {
    float s = dot(q, k + (t0 + t) * k_stride, D);
    if (L.softcap > 0.f) s = L.softcap * std::tanh(s / L.softcap);
    scores[t] = s;
    tile_max = std::max(tile_max, s);
  }
  const float new_m = std::max(m, tile_max);
  if (new_m > m) {
    const float correction = exp_nonpositive(m - new_m);  // 0 when m is -inf
    l *= correction;
    scale_in_place(correction, acc, D);
    m = new_m;
  }
#pragma omp simd
  for (int64_t t = 0; t < n; ++t) scores[t] = exp_nonpositive(scores[t] - new_m);
  for (int64_t t = 0; t < n; ++t) {
    l += scores[t];
    axpy(scores[t], v + (t0 + t) * v_stride, acc, D);
  }
}

// where a row's visible keys are within a tile: rows r = token * heads + g from position pos_begin
struct RowSpan {
  int64_t pos_begin, heads, t_begin, t_end;
  // row r's visible keys (pos - window, pos] within the tile, as [t0, t1) from t_begin: empty when t0 >= t1
  void visible(const Layout& L, int64_t r, int64_t* t0, int64_t* t1) const {
    const int64_t pos = pos_begin + r / heads;
    *t0 = (L.window > 0 ? std::max(t_begin, pos - L.window + 1) : t_begin) - t_begin;
    *t1 = std::min(t_end, pos + 1) - t_begin;
  }
};

#if defined(__AVX512F__)
// Every row's online-softmax update over one tile of keys [t_begin, t_end), in phases: each row's scores of its
// next chunk of up to 16 keys, then each row's softmax and values. The rows are independent, so one row's
// latency chain (scores -> max -> exp -> the value sums) overlaps the next row's work: the rows of one KV head
// (GQA's query heads, a speculative step's tokens) took ~700 cycles a row and chunk one at a time. A row's
// chunks start at its first visible key, in order: each row the same operations as alone.
template <int C>
void attend_tile_x16(const Layout& L, Scratch& S, int64_t rows, const RowSpan& span, const float* k,
                     int64_t k_stride, const float* v, int64_t v_stride) {
  const int64_t D = L.head_dim;
  for (int64_t chunk = 0;; chunk += 16) {
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      int64_t t0, t1;
      span.visible(L, r, &t0, &t1);
      const int64_t j0 = t0 + chunk;
      S.row_count[r] = j0 < t1 ? std::min<int64_t>(16, t1 - j0) : 0;
      if (S.row_count[r] == 0) continue;
      S.row_first[r] = j0;
      const __m512 s = scores_x16<C>(S.q.data() + r * D, k, k_stride, j0, static_cast<int>(S.row_count[r]), L.softcap);
      _mm512_storeu_ps(S.row_scores.data() + 16 * r, s);
      any = true;
    }
    if (!any) return;
    for (int64_t r = 0; r < rows; ++r) {
      if (S.row_count[r] == 0) continue;
      accumulate_x16<C>(_mm512_loadu_ps(S.row_scores.data() + 16 * r), static_cast<int>(S.row_count[r]),
                        S.acc.data() + r * D, S.m[r], S.l[r], v, v_stride, S.row_first[r]);
    }
  }
}
#endif

template <typename T>
void run_item(const Layout& L, const WorkItem& w, const T* query, const T* k_cache, const T* v_cache,
              const int32_t* block_table, int64_t first_token, int64_t first_pos, T* out, Scratch& S) {
  const int64_t D = L.head_dim, G = L.num_heads / L.num_kv_heads, BS = L.block_size;
  const int64_t num_q = w.q_end - w.q_begin, heads = w.g_end - w.g_begin, rows = num_q * heads;
  S.resize(rows, D, BS);
  // rows: r = token * heads + g, query head kv_head * G + g_begin + g; q pre-scaled, in fp32
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = query + (first_token + w.q_begin + r / heads) * L.q_token_stride +
                   (w.kv_head * G + w.g_begin + r % heads) * L.q_head_stride;
    to_float(src, S.q.data() + r * D, D);
    scale_in_place(L.scale, S.q.data() + r * D, D);
  }
  const int64_t pos_begin = first_pos + w.q_begin, pos_last = first_pos + w.q_end - 1;
  const int64_t lo = L.window > 0 ? std::max<int64_t>(0, pos_begin - L.window + 1) : 0;
  const int64_t row_stride = L.num_kv_heads * D;  // between tokens of a block, one head
  for (int64_t blk = lo / BS; blk <= pos_last / BS; ++blk) {
    const int64_t phys = block_table[blk];
    const int64_t t_begin = std::max(lo, blk * BS), t_end = std::min(pos_last + 1, (blk + 1) * BS);
    const int64_t first = (phys * BS + (t_begin - blk * BS)) * row_stride + w.kv_head * D;
    if (blk + kPrefetchBlocks <= pos_last / BS) {
      const int64_t next = block_table[blk + kPrefetchBlocks] * BS * row_stride + w.kv_head * D;
      prefetch_rows(k_cache + next, row_stride, BS, D);
      prefetch_rows(v_cache + next, row_stride, BS, D);
    }
    int64_t k_stride, v_stride;
    const float* k = rows_as_float(k_cache + first, row_stride, t_end - t_begin, D, S.k_tile.data(), &k_stride);
    const float* v = rows_as_float(v_cache + first, row_stride, t_end - t_begin, D, S.v_tile.data(), &v_stride);
    const RowSpan span{pos_begin, heads, t_begin, t_end};
#if defined(__AVX512F__)
    if (D == 64 || D == 128 || D == 256) {  // NOTE: 256 is Gemma 3's (its plain loops took 24% of a 16-row step)
      if (D == 64) attend_tile_x16<4>(L, S, rows, span, k, k_stride, v, v_stride);
      else if (D == 128) attend_tile_x16<8>(L, S, rows, span, k, k_stride, v, v_stride);
      else attend_tile_x16<16>(L, S, rows, span, k, k_stride, v, v_stride);
      continue;
    }
#endif
    for (int64_t r = 0; r < rows; ++r) {
      int64_t t0, t1;
      span.visible(L, r, &t0, &t1);
      if (t0 >= t1) continue;
      float* q = S.q.data() + r * D;
      float* acc = S.acc.data() + r * D;
      attend_row(L, q, acc, S.m[r], S.l[r], k, k_stride, v, v_stride, t0, t1, S.scores.data());
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* acc = S.acc.data() + r * D;
    scale_in_place(1.f / S.l[r], acc, D);
    T* dst = out + (first_token + w.q_begin + r / heads) * L.out_token_stride +
             (w.kv_head * G + w.g_begin + r % heads) * D;
    from_float(acc, dst, D);
  }
}

std::vector<WorkItem> plan_items(const int32_t* qsl, const int32_t* seq_lens, int64_t num_seqs, const Layout& L,
                                 int64_t num_threads) {
  const int64_t G = L.num_heads / L.num_kv_heads, window = L.window;
  int64_t whole = 0;  // items of whole groups
  for (int64_t s = 0; s < num_seqs; ++s) whole += (qsl[s + 1] - qsl[s] + kQueryChunk - 1) / kQueryChunk * L.num_kv_heads;
  // NOTE: fewer items than threads: each group's heads in `parts` items, so that every thread has work
  const int64_t parts = whole > 0 && whole < num_threads ? std::min(G, (num_threads + whole - 1) / whole) : 1;
  std::vector<WorkItem> items;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = qsl[s + 1] - qsl[s], first_pos = seq_lens[s] - q_len;
    for (int64_t q0 = 0; q0 < q_len; q0 += kQueryChunk) {
      const int64_t q1 = std::min(q_len, q0 + kQueryChunk);
      const int64_t keys = window > 0 ? std::min(first_pos + q1, window + q1 - q0) : first_pos + q1;
      for (int64_t h = 0; h < L.num_kv_heads; ++h)
        for (int64_t p = 0; p < parts; ++p) {
          const int64_t g0 = G * p / parts, g1 = G * (p + 1) / parts;
          items.push_back({s, h, q0, q1, g0, g1, (q1 - q0) * (g1 - g0) * keys});
        }
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  return items;
}

template <typename T>
void attend_all(const Layout& L, const std::vector<WorkItem>& items, const at::Tensor& query,
                const at::Tensor& k_cache, const at::Tensor& v_cache, const int32_t* tables, const int32_t* qsl,
                const int32_t* seq_lens, at::Tensor& out) {
  const T* q = query.const_data_ptr<T>();
  const T* kc = k_cache.const_data_ptr<T>();
  const T* vc = v_cache.const_data_ptr<T>();
  T* o = out.mutable_data_ptr<T>();
  std::atomic<int64_t> next{0};
  const int64_t num_items = static_cast<int64_t>(items.size());
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_items), 1, [&](int64_t, int64_t) {
    Scratch scratch;
    for (int64_t i = next++; i < num_items; i = next++) {
      const WorkItem& w = items[i];
      const int64_t q_len = qsl[w.seq + 1] - qsl[w.seq];
      run_item<T>(L, w, q, kc, vc, tables + w.seq * L.max_blocks, qsl[w.seq], seq_lens[w.seq] - q_len, o,
                  scratch);
    }
  });
}

template <typename T>
void write_kv_typed(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                    const int64_t* slots) {
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1), D = key.size(2);
  const T* k = key.const_data_ptr<T>();
  const T* v = value.const_data_ptr<T>();
  T* kc = k_cache.mutable_data_ptr<T>();
  T* vc = v_cache.mutable_data_ptr<T>();
  at::parallel_for(0, num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (slots[i] < 0) continue;  // a negative slot skips the token
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const int64_t dst = (slots[i] * num_kv_heads + h) * D;
        std::memcpy(kc + dst, k + i * key.stride(0) + h * key.stride(1), D * sizeof(T));
        std::memcpy(vc + dst, v + i * value.stride(0) + h * value.stride(1), D * sizeof(T));
      }
    }
  });
}

void check_cache(const at::Tensor& cache, const at::Tensor& like, const char* name) {
  TORCH_CHECK(cache.dim() == 4 && cache.is_contiguous(), name, " must be a contiguous [num_blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(cache.scalar_type() == like.scalar_type(), name, " dtype ", cache.scalar_type(), " != ", like.scalar_type());
  TORCH_CHECK(cache.device().is_cpu(), name, " must be on the CPU");
}

}  // namespace

// key, value: [num_tokens, kv_heads, head_dim] (strided rows; last dim contiguous), the cache's dtype
void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  check_cache(k_cache, key, "k_cache");
  check_cache(v_cache, key, "v_cache");
  TORCH_CHECK(key.sizes() == value.sizes() && key.dim() == 3 && key.size(1) == k_cache.size(2) &&
                  key.size(2) == k_cache.size(3), "key/value must be [num_tokens, kv_heads, head_dim] of the cache");
  TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1, "key/value rows must be contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == key.size(0), "slot_mapping must be [num_tokens] int64");
  const int64_t* slots = slot_mapping.const_data_ptr<int64_t>();
  if (key.scalar_type() == at::kFloat) {
    write_kv_typed<float>(key, value, k_cache, v_cache, slots);
  } else {
    TORCH_CHECK(key.scalar_type() == at::kBFloat16, "write_kv: fp32 or bf16 only, got ", key.scalar_type());
    write_kv_typed<c10::BFloat16>(key, value, k_cache, v_cache, slots);
  }
}

// query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]; writes K/V first
at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping,
                           const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, double scale, int64_t sliding_window, double softcap) {
  write_kv(key, value, k_cache, v_cache, slot_mapping);
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1 && query.scalar_type() == k_cache.scalar_type(),
              "query must be [num_tokens, num_heads, head_dim] rows of the cache's dtype");
  for (const at::Tensor* t : {&block_tables, &query_start_loc, &seq_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous(), "metadata tensors must be contiguous int32");
  }
  const int64_t num_seqs = seq_lens.numel();
  TORCH_CHECK(query_start_loc.numel() == num_seqs + 1 && block_tables.size(0) == num_seqs, "metadata sizes differ");
  TORCH_CHECK(query.size(1) % k_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  auto out = at::empty(query.sizes(), query.options());
  const Layout L{query.size(1), k_cache.size(2), k_cache.size(3), k_cache.size(1), block_tables.size(1),
                 query.stride(0), query.stride(1), query.size(1) * query.size(2), static_cast<float>(scale),
                 static_cast<float>(softcap), sliding_window};
  const int32_t* qsl = query_start_loc.const_data_ptr<int32_t>();
  const int32_t* lens = seq_lens.const_data_ptr<int32_t>();
  TORCH_CHECK(qsl[num_seqs] == query.size(0), "query_start_loc must end at num_tokens");
  const auto items = plan_items(qsl, lens, num_seqs, L, at::get_num_threads());
  const int32_t* tables = block_tables.const_data_ptr<int32_t>();
  if (query.scalar_type() == at::kFloat) {
    attend_all<float>(L, items, query, k_cache, v_cache, tables, qsl, lens, out);
  } else {
    attend_all<c10::BFloat16>(L, items, query, k_cache, v_cache, tables, qsl, lens, out);
  }
  return out;
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def(
      "paged_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, float scale, "
      "int sliding_window, float softcap) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) {
  m.impl("paged_attention", &infer_cpu::paged_attention);
}
