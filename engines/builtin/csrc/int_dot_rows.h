// Activation rows of the int8-activation products (int_dot.h): quantized to int8 in blocks
// of 32, stored in the order the products read them (Groups), and cut into tiles of rows.

#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// Blocks go in groups of four (int4) or two (int8): a register of 32 bytes holds 8 (or 16)
// values of each block of its group, so its eight int32 lanes (4 products each) are 2 (or 4)
// lanes a block. The integer sums of a group then take one conversion to float and one
// multiply-add with the group's scales, where a block a register cost one of each and a
// broadcast of its scale; with VNNI one instruction makes the 4-byte sums.
// Within a group of S blocks starting at g0, chunk c (32 bytes) is, block by block, values
// c * W .. c * W + W - 1 of each (W = 32 / S). Blocks left over (K / 32 not a multiple of S)
// form a pair, then a block alone, as it is. The activations are stored in that order; the
// int4 codes too (int_dot.py's int4_layout: a chunk's low nibbles and the next's high
// nibbles in one 32-byte load); the int8 weights are read from their natural rows, two
// 16-byte loads a register, in groups of two.
struct Groups {
  int64_t G, size, whole;  // size: 4 or 2; whole: blocks in groups of size
  Groups(int64_t blocks, int64_t size) : G(blocks), size(size), whole(blocks / size * size) {}
  bool has_pair() const { return size == 4 && G - whole >= 2; }
  int64_t count() const { return whole / size + has_pair() + (G - whole - 2 * has_pair()); }
  // the group of block g: its first block, its size and its index
  void of(int64_t g, int64_t& g0, int64_t& n, int64_t& index) const {
    if (g < whole) {
      g0 = g / size * size, n = size, index = g / size;
    } else if (has_pair() && g < whole + 2) {
      g0 = whole, n = 2, index = whole / size;
    } else {
      g0 = g, n = 1, index = whole / size + has_pair();
    }
  }
  int64_t offset(int64_t g, int64_t p) const {  // where value p of block g goes
    int64_t g0, n, index;
    of(g, g0, n, index);
    return place(g0, n, g, p);
  }
  // ... with block g's group known (first block g0, n blocks)
  // (W = 32 / n values of a block a chunk: a power of two, so shifts, not divisions, on the
  // quantization's path)
  static int64_t place(int64_t g0, int64_t n, int64_t g, int64_t p) {
    const int shift = n == 4 ? 3 : n == 2 ? 4 : 5;
    return g0 * kBlock + ((p >> shift) << 5) + ((g - g0) << shift) + (p & ((int64_t{1} << shift) - 1));
  }
};

constexpr int64_t kLanes = 8;  // float lanes of a group's scales

// Activations, quantized: xq [R, K] int8 in group order, dx [R, G] the blocks' scales,
// sx = dx * sum(xq), and per group their lanes (dxl: each block's dx in its lanes; sxl: its
// sx over the lanes it fills, so that they sum to it), [R, groups * 8].
struct Quantized {
  std::vector<int8_t> xq;
  std::vector<float> dx, sx, dxl, sxl;
  int64_t lanes;  // a row's dxl and sxl
};

inline Quantized quantize(const uint16_t* x, int64_t R, int64_t K, const Groups& groups) {
  const int64_t G = K / kBlock, L = groups.count() * kLanes;
  Quantized a{std::vector<int8_t>(R * K), std::vector<float>(R * G), std::vector<float>(R * G),
              std::vector<float>(R * L), std::vector<float>(R * L), L};
  for (int64_t r = 0; r < R; ++r) {
    int8_t* q = a.xq.data() + r * K;
    for (int64_t g = 0; g < G; ++g) {
      int64_t g0, n, index;
      groups.of(g, g0, n, index);
      const uint16_t* xb = x + r * K + g * kBlock;
      float v[kBlock];
      float amax = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) v[i] = bf16_bits_to_float(xb[i]), amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int8_t c = static_cast<int8_t>(std::nearbyint(v[i] * inv));
        q[Groups::place(g0, n, g, i)] = c;
        sum += c;
      }
      a.dx[r * G + g] = d;
      a.sx[r * G + g] = d * static_cast<float>(sum);
      const int64_t per = kLanes / n, first = index * kLanes + (g - g0) * per;
      for (int64_t l = first; l < first + per; ++l) {
        a.dxl[r * L + l] = d;
        a.sxl[r * L + l] = a.sx[r * G + g] / static_cast<float>(per);
      }
    }
  }
  return a;
}

constexpr int kTile = 8;  // activation rows a pass over a weight row

// Activation rows, quantized (pointers into a Quantized at one row each).
struct Rows {
  const Groups* groups;
  const int8_t* xq[kTile];
  const float *dx[kTile], *sx[kTile], *dxl[kTile], *sxl[kTile];
};

inline Rows rows_at(const Quantized& a, const Groups& groups, int64_t r0, int T, int64_t K) {
  const int64_t G = groups.G;
  Rows rows{&groups};
  for (int t = 0; t < T; ++t) {
    const int64_t r = r0 + t;
    rows.xq[t] = a.xq.data() + r * K, rows.dx[t] = a.dx.data() + r * G, rows.sx[t] = a.sx.data() + r * G;
    rows.dxl[t] = a.dxl.data() + r * a.lanes, rows.sxl[t] = a.sxl.data() + r * a.lanes;
  }
  return rows;
}

// The activation rows in tiles of up to kTile, made once a product: a weight row stays in L1
// across its tiles (and the tiles' pointers are not rebuilt for each of its N rows).
struct Tile {
  int64_t r0;
  int T;
  Rows rows;
};

inline std::vector<Tile> tiles_of(const Quantized& a, const Groups& groups, int64_t R, int64_t K) {
  std::vector<Tile> tiles;
  for (int64_t r0 = 0; r0 < R; r0 += kTile) {
    const int T = static_cast<int>(std::min<int64_t>(kTile, R - r0));
    tiles.push_back({r0, T, rows_at(a, groups, r0, T, K)});
  }
  return tiles;
}

}  // namespace intdot
