// A whole decode step of the builtin engine's decoder on the CPU, in one call.
//
// Eager torch spends most of a small model's decode step between kernels: ~1,400 op calls
// a step, each a few microseconds of Python and dispatch (docs/benchmarks.md, issue 25).
// Here the layers loop in C++: the packed int4/int8 products stay torch's own kernels
// (called through ATen), and the small ops around them (norms, rotary, the KV store,
// attention over the paged cache, SiLU, residuals, the bfloat16 casts) are plain loops
// over the step's few rows. The arithmetic is the eager model's, in the same order where
// it matters: norms, rotary and attention in float32, kernel inputs rounded to bfloat16.
//
// Shapes: B sequences, one token each; H hidden size; nh/nkv query/KV heads of hd dims.
// The KV cache is the engine's: [layers, 2, slots, nkv, hd] of float32 or bfloat16
// (--kv-dtype); keys and values are rounded once when stored, as the eager step's cast does.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "decode_attention.h"
#include "int_dot.h"

namespace {

using bf16 = c10::BFloat16;
using decode::from_bf16;
using decode::narrow;
using decode::to_bf16;

inline const uint16_t* bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<bf16>());
}

inline uint16_t* bits(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<bf16>()); }

enum Kind : int64_t { kInt4 = 0, kInt8 = 1 };

// A packed linear: what engines/builtin/model/quant.py's PackedLinear computes.
struct Linear {
  int64_t kind;
  at::Tensor weight;      // int4: packed [out, in / 2] uint8; int8: [out, in] int8
  at::Tensor scales;      // int4: scale_zero [in / group, out, 2] bf16; int8: [out] bf16
  int64_t group_size;
  at::Tensor dense;       // [out, in] bf16 or float32, used from dense_rows rows on (undefined: never)
  int64_t dense_rows;
  at::Tensor bias;        // [out] float32, zeros where the layer has none

  Linear(int64_t kind, at::Tensor weight, at::Tensor scales, int64_t group_size,
         c10::optional<at::Tensor> dense, int64_t dense_rows, c10::optional<at::Tensor> bias)
      : kind(kind), weight(std::move(weight)), scales(std::move(scales)), group_size(group_size),
        dense(dense.value_or(at::Tensor())), dense_rows(dense_rows),
        bias(bias.has_value() ? bias->contiguous() : at::zeros({this->weight.size(0)})) {}

  // int8 activations (int_dot.h) for steps of at most int_rows rows (0: never)
  int64_t int_rows = 0;
  at::Tensor int_codes, int_scales, int_offsets;  // int4: codes, d, m; int8: codes, scales

  void use_int8_activations(int64_t rows, at::Tensor codes, at::Tensor scales, c10::optional<at::Tensor> offsets) {
    int_rows = rows, int_codes = std::move(codes), int_scales = std::move(scales);
    int_offsets = offsets.value_or(at::Tensor());
  }

  at::Tensor mm(const at::Tensor& x) const {  // [rows, in] bf16 -> [rows, out] bf16
    if (x.size(0) <= int_rows) {
      if (kind == kInt4) return intdot::int4_rows(x, int_codes, int_scales, int_offsets);
      return intdot::int8_rows(x, int_codes, int_scales);
    }
    if (dense.defined() && x.size(0) >= dense_rows) {
      // a float32 copy (CPUs without native bfloat16) multiplies float32 rows; the product
      // goes back to bfloat16, what the packed kernels return
      if (dense.scalar_type() == at::kBFloat16) return at::linear(x, dense);
      return at::linear(x.to(dense.scalar_type()), dense).to(at::kBFloat16);
    }
    if (kind == kInt4) return at::_weight_int4pack_mm_for_cpu(x, weight, group_size, scales);
    return at::_weight_int8pack_mm(x, weight, scales);
  }
};

struct Layer {
  at::Tensor input_norm, post_norm;  // [H] float32
  at::Tensor q_norm, k_norm;         // [hd] float32 (Qwen3) or undefined
  Linear qkv, o, gate_up, down;
};

inline float sum_of_squares(const float* x, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

// rows of x [rows, n] float32 -> x / rms(x) * w, rounded to bfloat16 (the kernels' input)
void rms_norm_bf16(const float* x, const float* w, uint16_t* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float inv = 1.f / std::sqrt(sum_of_squares(xr, n) / static_cast<float>(n) + eps);
    uint16_t* o = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = to_bf16(xr[i] * inv * w[i]);
  }
}

// in place, in float32: one head (Qwen3's q/k norms) or the model's final norm
void rms_norm_f32(float* x, const float* w, int64_t n, float eps) {
  const float inv = 1.f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

// dst [rows, n] = float(src) + bias, or dst += float(src) + bias (the eager model casts a
// product to float32, adds the bias, then the residual)
template <bool Accumulate>
void from_product(const at::Tensor& src, const float* bias, float* dst, int64_t rows, int64_t n) {
  const uint16_t* s = bits(src);
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * n;
    const uint16_t* sr = s + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float v = from_bf16(sr[i]) + bias[i];
      d[i] = Accumulate ? d[i] + v : v;
    }
  }
}

class DecodeModel {
 public:
  DecodeModel(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
              int64_t intermediate, double eps, double attn_scale, at::Tensor embed, at::Tensor final_norm, at::Tensor cos, at::Tensor signed_sin)
      : H_(hidden), nh_(num_heads), nkv_(num_kv_heads), hd_(head_dim), inter_(intermediate),
        eps_(static_cast<float>(eps)), scale_(static_cast<float>(attn_scale)),
        embed_(std::move(embed)), final_norm_(std::move(final_norm)), cos_(std::move(cos)),
        sin_(std::move(signed_sin)), rot_(cos_.size(1)) {
    TORCH_CHECK(rot_ <= hd_ && rot_ % 2 == 0 && rot_ <= 512, "rotary dims must be even, at most head_dim and 512");
    TORCH_CHECK(nh_ % nkv_ == 0, "num_heads must be a multiple of num_kv_heads");
  }

  void add_layer(at::Tensor input_norm, at::Tensor post_norm, c10::optional<at::Tensor> q_norm,
                 c10::optional<at::Tensor> k_norm, Linear qkv, Linear o, Linear gate_up, Linear down) {
    layers_.push_back(Layer{std::move(input_norm), std::move(post_norm),
                            q_norm.value_or(at::Tensor()), k_norm.value_or(at::Tensor()),
                            std::move(qkv), std::move(o), std::move(gate_up), std::move(down)});
  }

  // The final-normed hidden rows [B, H] float32 of one decode step; writes each row's new
  // keys and values into the cache at its slot. table: [B, W] blocks from position 0.
  at::Tensor step(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& slots,
                  const at::Tensor& table, const at::Tensor& kv_lens, at::Tensor& kv_cache,
                  int64_t block_size) {
    const int64_t B = ids.size(0);
    for (const at::Tensor* t : {&ids, &positions, &slots, &table, &kv_lens})
      TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "step inputs must be contiguous int64");
    TORCH_CHECK(positions.size(0) == B && slots.size(0) == B && kv_lens.size(0) == B && table.size(0) == B,
                "step inputs must have one row per sequence");
    const auto kv_type = kv_cache.scalar_type();
    TORCH_CHECK((kv_type == at::kFloat || kv_type == at::kBFloat16) &&
                    kv_cache.is_contiguous() && kv_cache.size(0) == num_layers() &&
                    kv_cache.size(3) == nkv_ && kv_cache.size(4) == hd_,
                "the KV cache must be the model's, contiguous float32 or bfloat16");
    const int64_t width = (nh_ + 2 * nkv_) * hd_;  // q, k, v side by side
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const auto b16 = at::TensorOptions().dtype(at::kBFloat16);
    at::Tensor x = at::index_select(embed_, 0, ids).contiguous();  // [B, H] the residual stream
    at::Tensor normed = at::empty({B, H_}, b16);                   // [B, H] kernel inputs
    at::Tensor qkv = at::empty({B, width}, f32);                   // [B, width]
    at::Tensor attn = at::empty({B, nh_ * hd_}, b16);              // [B, nh * hd]
    at::Tensor act = at::empty({B, inter_}, b16);                  // [B, intermediate]
    float* xs = x.data_ptr<float>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(pos[b] >= 0 && pos[b] < cos_.size(0) && slot[b] >= 0 && slot[b] < kv_cache.size(2),
                  "a position or KV slot is out of range");
    const auto run = [&](auto* cache) {
      run_layers(x, qkv, normed, attn, act, pos, slot, table, kv_lens, cache, kv_cache.size(2), block_size);
    };
    if (kv_type == at::kFloat)
      run(kv_cache.data_ptr<float>());
    else
      run(bits(kv_cache));
    for (int64_t b = 0; b < B; ++b) rms_norm_f32(xs + b * H_, final_norm_.data_ptr<float>(), H_, eps_);
    return x;
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  // The layers over the residual rows x [B, H], with a cache of element type C.
  template <typename C>
  void run_layers(at::Tensor& x, at::Tensor& qkv, at::Tensor& normed, at::Tensor& attn, at::Tensor& act,
                  const int64_t* pos, const int64_t* slot, const at::Tensor& table, const at::Tensor& kv_lens,
                  C* cache, int64_t num_slots, int64_t block_size) {
    const int64_t B = x.size(0);
    const int64_t width = (nh_ + 2 * nkv_) * hd_;
    const int64_t kv_row = nkv_ * hd_;
    const int64_t cache_stride = num_slots * kv_row;  // one layer's keys (or values)
    float* xs = x.data_ptr<float>();
    float* qs = qkv.data_ptr<float>();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      C* k_cache = cache + (2 * l) * cache_stride;
      C* v_cache = cache + (2 * l + 1) * cache_stride;
      rms_norm_bf16(xs, L.input_norm.data_ptr<float>(), bits(normed), B, H_, eps_);
      from_product<false>(L.qkv.mm(normed), L.qkv.bias.data_ptr<float>(), qs, B, width);
      for (int64_t b = 0; b < B; ++b) {
        float* row = qs + b * width;
        if (L.q_norm.defined()) {
          for (int64_t h = 0; h < nh_; ++h) rms_norm_f32(row + h * hd_, L.q_norm.data_ptr<float>(), hd_, eps_);
          for (int64_t h = nh_; h < nh_ + nkv_; ++h)
            rms_norm_f32(row + h * hd_, L.k_norm.data_ptr<float>(), hd_, eps_);
        }
        for (int64_t h = 0; h < nh_ + nkv_; ++h) rotate(row + h * hd_, pos[b]);
        const float* k = row + nh_ * hd_;  // then v
        C* kc = k_cache + slot[b] * kv_row;
        C* vc = v_cache + slot[b] * kv_row;
#pragma omp simd
        for (int64_t i = 0; i < kv_row; ++i) kc[i] = narrow<C>(k[i]), vc[i] = narrow<C>(k[kv_row + i]);
      }
      decode::attend(decode::Heads{nh_, nkv_, hd_, scale_}, qs, width, k_cache, v_cache, table, kv_lens, block_size,
                     bits(attn));
      from_product<true>(L.o.mm(attn), L.o.bias.data_ptr<float>(), xs, B, H_);
      rms_norm_bf16(xs, L.post_norm.data_ptr<float>(), bits(normed), B, H_, eps_);
      gate_times_up(L.gate_up.mm(normed), L.gate_up.bias.data_ptr<float>(), bits(act), B);
      from_product<true>(L.down.mm(act), L.down.bias.data_ptr<float>(), xs, B, H_);
    }
  }

  // silu(gate + bias) * (up + bias) in float32, rounded to bfloat16 for the down product
  void gate_times_up(const at::Tensor& gu, const float* bias, uint16_t* out, int64_t rows) const {
    const uint16_t* s = bits(gu);
    const float* gate_bias = bias;
    const float* up_bias = bias + inter_;
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* g = s + r * 2 * inter_;
      const uint16_t* u = g + inter_;
      uint16_t* o = out + r * inter_;
#pragma omp simd
      for (int64_t i = 0; i < inter_; ++i) {
        const float gate = from_bf16(g[i]) + gate_bias[i];
        o[i] = to_bf16(gate / (1.f + std::exp(-gate)) * (from_bf16(u[i]) + up_bias[i]));
      }
    }
  }

  // rotate-half rope over the leading rot_ dims: x * cos + roll(x, rot_ / 2) * signed_sin
  void rotate(float* h, int64_t position) const {
    const float* c = cos_.data_ptr<float>() + position * rot_;
    const float* s = sin_.data_ptr<float>() + position * rot_;
    const int64_t half = rot_ / 2;
    float lo[256], hi[256];
    std::memcpy(lo, h, half * sizeof(float));
    std::memcpy(hi, h + half, half * sizeof(float));
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      h[i] = lo[i] * c[i] + hi[i] * s[i];
      h[half + i] = hi[i] * c[half + i] + lo[i] * s[half + i];
    }
  }

  int64_t H_, nh_, nkv_, hd_, inter_;
  float eps_, scale_;
  at::Tensor embed_, final_norm_, cos_, sin_;
  int64_t rot_;
  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Linear>(m, "Linear")
      .def(py::init<int64_t, at::Tensor, at::Tensor, int64_t, c10::optional<at::Tensor>, int64_t,
                    c10::optional<at::Tensor>>())
      .def("use_int8_activations", &Linear::use_int8_activations);
  m.def("int4_rows", &intdot::int4_rows, py::call_guard<py::gil_scoped_release>());
  m.def("int8_rows", &intdot::int8_rows, py::call_guard<py::gil_scoped_release>());
  py::class_<DecodeModel>(m, "DecodeModel")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double, at::Tensor, at::Tensor,
                    at::Tensor, at::Tensor>())
      .def("add_layer", &DecodeModel::add_layer)
      .def("step", &DecodeModel::step, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_layers", &DecodeModel::num_layers);
}
