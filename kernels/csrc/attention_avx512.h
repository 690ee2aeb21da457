// AVX-512 inner loop of the CPU paged attention, for head_dim = 16 * C.
// Compiled only when the build machine has AVX-512 (-march=native); the
// plain loops in paged_attention.cpp serve every other case.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common.h"

namespace infer_cpu {

// e^x for x <= 0, 16 lanes; 0 below -87 (the same polynomial as exp_nonpositive)
inline __m512 exp_nonpositive_x16(__m512 x) {
  const __m512 clamped = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), clamped);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  for (float c : {1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_LT_OQ), y, _mm512_setzero_ps());
}

// 16 vectors -> one: lane t = the sum of p[t]'s lanes (a transpose-and-add tree, ~3 ops per key)
inline __m512 reduce16(const __m512* p) {
  __m512 c[8], d[4], e[2];
  for (int i = 0; i < 8; ++i) {  // lanes 0-7: key 2i, 8-15: key 2i+1
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xEE));
  }
  for (int j = 0; j < 4; ++j) {  // 128-bit lane l: key 4j + l
    d[j] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0xDD));
  }
  for (int k = 0; k < 2; ++k) {  // lane l: keys 8k + l (twice), 8k + 4 + l (twice)
    e[k] = _mm512_add_ps(_mm512_shuffle_ps(d[2 * k], d[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(d[2 * k], d[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // element 4l + m holds key 4m + l: transpose back
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, f);
}

// One query row's scores for keys [j0, j0 + n) (n <= 16, fp32 rows, strided), -inf past n.
// q: [16 * C] pre-scaled; softcap 0: off.
template <int C>
inline __m512 scores_x16(const float* q, const float* k, int64_t k_stride, int64_t j0, int n, float softcap) {
  __m512 qv[C];
  for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  __m512 part[16];
  for (int t = 0; t < 16; ++t) {
    part[t] = _mm512_setzero_ps();
    if (t >= n) continue;
    const float* kr = k + (j0 + t) * k_stride;
    for (int c = 0; c < C; ++c) part[t] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), part[t]);
  }
  __m512 s = reduce16(part);  // [16] scores
  if (softcap > 0.f) {
    alignas(64) float w[16];
    _mm512_store_ps(w, s);
    for (int t = 0; t < 16; ++t) w[t] = softcap * std::tanh(w[t] / softcap);
    s = _mm512_load_ps(w);
  }
  return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1),
                              _mm512_set1_ps(-std::numeric_limits<float>::infinity()), s);
}

// One query row's online-softmax update with the scores `s` of keys [j0, j0 + n): m, l and acc [16 * C].
template <int C>
inline void accumulate_x16(__m512 s, int n, float* acc, float& m, float& l, const float* v, int64_t v_stride,
                           int64_t j0) {
  __m512 av[C];
  for (int c = 0; c < C; ++c) av[c] = _mm512_loadu_ps(acc + 16 * c);
  const float new_m = std::max(m, _mm512_reduce_max_ps(s));
  if (new_m > m) {
    const float correction = exp_nonpositive(m - new_m);  // 0 when m is -inf
    l *= correction;
    for (int c = 0; c < C; ++c) av[c] = _mm512_mul_ps(av[c], _mm512_set1_ps(correction));
    m = new_m;
  }
  const __m512 p = exp_nonpositive_x16(_mm512_sub_ps(s, _mm512_set1_ps(new_m)));
  l += _mm512_reduce_add_ps(p);
  alignas(64) float w[16];
  _mm512_store_ps(w, p);
  for (int t = 0; t < n; ++t) {
    const float* vr = v + (j0 + t) * v_stride;
    const __m512 pt = _mm512_set1_ps(w[t]);
    for (int c = 0; c < C; ++c) av[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(vr + 16 * c), av[c]);
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + 16 * c, av[c]);
}

}  // namespace infer_cpu
#endif
