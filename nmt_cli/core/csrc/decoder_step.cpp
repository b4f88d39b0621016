// One incremental decoder step of nmt's Transformer, as one C++ call.
//
// The Python step (nmt_cli/core/transformer.py: Transformer.decode_step and the `step`
// methods it calls) is the reference: this file makes the same ATen calls (and calls the
// same kernels of this module for the linear layers that use them) in the same order, so
// its outputs are bit-identical, and only removes the Python between them. At
// a few rows a step is a few hundred small operator calls, and calling each from Python
// costs about as much as the operator itself (docs/ARCHITECTURE.md has the figures).
// Any change to the Python step must be made here too; the tests compare the two.
#include <torch/extension.h>

#include "attention.h"
#include "beam_topk.h"
#include "bf16_linear.h"
#include "int8_linear.h"
#include "log_softmax.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
// A linear layer as the Python side built it (core/decode_linear.py): a plain nn.Linear
// (fp32), a packed bf16 one (oneDNN's layout, and this module's for few rows), an int8
// one for this module's per-row kernel, or PyTorch's dynamically quantized int8 weight
// (CPUs without AVX-512 VNNI).
class Linear {
 public:
  enum class Kind { kPlain, kPacked, kInt8, kInt8Rows };

  explicit Linear(const py::tuple& spec) {
    const auto kind = spec[0].cast<std::string>();
    if (kind == "plain") {
      kind_ = Kind::kPlain;
      weight_ = spec[1].cast<Tensor>();
      if (!spec[2].is_none()) bias_ = spec[2].cast<Tensor>();
    } else if (kind == "packed") {  // bf16: oneDNN's packed weight, and maybe the kernel's
      kind_ = Kind::kPacked;
      weight_ = spec[1].cast<Tensor>();
      if (!spec[2].is_none()) bias_ = spec[2].cast<Tensor>();
      if (!spec[3].is_none()) rows_packed_ = spec[3].cast<Tensor>();
      n_ = spec[4].cast<int64_t>();
    } else if (kind == "int8-rows") {  // the module's own kernel (int8_linear.cpp)
      kind_ = Kind::kInt8Rows;
      weight_ = spec[1].cast<Tensor>();
      scale_ = spec[2].cast<Tensor>();
      column_sum_ = spec[3].cast<Tensor>();
      if (!spec[4].is_none()) bias_ = spec[4].cast<Tensor>();
      n_ = spec[5].cast<int64_t>();
    } else if (kind == "int8") {
      // The quantized weight, packed again here: the packed form is a TorchScript object,
      // which the Python binding cannot hand over.
      kind_ = Kind::kInt8;
      const OptTensor bias = spec[2].is_none() ? OptTensor() : spec[2].cast<Tensor>();
      torch::jit::Stack stack{spec[1].cast<Tensor>(), bias};
      op("quantized::linear_prepack").callBoxed(&stack);
      packed_ = stack.back();
      reduce_range_ = spec[3].cast<bool>();
    } else {
      throw std::invalid_argument("unknown linear kind " + kind);
    }
  }

  Tensor operator()(const Tensor& x) const { return run(x, false); }

  // Whether the layer runs on this module's kernels (core/decode_linear.py: its
  // `kernel` is set), which also decides the log-softmax after the output projection.
  bool uses_module() const {
    return kind_ == Kind::kInt8Rows || (kind_ == Kind::kPacked && rows_packed_.has_value());
  }

  // max(0, x W^T + b): fused into the product except for plain layers.
  Tensor relu(const Tensor& x) const { return run(x, true); }

  // residual + x W^T + b: fused into the module's products (bf16, int8 by rows).
  Tensor add(const Tensor& x, const Tensor& residual) const {
    if (kind_ == Kind::kPacked) {
      return nmt::packed_linear(x, weight_, rows_packed_, n_, bias_, residual, false);
    }
    if (kind_ == Kind::kInt8Rows) {
      return nmt::int8_linear(x, weight_, scale_, column_sum_, n_, bias_, residual, false);
    }
    return at::add(residual, (*this)(x));
  }

 private:
  Tensor run(const Tensor& x, bool relu) const {
    switch (kind_) {
      case Kind::kPlain: {
        Tensor y = at::linear(x, weight_, bias_);
        return relu ? at::relu(y) : y;
      }
      case Kind::kPacked:
        return nmt::packed_linear(x, weight_, rows_packed_, n_, bias_, std::nullopt, relu);
      case Kind::kInt8:
        return int8(relu ? "quantized::linear_relu_dynamic" : "quantized::linear_dynamic", x);
      case Kind::kInt8Rows:
        return nmt::int8_linear(x, weight_, scale_, column_sum_, n_, bias_, std::nullopt, relu);
    }
    return Tensor();
  }

  static c10::OperatorHandle op(const char* name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  }
  Tensor int8(const char* name, const Tensor& x) const {
    // The packed weight is a TorchScript object: the op is called boxed.
    torch::jit::Stack stack{x, packed_, reduce_range_};
    op(name).callBoxed(&stack);
    return stack.back().toTensor();
  }

  Kind kind_ = Kind::kPlain;
  Tensor weight_;
  Tensor scale_, column_sum_;
  OptTensor bias_, rows_packed_;
  int64_t n_ = 0;
  c10::IValue packed_;
  bool reduce_range_ = false;
};

struct Norm {
  Tensor weight, bias;
};

struct Layer {
  Linear qkv, self_out, cross_q, cross_out, ff1, ff2;
  Norm norm1, norm2, norm3;
};

Norm norm_of(const py::tuple& t) { return {t[0].cast<Tensor>(), t[1].cast<Tensor>()}; }

// cat([prefix[rows], new], dim=2) written into one new tensor (core/cache.py, _gather_append).
Tensor gather_append(const Tensor& prefix, const OptTensor& rows, const Tensor& added) {
  const int64_t length = prefix.size(2);
  Tensor out = at::empty({added.size(0), prefix.size(1), length + 1, prefix.size(3)},
                         prefix.options());
  Tensor head = out.narrow(2, 0, length);
  if (rows.has_value()) {
    at::index_select_out(head, prefix, 0, *rows);
  } else {
    head.copy_(prefix);
  }
  out.narrow(2, length, 1).copy_(added);
  return out;
}

class DecoderStep {
 public:
  DecoderStep(const py::dict& spec)
      : heads_(spec["heads"].cast<int64_t>()),
        d_k_(spec["d_k"].cast<int64_t>()),
        d_v_(spec["d_v"].cast<int64_t>()),
        eps_(spec["eps"].cast<double>()),
        embed_scale_(spec["embed_scale"].cast<double>()),
        tokens_(spec["tokens"].cast<Tensor>()),
        positions_(spec["positions"].cast<Tensor>()),
        projection_(spec["projection"].cast<py::tuple>()) {
    for (const auto& item : spec["layers"].cast<py::list>()) {
      const auto t = item.cast<py::tuple>();
      layers_.push_back(Layer{Linear(t[0].cast<py::tuple>()), Linear(t[1].cast<py::tuple>()),
                              Linear(t[2].cast<py::tuple>()), Linear(t[3].cast<py::tuple>()),
                              Linear(t[4].cast<py::tuple>()), Linear(t[5].cast<py::tuple>()),
                              norm_of(t[6].cast<py::tuple>()), norm_of(t[7].cast<py::tuple>()),
                              norm_of(t[8].cast<py::tuple>())});
    }
  }

  // ids (B,) at `position` -> [log-probabilities (B, V) in float32, then per layer the
  // new self-attention keys and values (B, h, position + 1, d)], over core/cache.py's
  // DecoderCache. `cache` holds per layer self_k, self_v (none before the first step),
  // pending rows, cross_k, cross_v, cross_bias; the cross-attention tensors must already
  // be there (Transformer.decode_step stores them before the first step).
  std::vector<Tensor> step(const Tensor& ids, int64_t position,
                           const std::vector<OptTensor>& cache) const {
    c10::InferenceMode guard;
    std::vector<Tensor> result{Tensor()};
    const int64_t rows = ids.size(0), bh = rows * heads_;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_k_));
    const auto self_attention = [&](size_t l, const Tensor& q, const Tensor& k_new,
                                    const Tensor& v_new) {
      const OptTensor* c = &cache[l * 6];
      const at::ScalarType dtype = c[3]->scalar_type();  // the cache's (cross_k's)
      Tensor k = k_new.view({rows, heads_, 1, d_k_});
      Tensor v = v_new.view({rows, heads_, 1, d_v_});
      if (c[0].has_value()) {
        k = gather_append(*c[0], c[2], k);
        v = gather_append(*c[1], c[2], v);
      } else {  // the first step (LayerCache.append_self)
        k = k.to(dtype).contiguous();
        v = v.to(dtype).contiguous();
      }
      const int64_t keys = k.size(2);
      Tensor qh = q.to(k.scalar_type()).reshape({bh, 1, d_k_});
      Tensor scores = at::bmm(qh, k.view({bh, keys, d_k_}).transpose(1, 2)).mul_(scale);
      result.push_back(k);
      result.push_back(v);
      return at::bmm(scores.softmax(-1), v.view({bh, keys, d_v_})).view({rows, heads_ * d_v_});
    };
    const auto cross_attention = [&](size_t l, const Tensor& q_in) {
      const OptTensor* c = &cache[l * 6];
      const Tensor& cross_k = *c[3];
      const Tensor& cross_v = *c[4];
      const int64_t keys = cross_k.size(2);
      Tensor q = q_in.to(cross_k.scalar_type()).reshape({bh, 1, d_k_});
      Tensor k_t = cross_k.view({bh, keys, d_k_}).transpose(1, 2);
      Tensor scores = c[5].has_value() ? at::baddbmm(c[5]->view({bh, 1, keys}), q, k_t, 1.0, scale)
                                       : at::bmm(q, k_t).mul_(scale);
      return at::bmm(scores.softmax(-1), cross_v.view({bh, keys, d_v_})).view({rows, heads_ * d_v_});
    };
    result[0] = forward(ids, position, self_attention, cross_attention);
    return result;
  }

  // The same over core/cache.py's SlotCache, with the module's attention kernel: `layers`
  // holds per layer self_k, self_v (W, T, h, d) that the kernel writes in place, cross_k, cross_v
  // (N, S, h, d) and cross_bias; `slots` and `sources` are the cache's tables, already
  // prepared for this step. -> log-probabilities (B, V) in float32.
  Tensor step_slots(const Tensor& ids, int64_t position, const std::vector<OptTensor>& layers,
                    const Tensor& slots, const Tensor& sources) const {
    c10::InferenceMode guard;
    const int64_t rows = ids.size(0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_k_));
    const auto self_attention = [&](size_t l, const Tensor& q, const Tensor& k_new,
                                    const Tensor& v_new) {
      return nmt::attend_prefix(q, k_new, v_new, *layers[l * 5], *layers[l * 5 + 1], slots,
                                position + 1, scale, std::nullopt);
    };
    const auto cross_attention = [&](size_t l, const Tensor& q) {
      const OptTensor* c = &layers[l * 5 + 2];
      return nmt::attend_memory(q, *c[0], *c[1], sources, c[2], scale, std::nullopt);
    };
    return forward(ids, position, self_attention, cross_attention);
  }

 private:
  // The layers and the output projection around the two attentions, which depend on the
  // cache's layout: self_attention(layer, q, k, v) and cross_attention(layer, q) return
  // the context (B, h * d_v).
  template <typename Self, typename Cross>
  Tensor forward(const Tensor& ids, int64_t position, const Self& self_attention,
                 const Cross& cross_attention) const {
    const int64_t qk = heads_ * d_k_, vdim = heads_ * d_v_;
    Tensor y = at::add(at::embedding(tokens_, ids).mul(embed_scale_),
                       positions_.narrow(0, position, 1));
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const auto qkv = layer.qkv(y).split_with_sizes({qk, qk, vdim}, -1);
      Tensor ctx = self_attention(l, qkv[0], qkv[1], qkv[2]);
      y = layer.self_out.add(ctx.to(y.scalar_type()), y);
      y = at::layer_norm(y, {y.size(1)}, layer.norm1.weight, layer.norm1.bias, eps_);
      ctx = cross_attention(l, layer.cross_q(y));
      y = layer.cross_out.add(ctx.to(y.scalar_type()), y);
      y = at::layer_norm(y, {y.size(1)}, layer.norm2.weight, layer.norm2.bias, eps_);
      y = layer.ff2.add(layer.ff1.relu(y), y);
      y = at::layer_norm(y, {y.size(1)}, layer.norm3.weight, layer.norm3.bias, eps_);
    }
    // As Transformer.decode_step (decode_linear.log_probs): the module's log-softmax after
    // a projection on its kernels (bf16, int8), PyTorch's otherwise (fp32 models).
    return projection_.uses_module() ? nmt::fast_log_softmax(projection_(y))
                                     : at::log_softmax(projection_(y), -1, at::kFloat);
  }

  int64_t heads_, d_k_, d_v_;
  double eps_, embed_scale_;
  Tensor tokens_, positions_;
  Linear projection_;
  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<DecoderStep>(m, "DecoderStep")
      .def(py::init<const py::dict&>())
      .def("step", &DecoderStep::step)
      .def("step_slots", &DecoderStep::step_slots);
  m.def("bf16_kernel_available", &nmt::bf16_kernel_available);
  m.def("pack_bf16", &nmt::pack_bf16);
  m.def("packed_linear", &nmt::packed_linear);
  m.def("beam_topk", &nmt::beam_topk);
  m.def("beam_advance", &nmt::beam_advance);
  m.def("int8_kernel_available", &nmt::int8_kernel_available);
  m.def("pack_int8", &nmt::pack_int8);
  m.def("int8_linear", &nmt::int8_linear);
  m.def("fast_log_softmax", &nmt::fast_log_softmax);
  m.def("attention_kernel_available", &nmt::attention_kernel_available);
  m.def("attend_prefix", &nmt::attend_prefix);
  m.def("attend_memory", &nmt::attend_memory);
}
