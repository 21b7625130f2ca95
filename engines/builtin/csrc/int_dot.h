// Packed products with int8 activations: llama.cpp's scheme for small batches on the CPU.
//
// torch's int4/int8 kernels widen every weight to float and multiply it by a bfloat16
// activation: on a CPU with AVX-512 that is fast enough, on an AVX2-only one it is the
// whole cost of a decode step (issue 40: 9 of 14.5 ms a batch-1 step of the bundled model).
// Here each row of activations is quantized once per product to int8 in blocks of 32 (one
// float scale a block, as llama.cpp's Q8 activations), and each block's product with the
// weights is an integer dot product (AVX2: maddubs/madd, 32 multiply-adds in 3 operations),
// scaled once per block in float:
//   int4 (llama.cpp's Q4_0/Q4_1 and Parrot's int4 alike): w = d * q + m, q in 0..15, so
//        sum_k w_k x_k = d * dx * sum_k q_k xq_k + m * dx * sum_k xq_k;
//   int8 (one scale a row): w = s * wq, so sum_k w_k x_k = s * sum_blocks dx * sum_k wq_k xq_k.
// Without AVX2 the same integer sums run as plain loops.
//
// Layouts (engines/builtin/model/int_dot.py makes them): int4 codes [N, K / 2] uint8, a
// block of 32 codes in 16 bytes, byte j = code j | code (j + 16) << 4; d, m [N, K / 32]
// float32. int8: codes [N, K] int8 in -127..127 (the sign trick needs no -128), scales [N]
// float32. Activations x [R, K] bfloat16; K a multiple of 32; the result [R, N] bfloat16.

#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace intdot {

constexpr int64_t kBlock = 32;

inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {  // round to nearest even, as torch's cast
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Activations, quantized: xq [R, K] int8, dx [R, K / 32] their scales, sx = dx * sum(xq).
struct Quantized {
  std::vector<int8_t> xq;
  std::vector<float> dx, sx;
};

inline Quantized quantize(const uint16_t* x, int64_t R, int64_t K) {
  const int64_t G = K / kBlock;
  Quantized a{std::vector<int8_t>(R * K), std::vector<float>(R * G), std::vector<float>(R * G)};
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t g = 0; g < G; ++g) {
      const uint16_t* xb = x + r * K + g * kBlock;
      float v[kBlock];
      float amax = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) v[i] = bf16_bits_to_float(xb[i]), amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      int8_t* q = a.xq.data() + r * K + g * kBlock;
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        q[i] = static_cast<int8_t>(std::nearbyint(v[i] * inv));
        sum += q[i];
      }
      a.dx[r * G + g] = d;
      a.sx[r * G + g] = d * static_cast<float>(sum);
    }
  }
  return a;
}

#if defined(__AVX2__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// For T activation rows at once (the weight block is unpacked once for all of them):
// total[t] = sum over blocks of d[g] * dx[t][g] * (codes . xq[t]). xq[t] and dx[t] point at
// row t's quantized activations and scales.
template <int T>
inline void int4_rows_dot(const uint8_t* q, const float* d, const int8_t* const* xq, const float* const* dx,
                          int64_t G, float* total) {
#if defined(__AVX2__)
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * 16));
    const __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    const __m256i codes = _mm256_set_m128i(hi, lo);  // codes 0..15, then 16..31
    for (int t = 0; t < T; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + g * kBlock));
      const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), ones);  // 8 x int32
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(d[g] * dx[t][g]), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) total[t] = hsum(acc[t]);
#else
  for (int t = 0; t < T; ++t) {
    float sum_t = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      int32_t sum = 0;
      for (int64_t j = 0; j < 16; ++j) {
        const uint8_t byte = q[g * 16 + j];
        sum += (byte & 0x0F) * xq[t][g * kBlock + j] + (byte >> 4) * xq[t][g * kBlock + j + 16];
      }
      sum_t += d[g] * dx[t][g] * static_cast<float>(sum);
    }
    total[t] = sum_t;
  }
#endif
}

// sum over blocks of dx[g] * (w . xq) for one int8 weight row and one activation row
inline float int8_row_dot(const int8_t* w, const int8_t* xq, const float* dx, int64_t G) {
#if defined(__AVX2__)
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * kBlock));
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * kBlock));
    // maddubs multiplies unsigned by signed bytes: |w| times x with w's sign
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(x, wv));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_set1_ps(dx[g]), acc);
  }
  return hsum(acc);
#else
  float total = 0.f;
  for (int64_t g = 0; g < G; ++g) {
    int32_t sum = 0;
    for (int64_t j = 0; j < kBlock; ++j) sum += w[g * kBlock + j] * xq[g * kBlock + j];
    total += dx[g] * static_cast<float>(sum);
  }
  return total;
#endif
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
  const Quantized a = quantize(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), R, K);
  at::Tensor out = at::empty({R, N}, at::TensorOptions().dtype(at::kBFloat16));
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const uint8_t* q = codes.data_ptr<uint8_t>();
  const float *dp = d.data_ptr<float>(), *mp = m.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    const int8_t* xrows[4];
    const float* dxrows[4];
    float total[4];
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* qn = q + n * (K / 2);
      const float *dn = dp + n * G, *mn = mp + n * G;
      for (int64_t r0 = 0; r0 < R; r0 += 4) {  // the weight row stays in L1 across the rows
        const int T = static_cast<int>(std::min<int64_t>(4, R - r0));
        for (int t = 0; t < T; ++t) xrows[t] = a.xq.data() + (r0 + t) * K, dxrows[t] = a.dx.data() + (r0 + t) * G;
        switch (T) {
          case 4: int4_rows_dot<4>(qn, dn, xrows, dxrows, G, total); break;
          case 3: int4_rows_dot<3>(qn, dn, xrows, dxrows, G, total); break;
          case 2: int4_rows_dot<2>(qn, dn, xrows, dxrows, G, total); break;
          default: int4_rows_dot<1>(qn, dn, xrows, dxrows, G, total);
        }
        for (int t = 0; t < T; ++t) {
          const float* sx = a.sx.data() + (r0 + t) * G;
          float offset = 0.f;
          for (int64_t g = 0; g < G; ++g) offset += mn[g] * sx[g];
          o[(r0 + t) * N + n] = float_to_bf16_bits(total[t] + offset);
        }
      }
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
  const Quantized a = quantize(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), R, K);
  at::Tensor out = at::empty({R, N}, at::TensorOptions().dtype(at::kBFloat16));
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const int8_t* w = codes.data_ptr<int8_t>();
  const float* s = scales.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      for (int64_t r = 0; r < R; ++r)
        o[r * N + n] = float_to_bf16_bits(s[n] * int8_row_dot(w + n * K, a.xq.data() + r * K, a.dx.data() + r * G, G));
  });
  return out;
}

}  // namespace intdot
