// ggml's quantized blocks (the tensors of a GGUF file) straight into the kernels' packed formats (int4, int5,
// int6, int8g), in one pass.
//
// The same bytes as engine/gguf/quants.py's `decode` followed by kernels/int4.py's `pack_int4*`, kernels/int6.py's
// `pack_int6` or kernels/int8g.py's `pack_int8g*` (the Python path is the test oracle and the fallback), without the
// intermediate arrays: a thread owns whole strips of 16 output channels, decodes each channel's source row
// (codes, per-group scales and minimums, or a K-quant's two levels) into a row buffer, and writes the strip's
// blocks. The rows of one output may come from several tensors (fused q/k/v, gate/up) of different types, in any
// order (`order`: llama's interleaved q/k rows put back), so a load reads each file byte once and writes each
// packed byte once; memory is the packed weight's and a row buffer a thread. The pairs the files hold (Q4_0, Q4_1,
// Q4_K -> int4, Q5_0 -> int5, Q6_K -> int6, Q8_0 -> int8g) skip the row buffer (`fast_channel`).
//
// Per group of a type, `w = scale * code + minimum` (the table in quants.py): codes in int8, scale and minimum
// in fp32, or for K-quants d (fp16) times an 8-bit d_sub and m (-dmin) times an 8-bit m_sub. A group of 32 read
// at groups of 16 repeats its scale. Scales are written as fp16 (round to nearest: exact for the file's fp16
// values; an overflow is an error), fp32 (the products, exact) or two-level (d and m as fp16 in the super-block's
// head, d_sub and m_sub as int8 per group).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "huge_pages.h"

namespace infer_cpu {
namespace {

constexpr int64_t kStrip = 16;
constexpr int64_t kSuper = 256;  // K-quants' QK_K

// ggml type ids (ggml.h's enum ggml_type)
enum GgmlType : int64_t {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
};

struct TypeInfo {
  int64_t block;  // weights a block
  int64_t bytes;  // bytes a block
  int64_t group;  // weights a scale
  bool has_min;
  bool k_quant;
  int64_t bits;   // the unsigned codes int4 / int5 / int6 take: 4, 5 (Q5_0's signed codes + 16), 6 (Q6_K's + 32),
                  // else 8
};

TypeInfo type_info(int64_t type) {
  switch (type) {
    case kQ4_0: return {32, 18, 32, true, false, 4};
    case kQ4_1: return {32, 20, 32, true, false, 4};
    case kQ5_0: return {32, 22, 32, false, false, 5};
    case kQ5_1: return {32, 24, 32, true, false, 5};
    case kQ8_0: return {32, 34, 32, false, false, 8};
    case kQ2_K: return {256, 84, 16, true, true, 8};
    case kQ3_K: return {256, 110, 16, false, true, 8};
    case kQ4_K: return {256, 144, 32, true, true, 4};
    case kQ5_K: return {256, 176, 32, true, true, 5};
    case kQ6_K: return {256, 210, 16, false, true, 6};
    default: TORCH_CHECK(false, "ggml_pack: unsupported ggml type ", type);
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// one row decoded: codes, and per group of the type either scale and minimum (fp32), or the two levels
struct Row {
  std::vector<int8_t> codes;   // [cols]
  std::vector<float> scale;    // [cols / group]: d * d_sub for K-quants
  std::vector<float> minimum;  // [cols / group] (zeros for a symmetric type)
  std::vector<float> d, m;     // [cols / 256]: K-quants' fp16 d and -dmin
  std::vector<int8_t> d_sub, m_sub;  // [cols / group]
  void resize(int64_t cols, int64_t group) {
    codes.resize(cols), scale.resize(cols / group), minimum.resize(cols / group);
    d.resize(cols / kSuper + 1), m.resize(cols / kSuper + 1), d_sub.resize(cols / group), m_sub.resize(cols / group);
  }
};

// a block of a non-K type: 32 codes, its scale and minimum
void decode_small(int64_t type, const uint8_t* b, int8_t* q, float& scale, float& minimum) {
  const auto nibbles = [q](const uint8_t* qs) {  // 16 bytes: 16 low nibbles, then 16 high
    for (int i = 0; i < 16; ++i) q[i] = static_cast<int8_t>(qs[i] & 15), q[16 + i] = static_cast<int8_t>(qs[i] >> 4);
  };
  const auto fifth_bit = [q](const uint8_t* qh) {
    uint32_t h;
    std::memcpy(&h, qh, sizeof h);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(q[i] | (((h >> i) & 1u) << 4));
  };
  switch (type) {
    case kQ4_0:
      nibbles(b + 2), scale = half_at(b), minimum = scale * -8.f;
      break;
    case kQ4_1:
      nibbles(b + 4), scale = half_at(b), minimum = half_at(b + 2);
      break;
    case kQ5_0:
      nibbles(b + 6), fifth_bit(b + 2), scale = half_at(b), minimum = 0.f;
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(q[i] - 16);
      break;
    case kQ5_1:
      nibbles(b + 8), fifth_bit(b + 4), scale = half_at(b), minimum = half_at(b + 2);
      break;
    default:  // kQ8_0
      std::memcpy(q, b + 2, 32), scale = half_at(b), minimum = 0.f;
  }
}

// K-quants' 6-bit scales and minimums of 8 groups, from their 12 bytes
void k_scale_min(const uint8_t* s, int8_t* sc, int8_t* mn) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = static_cast<int8_t>(s[i] & 63), mn[i] = static_cast<int8_t>(s[4 + i] & 63);
    sc[4 + i] = static_cast<int8_t>((s[8 + i] & 15) | ((s[i] >> 2) & 0x30));
    mn[4 + i] = static_cast<int8_t>((s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30));
  }
}

// a K-quant super-block: 256 codes, d and m (-dmin; 0 when symmetric), d_sub and m_sub per group
void decode_k(int64_t type, const uint8_t* b, int8_t* q, float& d, float& m, int8_t* d_sub, int8_t* m_sub) {
  switch (type) {
    case kQ2_K: {
      const uint8_t* qs = b + 16;
      for (int c = 0; c < 2; ++c)
        for (int f = 0; f < 4; ++f)
          for (int i = 0; i < 32; ++i) q[c * 128 + f * 32 + i] = static_cast<int8_t>((qs[c * 32 + i] >> (2 * f)) & 3);
      for (int g = 0; g < 16; ++g) d_sub[g] = static_cast<int8_t>(b[g] & 15), m_sub[g] = static_cast<int8_t>(b[g] >> 4);
      d = half_at(b + 80), m = -half_at(b + 82);
      break;
    }
    case kQ3_K: {
      const uint8_t *hmask = b, *qs = b + 32, *raw = b + 96;
      for (int c = 0; c < 2; ++c)
        for (int f = 0; f < 4; ++f)
          for (int i = 0; i < 32; ++i) {
            const int k = c * 128 + f * 32 + i;
            const int low = (qs[c * 32 + i] >> (2 * f)) & 3, high = ((hmask[i] >> (k / 32)) & 1) ^ 1;
            q[k] = static_cast<int8_t>(low - (high << 2));
          }
      for (int j = 0; j < 16; ++j) {
        const int low = (raw[j % 8] >> (4 * (j / 8))) & 15, high = (raw[8 + j % 4] >> (2 * (j / 4))) & 3;
        d_sub[j] = static_cast<int8_t>((low | (high << 4)) - 32), m_sub[j] = 0;
      }
      d = half_at(b + 108), m = 0.f;
      break;
    }
    case kQ4_K:
    case kQ5_K: {
      const uint8_t* qs = b + (type == kQ4_K ? 16 : 48);
      for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 32; ++i)
          q[c * 64 + i] = static_cast<int8_t>(qs[c * 32 + i] & 15), q[c * 64 + 32 + i] = static_cast<int8_t>(qs[c * 32 + i] >> 4);
      if (type == kQ5_K)
        for (int k = 0; k < 256; ++k) q[k] = static_cast<int8_t>(q[k] | (((b[16 + k % 32] >> (k / 32)) & 1) << 4));
      k_scale_min(b + 4, d_sub, m_sub);
      d = half_at(b), m = -half_at(b + 2);
      break;
    }
    default: {  // kQ6_K
      const uint8_t *ql = b, *qh = b + 128;
      for (int c = 0; c < 2; ++c)
        for (int i = 0; i < 64; ++i) {
          const int lo = c * 128 + i, hi = lo + 64;
          q[lo] = static_cast<int8_t>(ql[c * 64 + i] & 15), q[hi] = static_cast<int8_t>(ql[c * 64 + i] >> 4);
        }
      for (int c = 0; c < 2; ++c)
        for (int f = 0; f < 4; ++f)
          for (int i = 0; i < 32; ++i) {
            const int k = c * 128 + f * 32 + i;
            q[k] = static_cast<int8_t>((q[k] | (((qh[c * 32 + i] >> (2 * f)) & 3) << 4)) - 32);
          }
      for (int g = 0; g < 16; ++g) d_sub[g] = static_cast<int8_t>(b[192 + g]), m_sub[g] = 0;
      d = half_at(b + 208), m = 0.f;
    }
  }
}

// a row of one source tensor, decoded; scales at the type's own group
void decode_row(int64_t type, const uint8_t* row, int64_t cols, Row& out) {
  const TypeInfo t = type_info(type);
  const int64_t groups_a_block = t.block / t.group;
  for (int64_t b = 0; b < cols / t.block; ++b) {
    const uint8_t* block = row + b * t.bytes;
    int8_t* q = out.codes.data() + b * t.block;
    if (t.k_quant) {
      int8_t* ds = out.d_sub.data() + b * groups_a_block;
      int8_t* ms = out.m_sub.data() + b * groups_a_block;
      decode_k(type, block, q, out.d[b], out.m[b], ds, ms);
      for (int64_t g = 0; g < groups_a_block; ++g) {
        out.scale[b * groups_a_block + g] = out.d[b] * static_cast<float>(ds[g]);
        out.minimum[b * groups_a_block + g] = out.m[b] * static_cast<float>(ms[g]);
      }
    } else {
      decode_small(type, block, q, out.scale[b], out.minimum[b]);
    }
  }
}

enum Format : int64_t { kInt4 = 0, kInt8g = 1, kInt5 = 2, kInt6 = 3 };
enum Scales : int64_t { kHalf = 0, kFloat = 1, kTwoLevel = 2 };

struct Plan {
  int64_t format, group, scales;
  bool has_min;
  int64_t cols;
  int64_t scale_bytes() const { return scales == kHalf ? 2 : scales == kFloat ? 4 : 1; }
  int64_t code_bytes() const {  // a group's codes: nibbles (int4), then fifth (int5) or top two bits (int6); int8
    if (format == kInt8g) return kStrip * group;
    return kStrip * group / 2 + (format == kInt5 || format == kInt6 ? kStrip * 4 : 0);
  }
  int64_t bits() const { return format == kInt4 ? 4 : format == kInt5 ? 5 : format == kInt6 ? 6 : 8; }
  int64_t group_bytes() const { return code_bytes() + kStrip * scale_bytes() * (has_min ? 2 : 1); }
  int64_t head_bytes() const { return scales == kTwoLevel ? kStrip * 2 * (has_min ? 2 : 1) : 0; }
  int64_t unit() const { return scales == kTwoLevel ? kSuper : group; }  // inputs of the packed tensor's last dim
  int64_t unit_bytes() const { return head_bytes() + (unit() / group) * group_bytes(); }
};

struct Source {
  const uint8_t* data;
  int64_t type, rows, row_bytes, group;
  int shift;  // added to the codes: 16 for int5 from Q5_0 (minimum -16 d), 32 for int6 from Q6_K, else 0
  bool fast;  // read by fast_channel
};

// writes one value as the plan stores scales; false when it is not finite there
inline bool put_scale(uint8_t* p, float v, int64_t scales) {
  if (!std::isfinite(v)) return false;
  if (scales == kFloat) {
    std::memcpy(p, &v, sizeof v);
    return true;
  }
  const c10::Half h(v);
  const uint16_t bits = h.x;
  std::memcpy(p, &bits, sizeof bits);
  return std::isfinite(static_cast<float>(h));
}

// channel c's codes of group g (at the plan's group) into the group's block
inline void put_codes(const Plan& P, uint8_t* block, int64_t c, const int8_t* q, int shift) {
  if (P.format != kInt8g) {  // byte 64 j + 4 c + b: k = 8 j + b low, 8 j + 4 + b high
    for (int j = 0; j < P.group / 8; ++j)
      for (int b = 0; b < 4; ++b)
        block[64 * j + 4 * c + b] =
            static_cast<uint8_t>(((q[8 * j + b] + shift) & 15) | (((q[8 * j + 4 + b] + shift) & 15) << 4));
    if (P.format == kInt5) {  // then channel c's 32-bit lane of fifth bits
      uint32_t lane = 0;
      for (int k = 0; k < 32; ++k) lane |= static_cast<uint32_t>(((q[k] + shift) >> 4) & 1) << kInt5LaneBit[k];
      std::memcpy(block + 256 + 4 * c, &lane, sizeof lane);
    } else if (P.format == kInt6) {  // then the top bits: byte 128 + 4 c + b holds k = 4 q + b's at bits 2 q
      for (int b = 0; b < 4; ++b) {
        uint8_t top = 0;
        for (int quad = 0; quad < 4; ++quad) top |= static_cast<uint8_t>((((q[4 * quad + b] + shift) >> 4) & 3) << (2 * quad));
        block[128 + 4 * c + b] = top;
      }
    }
  } else {  // byte 32 j + 2 c + b: k = 2 j + b
    for (int64_t j = 0; j < P.group / 2; ++j) {
      block[32 * j + 2 * c] = static_cast<uint8_t>(q[2 * j]);
      block[32 * j + 2 * c + 1] = static_cast<uint8_t>(q[2 * j + 1]);
    }
  }
}

// channel c of a strip (its row decoded in `row`) into the strip's bytes; false on a scale the plan cannot store
bool put_channel(const Plan& P, uint8_t* strip, int64_t c, const Row& row, const Source& src) {
  const int64_t src_group = src.group;
  const int shift = src.shift;
  const int64_t units = P.cols / P.unit(), groups_a_unit = P.unit() / P.group;
  const int64_t sb = P.scale_bytes();
  bool ok = true;
  for (int64_t u = 0; u < units; ++u) {
    uint8_t* unit = strip + u * P.unit_bytes();
    if (P.scales == kTwoLevel) {
      ok &= put_scale(unit + 2 * c, row.d[u], kHalf);
      if (P.has_min) ok &= put_scale(unit + 2 * (kStrip + c), row.m[u], kHalf);
    }
    for (int64_t gi = 0; gi < groups_a_unit; ++gi) {
      const int64_t g = u * groups_a_unit + gi;  // the plan's group
      uint8_t* block = unit + P.head_bytes() + gi * P.group_bytes();
      put_codes(P, block, c, row.codes.data() + g * P.group, shift);
      const int64_t sg = g * P.group / src_group;  // the source's group holding it
      uint8_t* tail = block + P.code_bytes();
      if (P.scales == kTwoLevel) {
        tail[c] = static_cast<uint8_t>(row.d_sub[sg]);
        if (P.has_min) tail[kStrip + c] = static_cast<uint8_t>(row.m_sub[sg]);
      } else {
        const float minimum = shift ? row.scale[sg] * static_cast<float>(-shift) : row.minimum[sg];
        ok &= put_scale(tail + sb * c, row.scale[sg], P.scales);
        if (P.has_min) ok &= put_scale(tail + sb * (kStrip + c), minimum, P.scales);
      }
    }
  }
  return ok;
}


// Fast paths: a channel's row straight from the file's blocks into the strip, for the pairs the files hold (Q4_0,
// Q4_1, Q4_K -> int4; Q5_0 -> int5; Q6_K -> int6; Q8_0 -> int8g), with no row buffer. Codes move as 64-bit words
// (SWAR): the same instructions and bytes on every x86-64 level, where the generic path below spent its time on
// one code at a time (perf: the packing lambda's decode and put_codes).

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }

// 8 source bytes' low (or high) nibbles as int4's 4 bytes: byte b = code b low, code 4 + b high
inline uint32_t nibble_word(uint64_t w, bool high) {
  return high ? static_cast<uint32_t>(((w >> 4) & 0x0F0F0F0Fu) | ((w >> 32) & 0xF0F0F0F0u))
              : static_cast<uint32_t>((w & 0x0F0F0F0Fu) | ((w >> 28) & 0xF0F0F0F0u));
}

// `words` x 8 codes, the low (or high) nibbles of x's bytes, as channel c's bytes of a group's nibble rows
inline void put_nibbles(uint8_t* block, int64_t c, const uint8_t* x, bool high, int words) {
  for (int j = 0; j < words; ++j) store32(block + 64 * j + 4 * c, nibble_word(load64(x + 8 * j), high));
}

// a byte of fifth bits (codes 8 j + t) -> its two nibbles of int5's lane: low = kPairLow's bits, high = kPairHigh's
constexpr std::array<uint8_t, 256> lane_nibbles() {
  std::array<uint8_t, 256> table{};
  for (int v = 0; v < 256; ++v)
    for (int p = 0; p < 4; ++p)
      table[v] |= static_cast<uint8_t>((((v >> kPairLow[p]) & 1) << p) | (((v >> kPairHigh[p]) & 1) << (4 + p)));
  return table;
}
constexpr std::array<uint8_t, 256> kLaneNibbles = lane_nibbles();

// Q5_0's 32 fifth bits (code k at bit k) as channel c's lane (kInt5LaneBit's order)
inline uint32_t fifth_lane(uint32_t h) {
  uint32_t lane = 0;
  for (int j = 0; j < 4; ++j) {
    const uint32_t t = kLaneNibbles[(h >> (8 * j)) & 255];
    lane |= (t & 15) << (4 * j) | (t >> 4) << (16 + 4 * j);
  }
  return lane;
}

// a non-K block's scale and minimum into a group's tail, as put_channel stores them
inline bool put_scales(const Plan& P, uint8_t* tail, int64_t c, float scale, float minimum) {
  bool ok = put_scale(tail + P.scale_bytes() * c, scale, P.scales);
  if (P.has_min) ok &= put_scale(tail + P.scale_bytes() * (kStrip + c), minimum, P.scales);
  return ok;
}

// whether `fast_channel` reads this source type into this plan
bool has_fast_path(const Plan& P, int64_t type) {
  switch (type) {
    case kQ4_0:
    case kQ4_1:
    case kQ4_K: return P.format == kInt4;
    case kQ5_0: return P.format == kInt5 && P.scales != kTwoLevel;
    case kQ6_K: return P.format == kInt6;
    case kQ8_0: return P.format == kInt8g && P.scales != kTwoLevel;
    default: return false;
  }
}

// channel c of a strip from its source row's blocks (a pair `has_fast_path` accepts): put_channel's bytes
bool fast_channel(const Plan& P, uint8_t* strip, int64_t c, const uint8_t* row, int64_t type) {
  const TypeInfo t = type_info(type);
  const int64_t blocks = P.cols / t.block, ub = P.unit_bytes(), gb = P.group_bytes(), cb = P.code_bytes();
  bool ok = true;
  switch (type) {
    case kQ4_0:
    case kQ4_1:
    case kQ5_0:
      for (int64_t k = 0; k < blocks; ++k) {  // int4 / int5: a block is a group is a unit
        const uint8_t* b = row + k * t.bytes;
        uint8_t* block = strip + k * ub;
        const uint8_t* qs = b + (type == kQ4_0 ? 2 : type == kQ4_1 ? 4 : 6);
        put_nibbles(block, c, qs, false, 2), put_nibbles(block + 128, c, qs, true, 2);
        const float scale = half_at(b);
        if (type == kQ5_0) store32(block + 256 + 4 * c, fifth_lane(load32(b + 2)));
        // Q4_0's minimum -8 d; Q5_0's codes + 16, so -16 d (put_channel's shift)
        const float minimum = type == kQ4_0 ? scale * -8.f : type == kQ4_1 ? half_at(b + 2) : scale * -16.f;
        ok &= put_scales(P, block + cb, c, scale, minimum);
      }
      break;
    case kQ8_0:
      for (int64_t k = 0; k < blocks; ++k) {  // int8g: byte 32 j + 2 c + b holds code 2 j + b, groups of 16 or 32
        const uint8_t* b = row + k * t.bytes;
        const float scale = half_at(b);
        for (int64_t h = 0; h < 32 / P.group; ++h) {
          uint8_t* block = strip + (k * 32 / P.group + h) * ub;
          const uint8_t* q = b + 2 + h * P.group;
          for (int64_t j = 0; j < P.group / 2; ++j) std::memcpy(block + 32 * j + 2 * c, q + 2 * j, 2);
          ok &= put_scales(P, block + cb, c, scale, 0.f);
        }
      }
      break;
    case kQ4_K:
      for (int64_t k = 0; k < blocks; ++k) {  // group g: the low (even g) or high nibbles of qs[32 (g / 2) ...]
        const uint8_t* b = row + k * t.bytes;
        int8_t d_sub[8], m_sub[8];
        k_scale_min(b + 4, d_sub, m_sub);
        const float d = half_at(b), m = -half_at(b + 2);
        if (P.scales == kTwoLevel) {
          uint8_t* unit = strip + k * ub;
          ok &= put_scale(unit + 2 * c, d, kHalf) & put_scale(unit + 2 * (kStrip + c), m, kHalf);
          for (int g = 0; g < 8; ++g) {
            uint8_t* block = unit + P.head_bytes() + g * gb;
            put_nibbles(block, c, b + 16 + 32 * (g / 2), g % 2, 4);
            block[cb + c] = static_cast<uint8_t>(d_sub[g]), block[cb + kStrip + c] = static_cast<uint8_t>(m_sub[g]);
          }
        } else {
          for (int g = 0; g < 8; ++g) {
            uint8_t* block = strip + (k * 8 + g) * ub;
            put_nibbles(block, c, b + 16 + 32 * (g / 2), g % 2, 4);
            const float scale = d * static_cast<float>(d_sub[g]), minimum = m * static_cast<float>(m_sub[g]);
            ok &= put_scales(P, block + cb, c, scale, minimum);
          }
        }
      }
      break;
    default:  // kQ6_K -> int6: group g of half h = g / 8 and r = g % 8: low bits from ql[64 h + 16 (r % 4) ...]'s
              // low (r < 4) or high nibbles, top bits from qh[32 h + 16 (r % 2) ...] >> 2 (r / 2)
      for (int64_t k = 0; k < blocks; ++k) {
        const uint8_t* b = row + k * t.bytes;
        uint8_t* unit = strip + k * ub;
        ok &= put_scale(unit + 2 * c, half_at(b + 208), kHalf);
        for (int g = 0; g < 16; ++g) {
          const int h = g / 8, r = g % 8, f = r / 2;
          uint8_t* block = unit + P.head_bytes() + g * gb;
          put_nibbles(block, c, b + 64 * h + 16 * (r % 4), r >= 4, 2);
          const uint8_t* qh = b + 128 + 32 * h + 16 * (r % 2);
          uint32_t top = 0;  // byte b: codes 4 quad + b's bits 4-5 at bits 2 quad
          for (int quad = 0; quad < 4; ++quad) top |= ((load32(qh + 4 * quad) >> (2 * f)) & 0x03030303u) << (2 * quad);
          store32(block + 128 + 4 * c, top);
          block[cb + c] = b[192 + g];
        }
      }
  }
  return ok;
}

}  // namespace

// parts: each a source tensor's raw blocks (uint8, rows x cols); types: their ggml types; order: [N] int64, the
// row of the parts' concatenation that output channel n takes; -> the packed weight (see kernels/int4.py,
// kernels/int8g.py for the layouts)
at::Tensor ggml_pack(const std::vector<at::Tensor>& parts, const std::vector<int64_t>& types, const at::Tensor& order,
                     int64_t cols, int64_t format, int64_t group, int64_t scales, bool has_min) {
  TORCH_CHECK(parts.size() == types.size() && !parts.empty(), "ggml_pack: one type per part");
  TORCH_CHECK(format >= kInt4 && format <= kInt6, "ggml_pack: format is 0 (int4), 1 (int8g), 2 (int5) or 3 (int6)");
  TORCH_CHECK(scales >= kHalf && scales <= kTwoLevel, "ggml_pack: scales are 0 (fp16), 1 (fp32) or 2 (two-level)");
  TORCH_CHECK(group == 16 || group == 32, "ggml_pack: groups of 16 or 32");
  TORCH_CHECK(format == kInt8g || format == kInt6 || (group == 32 && has_min),
              "ggml_pack: int4 and int5 have groups of 32 with minimums");
  TORCH_CHECK(format != kInt6 || (group == 16 && !has_min && scales == kTwoLevel),
              "ggml_pack: int6 has groups of 16, no minimums, two-level scales");
  TORCH_CHECK(order.scalar_type() == at::kLong && order.dim() == 1 && order.is_contiguous(), "ggml_pack: order is [N] int64");
  const Plan P{format, group, scales, has_min, cols};
  TORCH_CHECK(cols > 0 && cols % P.unit() == 0, "ggml_pack: ", cols, " columns are not a whole number of ", P.unit());
  std::vector<Source> sources;
  int64_t total_rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TypeInfo t = type_info(types[i]);
    TORCH_CHECK(cols % t.block == 0, "ggml_pack: ", cols, " columns are not a whole number of blocks of ", t.block);
    TORCH_CHECK(t.group >= group, "ggml_pack: a type's groups of ", t.group, " cannot be read at groups of ", group);
    TORCH_CHECK(scales != kTwoLevel || t.k_quant, "ggml_pack: two-level scales need K-quants");
    TORCH_CHECK(has_min || !t.has_min, "ggml_pack: a type with minimums needs them in the packed weight");
    TORCH_CHECK(t.bits <= P.bits(), "ggml_pack: ggml type ", types[i], " has codes wider than ", P.bits(), " bits");
    const at::Tensor& raw = parts[i];
    TORCH_CHECK(raw.scalar_type() == at::kByte && raw.is_contiguous(), "ggml_pack: parts are contiguous uint8");
    const int64_t row_bytes = cols / t.block * t.bytes;
    TORCH_CHECK(raw.numel() % row_bytes == 0, "ggml_pack: part ", i, " is not a whole number of rows");
    const int shift = format == kInt5 && !t.has_min ? 16 : format == kInt6 ? 32 : 0;  // Q5_0's, Q6_K's
    sources.push_back({raw.const_data_ptr<uint8_t>(), types[i], raw.numel() / row_bytes, row_bytes, t.group, shift,
                       has_fast_path(P, types[i])});
    total_rows += sources.back().rows;
  }
  const int64_t n = order.numel();
  const int64_t* rows = order.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) TORCH_CHECK(rows[r] >= 0 && rows[r] < total_rows, "ggml_pack: order out of range");
  const int64_t strips = (n + kStrip - 1) / kStrip, units = cols / P.unit();
  // NOTE: int8g and int5 on huge pages: their kernels stream at the memory's rate, where 4 KiB pages' misses
  // show (one row, one thread: Gemma 3's 178 MB int8g LM head 10.6 -> 6.5 ms; Qwen2.5-Coder-0.5B's int5 layers
  // 17 -> 24 GB/s). int4 and int6 gained nothing measurable in a step of Qwen2.5-Coder-1.5B, and fresh huge
  // pages cost load time here: its 1.1 GB loaded 1.5-2.5 s slower on them (this VM backs a freed 2 MiB block
  // anew)
  const bool huge = format == kInt8g || format == kInt5;
  // NOTE: every byte of a full strip is written (heads, codes, tails), so int4 and int6 skip at::zeros' pass over
  // the weight; a last partial strip is zeroed first (its missing channels stay zero). huge_page_zeros costs no
  // pass: its fresh maps are zero-filled by the kernel as they are touched
  auto packed = huge ? huge_page_zeros({strips, units, P.unit_bytes()})
                     : at::empty({strips, units, P.unit_bytes()}, at::kByte);
  uint8_t* out = packed.mutable_data_ptr<uint8_t>();
  std::atomic<bool> ok{true};
  at::parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
    Row row;
    row.resize(cols, 16);
    for (int64_t s = begin; s < end; ++s) {
      uint8_t* strip = out + s * units * P.unit_bytes();
      if ((s + 1) * kStrip > n && !huge) std::memset(strip, 0, units * P.unit_bytes());
      for (int64_t c = 0; c < kStrip && s * kStrip + c < n; ++c) {
        int64_t r = rows[s * kStrip + c];
        size_t i = 0;
        while (r >= sources[i].rows) r -= sources[i++].rows;
        const Source& src = sources[i];
        const uint8_t* raw = src.data + r * src.row_bytes;
        if (src.fast) {
          if (!fast_channel(P, strip, c, raw, src.type)) ok = false;
          continue;
        }
        decode_row(src.type, raw, cols, row);
        if (!put_channel(P, strip, c, row, src)) ok = false;
      }
    }
  });
  TORCH_CHECK(ok.load(), "ggml_pack: a scale or minimum is not finite, or beyond fp16's range (|v| <= 65504)");
  return packed;
}

}  // namespace infer_cpu

TORCH_LIBRARY_FRAGMENT(infer_cpu, m) {
  m.def("ggml_pack(Tensor[] parts, int[] types, Tensor order, int cols, int format, int group, int scales, bool has_min) -> Tensor");
}

TORCH_LIBRARY_IMPL(infer_cpu, CPU, m) { m.impl("ggml_pack", &infer_cpu::ggml_pack); }
