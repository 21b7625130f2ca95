// Packed products with int8 activations: llama.cpp's scheme for small batches on the CPU.
//
// torch's int4/int8 kernels widen every weight to float and multiply it by a bfloat16
// activation: on a CPU with AVX-512 that is fast enough, on an AVX2-only one it is the
// whole cost of a decode step (issue 40: 9 of 14.5 ms a batch-1 step of the bundled model).
// Here each row of activations is quantized once per product to int8 in blocks of 32 (one
// float scale a block, as llama.cpp's Q8 activations), and each block's product with the
// weights is an integer dot product (VNNI: dpbusd; AVX2: maddubs/madd), scaled in float once
// per block (in groups of blocks: see Groups below):
//   int4 (llama.cpp's Q4_0/Q4_1 and Parrot's int4 alike): w = d * q + m, q in 0..15, so
//        sum_k w_k x_k = d * dx * sum_k q_k xq_k + m * dx * sum_k xq_k;
//   int8 (one scale a row): w = s * wq, so sum_k w_k x_k = s * sum_blocks dx * sum_k wq_k xq_k.
// Without AVX2 the same integer sums run as plain loops.
//
// Layouts (engines/builtin/model/int_dot.py makes them): int4 codes [N, K / 2] uint8 in
// group order (below); d, m [N, K / 32] float32. int8: codes [N, K] int8 in -127..127 (the
// sign trick needs no -128), scales [N] float32. Activations x [R, K] bfloat16; K a multiple
// of 32; the result [R, N] bfloat16.

#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "int_dot_rows.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace intdot {

#if defined(__AVX2__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// acc + the sums of four products of unsigned bytes a and signed bytes b, lane by lane. The
// AVX2 form is exact here: no pair of products leaves int16 (int4: 2 * 15 * 127; int8 with the
// sign trick: 2 * 127 * 127).
inline __m256i dot_add(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
#endif
}

inline __m256 pair_lanes(const float* v) {  // [v0 x 4, v1 x 4]
  const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(v)));
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

inline __m256 quad_lanes(const float* v) {  // [v0 x 2, v1 x 2, v2 x 2, v3 x 2]
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(v)), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

inline __m256i load2(const int8_t* low, const int8_t* high) {  // 16 bytes from each
  return _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(high), reinterpret_cast<const __m128i*>(low));
}
#endif

// For T activation rows at once (the weights are unpacked once for all of them):
// total[t] = sum over blocks of d[g] * dx[t][g] * (codes . xq[t]) + m[g] * sx[t][g].
template <int T>
inline void int4_rows_dot(const uint8_t* q, const float* d, const float* m, const Rows& x, int64_t G, float* total) {
#if defined(__AVX2__)
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 3 < G; g += 4) {  // groups of four blocks: chunks 0 and 1, then 2 and 3, a load each
    const __m256i raw0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 16));
    const __m256i raw1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 16 + 32));
    const __m256i c0 = _mm256_and_si256(raw0, low), c1 = _mm256_and_si256(_mm256_srli_epi16(raw0, 4), low);
    const __m256i c2 = _mm256_and_si256(raw1, low), c3 = _mm256_and_si256(_mm256_srli_epi16(raw1, 4), low);
    const __m256 dv = quad_lanes(d + g), mv = quad_lanes(m + g);
    const int64_t lane = (g / 4) * kLanes;
    for (int t = 0; t < T; ++t) {
      const __m256i* xp = reinterpret_cast<const __m256i*>(x.xq[t] + g * kBlock);
      __m256i sums = dot_add(_mm256_setzero_si256(), c0, _mm256_loadu_si256(xp));
      sums = dot_add(sums, c1, _mm256_loadu_si256(xp + 1));
      sums = dot_add(sums, c2, _mm256_loadu_si256(xp + 2));
      sums = dot_add(sums, c3, _mm256_loadu_si256(xp + 3));
      const __m256 scale = _mm256_mul_ps(dv, _mm256_loadu_ps(x.dxl[t] + lane));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[t]);
      acc[t] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(x.sxl[t] + lane), acc[t]);
    }
  }
  if (g + 1 < G) {  // a pair left
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 16));
    const __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    const __m256 dv = pair_lanes(d + g), mv = pair_lanes(m + g);
    const int64_t lane = (g / 4) * kLanes;
    for (int t = 0; t < T; ++t) {
      const int8_t* xp = x.xq[t] + g * kBlock;
      __m256i sums = dot_add(_mm256_setzero_si256(), lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp)));
      sums = dot_add(sums, hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + kBlock)));
      const __m256 scale = _mm256_mul_ps(dv, _mm256_loadu_ps(x.dxl[t] + lane));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[t]);
      acc[t] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(x.sxl[t] + lane), acc[t]);
    }
    g += 2;
  }
  if (g < G) {  // an odd last block: every lane its own
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * 16));
    const __m128i l4 = _mm_set1_epi8(0x0F);
    const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), l4), _mm_and_si128(raw, l4));
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.xq[t] + g * kBlock));
      const __m256i sums = dot_add(_mm256_setzero_si256(), codes, xv);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(d[g] * x.dx[t][g]), acc[t]);
      total[t] = m[g] * x.sx[t][g];
    }
  } else {
    for (int t = 0; t < T; ++t) total[t] = 0.f;
  }
  for (int t = 0; t < T; ++t) total[t] += hsum(acc[t]);
#else
  const Groups& groups = *x.groups;
  for (int t = 0; t < T; ++t) {
    float sum_t = 0.f;
    for (int64_t g0 = 0; g0 < G;) {  // a group's bytes: a chunk's codes low, the next's high
      int64_t first, n, index;
      groups.of(g0, first, n, index);
      int32_t sums[4] = {0, 0, 0, 0};
      for (int64_t i = 0; i < n * 16; ++i) {
        const uint8_t byte = q[g0 * 16 + i];
        const int64_t W = kBlock / n, L = i / kBlock, b = n == 1 ? 0 : (i % kBlock) / W, e = i % kBlock % W;
        const int64_t lo = n == 1 ? i : 2 * L * W + e, hi = n == 1 ? 16 + i : (2 * L + 1) * W + e;
        sums[b] += (byte & 0x0F) * x.xq[t][groups.offset(g0 + b, lo)] + (byte >> 4) * x.xq[t][groups.offset(g0 + b, hi)];
      }
      for (int64_t b = 0; b < n; ++b) {
        const int64_t g = g0 + b;
        sum_t += d[g] * x.dx[t][g] * static_cast<float>(sums[b]) + m[g] * x.sx[t][g];
      }
      g0 += n;
    }
    total[t] = sum_t;
  }
#endif
}

// total[t] = sum over blocks of dx[t][g] * (w . xq[t]) for one int8 weight row (natural order)
template <int T>
inline void int8_rows_dot(const int8_t* w, const Rows& x, int64_t G, float* total) {
#if defined(__AVX2__)
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 1 < G; g += 2) {
    const int8_t* wp = w + g * kBlock;
    const __m256i w0 = load2(wp, wp + kBlock), w1 = load2(wp + 16, wp + kBlock + 16);
    // the product of unsigned and signed bytes: |w| times x with w's sign
    const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
    const int64_t lane = (g / 2) * kLanes;
    for (int t = 0; t < T; ++t) {
      const int8_t* xp = x.xq[t] + g * kBlock;
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + kBlock));
      __m256i sums = dot_add(_mm256_setzero_si256(), a0, _mm256_sign_epi8(x0, w0));
      sums = dot_add(sums, a1, _mm256_sign_epi8(x1, w1));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_loadu_ps(x.dxl[t] + lane), acc[t]);
    }
  }
  if (g < G) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * kBlock));
    const __m256i av = _mm256_sign_epi8(wv, wv);
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.xq[t] + g * kBlock));
      const __m256i sums = dot_add(_mm256_setzero_si256(), av, _mm256_sign_epi8(xv, wv));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(x.dx[t][g]), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) total[t] = hsum(acc[t]);
#else
  for (int t = 0; t < T; ++t) {
    float sum_t = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      int32_t sum = 0;
      for (int64_t p = 0; p < kBlock; ++p) sum += w[g * kBlock + p] * x.xq[t][x.groups->offset(g, p)];
      sum_t += x.dx[t][g] * static_cast<float>(sum);
    }
    total[t] = sum_t;
  }
#endif
}

// Weight row n's products with every tile (dot(T, rows, total)), scaled, into o [R, N].
template <typename RowDot>
inline void for_tiles(const std::vector<Tile>& tiles, int64_t n, RowDot dot, uint16_t* o, int64_t N, float scale) {
  float total[kTile];
  for (const Tile& tile : tiles) {
    dot(tile.T, tile.rows, total);
    for (int t = 0; t < tile.T; ++t) o[(tile.r0 + t) * N + n] = float_to_bf16_bits(scale * total[t]);
  }
}

inline void check_rows(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "activations must be contiguous [rows, in] bfloat16");
  TORCH_CHECK(x.size(1) == K && K % kBlock == 0, "the activations' width must be the weights' (a multiple of 32)");
}

// x [R, K] bf16, codes [N, K / 2] uint8, d and m [N, K / 32] float32 -> [R, N] bf16
inline at::Tensor int4_rows(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& m) {
  const int64_t N = codes.size(0), K = codes.size(1) * 2, G = K / kBlock, R = x.size(0);
  check_rows(x, K);
  TORCH_CHECK(codes.scalar_type() == at::kByte && d.scalar_type() == at::kFloat && m.scalar_type() == at::kFloat &&
                  codes.is_contiguous() && d.is_contiguous() && m.is_contiguous() && d.size(0) == N &&
                  d.size(1) == G && m.sizes() == d.sizes(),
              "int4 weights must be codes [N, K / 2] uint8 with d, m [N, K / 32] float32");
  const Groups groups(G, 4);
  const Quantized a = quantize(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), R, K, groups);
  const std::vector<Tile> tiles = tiles_of(a, groups, R, K);
  at::Tensor out = at::empty({R, N}, at::TensorOptions().dtype(at::kBFloat16));
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const uint8_t* q = codes.data_ptr<uint8_t>();
  const float *dp = d.data_ptr<float>(), *mp = m.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* qn = q + n * (K / 2);
      const float *dn = dp + n * G, *mn = mp + n * G;
      auto dot = [&](int T, const Rows& rows, float* total) {
        switch (T) {
          case 8: int4_rows_dot<8>(qn, dn, mn, rows, G, total); break;
          case 7: int4_rows_dot<7>(qn, dn, mn, rows, G, total); break;
          case 6: int4_rows_dot<6>(qn, dn, mn, rows, G, total); break;
          case 5: int4_rows_dot<5>(qn, dn, mn, rows, G, total); break;
          case 4: int4_rows_dot<4>(qn, dn, mn, rows, G, total); break;
          case 3: int4_rows_dot<3>(qn, dn, mn, rows, G, total); break;
          case 2: int4_rows_dot<2>(qn, dn, mn, rows, G, total); break;
          default: int4_rows_dot<1>(qn, dn, mn, rows, G, total);
        }
      };
      for_tiles(tiles, n, dot, o, N, 1.f);
    }
  });
  return out;
}

// x [R, K] bf16, codes [N, K] int8, scales [N] float32 -> [R, N] bf16
inline at::Tensor int8_rows(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  const int64_t N = codes.size(0), K = codes.size(1), G = K / kBlock, R = x.size(0);
  check_rows(x, K);
  TORCH_CHECK(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat && codes.is_contiguous() &&
                  scales.is_contiguous() && scales.numel() == N,
              "int8 weights must be codes [N, K] int8 with scales [N] float32");
  const Groups groups(G, 2);
  const Quantized a = quantize(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), R, K, groups);
  const std::vector<Tile> tiles = tiles_of(a, groups, R, K);
  at::Tensor out = at::empty({R, N}, at::TensorOptions().dtype(at::kBFloat16));
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const int8_t* w = codes.data_ptr<int8_t>();
  const float* s = scales.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int8_t* wn = w + n * K;
      auto dot = [&](int T, const Rows& rows, float* total) {
        switch (T) {
          case 8: int8_rows_dot<8>(wn, rows, G, total); break;
          case 7: int8_rows_dot<7>(wn, rows, G, total); break;
          case 6: int8_rows_dot<6>(wn, rows, G, total); break;
          case 5: int8_rows_dot<5>(wn, rows, G, total); break;
          case 4: int8_rows_dot<4>(wn, rows, G, total); break;
          case 3: int8_rows_dot<3>(wn, rows, G, total); break;
          case 2: int8_rows_dot<2>(wn, rows, G, total); break;
          default: int8_rows_dot<1>(wn, rows, G, total);
        }
      };
      for_tiles(tiles, n, dot, o, N, s[n]);
    }
  });
  return out;
}

}  // namespace intdot
