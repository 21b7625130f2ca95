// Decode attention over the paged KV cache (decode_step.cpp): each query head of a step's
// rows over its sequence's keys 0..kv_len-1, read through the block table block by block
// (the key at position p is in slot table[p / block_size] * block_size + p % block_size).
// Softmax in float32.
//
// One task per (sequence, KV head), so that a KV head's keys are read once for its group of
// query heads. With AVX2 and heads of 32, 64, 80, 96 or 128 dims, a block's keys (then
// values) are widened to float once into a small buffer that every query head of the group
// reads, and eight keys' dot products are summed across their lanes at once (hadd): at 8
// rows of 512 keys the loops that widened each key for each query head and summed each dot
// product alone were 55% of a decode step of the bundled model. Other heads run the plain
// loops.

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

namespace decode {

// bfloat16 as its bits, so that the loops below vectorize (c10's conversion branches on
// NaN). Rounding is to nearest even, as torch's float -> bfloat16 cast.
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// KV cache elements: float32, or bfloat16 as its bits (--kv-dtype bfloat16), which widens
// with one shift. (float16 was tried: GCC 12 converts _Float16 one element at a time, and its
// conversion in integer operations costs ~6 operations an element in these compute-bound
// loops: attention at 2,000 keys was 2.3-3.4x slower than with either.)
inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return from_bf16(x); }

template <typename C>
C narrow(float x);
template <>
inline float narrow<float>(float x) { return x; }
template <>
inline uint16_t narrow<uint16_t>(float x) { return to_bf16(x); }

template <typename C>
inline float dot(const float* a, const C* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * widen(b[i]);
  return s;
}

struct Heads {
  int64_t nh, nkv, hd;
  float scale;
};

// One task's keys and values: the first key of block i is at k + blocks[i] * block_stride
// (its next key a key_stride further), its value at the same place in v.
template <typename C>
struct TaskKV {
  const C *k, *v;
  const int64_t* blocks;
  int64_t len, block_size, block_stride, key_stride;
  const C* key(int64_t first) const { return k + blocks[first / block_size] * block_stride; }
  const C* value(int64_t first) const { return v + blocks[first / block_size] * block_stride; }
};

// softmax of each of the group's rows of scores [group, len], in place
inline void softmax_rows(float* sc, int64_t group, int64_t len) {
  for (int64_t j = 0; j < group; ++j) {
    float* sj = sc + j * len;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t p = 0; p < len; ++p) m = std::max(m, sj[p]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t p = 0; p < len; ++p) {
      sj[p] = std::exp(sj[p] - m);
      sum += sj[p];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t p = 0; p < len; ++p) sj[p] *= inv;
  }
}

// The plain loops: acc [group, hd] = softmax(q [group, hd] . keys) . values; sc: [group, len].
template <typename C>
void attend_plain(const Heads& h, const float* q, const TaskKV<C>& kv, float* sc, float* acc) {
  const int64_t group = h.nh / h.nkv, len = kv.len, hd = h.hd, stride = kv.key_stride;
  for (int64_t first = 0; first < len; first += kv.block_size) {  // block by block: no division
    const C* k = kv.key(first);
    const int64_t n = std::min(kv.block_size, len - first);
    for (int64_t j = 0; j < group; ++j) {
      const float* qj = q + j * hd;
      float* sj = sc + j * len + first;
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) {  // four keys a pass: four independent sums
        const C *k0 = k + t * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t i = 0; i < hd; ++i) {
          s0 += qj[i] * widen(k0[i]);
          s1 += qj[i] * widen(k1[i]);
          s2 += qj[i] * widen(k2[i]);
          s3 += qj[i] * widen(k3[i]);
        }
        sj[t] = s0 * h.scale, sj[t + 1] = s1 * h.scale, sj[t + 2] = s2 * h.scale, sj[t + 3] = s3 * h.scale;
      }
      for (; t < n; ++t) sj[t] = dot(qj, k + t * stride, hd) * h.scale;  // (widens C)
    }
  }
  softmax_rows(sc, group, len);
  std::fill(acc, acc + group * hd, 0.f);
  for (int64_t first = 0; first < len; first += kv.block_size) {
    const C* v = kv.value(first);
    const int64_t n = std::min(kv.block_size, len - first);
    for (int64_t j = 0; j < group; ++j) {
      const float* w = sc + j * len + first;
      float* a = acc + j * hd;
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) {  // four keys a pass: a quarter of the stores to a
        const C *v0 = v + t * stride, *v1 = v0 + stride, *v2 = v1 + stride, *v3 = v2 + stride;
#pragma omp simd
        for (int64_t i = 0; i < hd; ++i)
          a[i] += w[t] * widen(v0[i]) + w[t + 1] * widen(v1[i]) + w[t + 2] * widen(v2[i]) + w[t + 3] * widen(v3[i]);
      }
      for (; t < n; ++t) {
        const C* vt = v + t * stride;
#pragma omp simd
        for (int64_t i = 0; i < hd; ++i) a[i] += w[t] * widen(vt[i]);
      }
    }
  }
}

#if defined(__AVX2__)
// lane u of the result: the sum of the lanes of a[u]
inline __m256 sum_lanes8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // halves: rows 0-3, 4-7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// n rows of hd elements, each a key_stride apart, widened into out [n, hd] float32
template <typename C>
inline void widen_rows(const C* src, int64_t n, int64_t hd, int64_t stride, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const C* s = src + t * stride;
    float* o = out + t * hd;
#pragma omp simd
    for (int64_t i = 0; i < hd; ++i) o[i] = widen(s[i]);
  }
}

// As attend_plain, for heads of HD dims; buffer: [block_size, HD] floats.
template <int HD, typename C>
void attend_blocks(const Heads& h, const float* q, const TaskKV<C>& kv, float* sc, float* acc, float* buffer) {
  constexpr int kChunks = HD / 8;
  const int64_t group = h.nh / h.nkv, len = kv.len;
  const __m256 scale = _mm256_set1_ps(h.scale);
  for (int64_t first = 0; first < len; first += kv.block_size) {
    const int64_t n = std::min(kv.block_size, len - first);
    widen_rows(kv.key(first), n, HD, kv.key_stride, buffer);
    for (int64_t j = 0; j < group; ++j) {
      __m256 qv[kChunks];
      for (int c = 0; c < kChunks; ++c) qv[c] = _mm256_loadu_ps(q + j * HD + c * 8);
      float* sj = sc + j * len + first;
      for (int64_t t0 = 0; t0 < n; t0 += 8) {  // eight keys, their sums across lanes at once
        const int64_t m = std::min<int64_t>(8, n - t0);
        __m256 a[8];
        for (int u = 0; u < 8; ++u) {
          a[u] = _mm256_setzero_ps();
          if (u < m) {
            const float* k = buffer + (t0 + u) * HD;
            for (int c = 0; c < kChunks; ++c) a[u] = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(k + c * 8), a[u]);
          }
        }
        const __m256 s = _mm256_mul_ps(sum_lanes8(a), scale);
        if (m == 8) {
          _mm256_storeu_ps(sj + t0, s);
        } else {
          alignas(32) float part[8];
          _mm256_store_ps(part, s);
          std::memcpy(sj + t0, part, m * sizeof(float));
        }
      }
    }
  }
  softmax_rows(sc, group, len);
  for (int64_t j = 0; j < group; ++j) std::fill(acc + j * HD, acc + (j + 1) * HD, 0.f);
  for (int64_t first = 0; first < len; first += kv.block_size) {
    const int64_t n = std::min(kv.block_size, len - first);
    widen_rows(kv.value(first), n, HD, kv.key_stride, buffer);
    for (int64_t j = 0; j < group; ++j) {
      const float* w = sc + j * len + first;
      __m256 av[kChunks];
      for (int c = 0; c < kChunks; ++c) av[c] = _mm256_loadu_ps(acc + j * HD + c * 8);
      for (int64_t t = 0; t < n; ++t) {
        const __m256 p = _mm256_set1_ps(w[t]);
        const float* v = buffer + t * HD;
        for (int c = 0; c < kChunks; ++c) av[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + c * 8), av[c]);
      }
      for (int c = 0; c < kChunks; ++c) _mm256_storeu_ps(acc + j * HD + c * 8, av[c]);
    }
  }
}
#endif

// Attention of a decode step: qs [B, width] (each row's query heads first), the caches of one
// layer ([slots, nkv, hd] each), table [B, W] block ids, kv_lens [B] -> out [B, nh * hd]
// bfloat16 bits.
template <typename C>
void attend(const Heads& h, const float* qs, int64_t width, const C* k_cache, const C* v_cache,
            const at::Tensor& table, const at::Tensor& kv_lens, int64_t block_size, uint16_t* out) {
  const int64_t B = kv_lens.size(0), W = table.size(1), group = h.nh / h.nkv, hd = h.hd;
  const int64_t* lens = kv_lens.data_ptr<int64_t>();
  const int64_t* tab = table.data_ptr<int64_t>();
  int64_t keys = 0;
  for (int64_t b = 0; b < B; ++b) keys += lens[b];
  // Threads only where there is enough to share.
  const int64_t grain = keys * h.nh * hd < (1 << 15) ? B * h.nkv : 1;
  at::parallel_for(0, B * h.nkv, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(group * hd), buffer(block_size * hd);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / h.nkv, g = task % h.nkv;
      const TaskKV<C> kv{k_cache + g * hd, v_cache + g * hd, tab + b * W, lens[b],
                         block_size, block_size * h.nkv * hd, h.nkv * hd};
      const float* q = qs + b * width + g * group * hd;
      scores.resize(group * kv.len);
#if defined(__AVX2__)
      float *sc = scores.data(), *a = acc.data(), *buf = buffer.data();
      switch (hd) {  // the head sizes of common models (Phi-3: 96; Llama 3.2, Qwen2.5: 64; Qwen3: 128)
        case 32: attend_blocks<32>(h, q, kv, sc, a, buf); break;
        case 64: attend_blocks<64>(h, q, kv, sc, a, buf); break;
        case 80: attend_blocks<80>(h, q, kv, sc, a, buf); break;
        case 96: attend_blocks<96>(h, q, kv, sc, a, buf); break;
        case 128: attend_blocks<128>(h, q, kv, sc, a, buf); break;
        default: attend_plain(h, q, kv, sc, a);
      }
#else
      attend_plain(h, q, kv, scores.data(), acc.data());
#endif
      uint16_t* o = out + b * h.nh * hd + g * group * hd;
#pragma omp simd
      for (int64_t i = 0; i < group * hd; ++i) o[i] = to_bf16(acc[i]);
    }
  });
}

}  // namespace decode
