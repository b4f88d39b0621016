// One incremental decoder step of nmt's Transformer, as one C++ call; and its encoder,
// with the cross-attention keys and values it gives each decoder layer, as another.
//
// The Python step (nmt_cli/core/transformer.py: Transformer.decode_step and the `step`
// methods it calls) is the reference: this file runs the same ATen kernels (and the same
// kernels of this module for the linear layers that use them) in the same order, so its
// outputs are bit-identical, and only removes the Python between them. At a few rows a
// step is a few hundred small operator calls, and calling each from Python costs about
// as much as the operator itself (BENCHMARKS.md has the figures). For the same reason
// a call that would return its operand as it is is not made (operands.h), and LayerNorm
// goes straight to `native_layer_norm`, the kernel that `layer_norm` wraps.
// The tests compare the two steps on every precision and cache layout
// (tests/unit/test_compiled_step.py); what the Python side hands over is named, in one
// table on each side (kContract here, nmt_cli/backends/cpu/contract.py there), compared
// when the module is loaded.
// ATen and pybind11 with PyTorch's tensor conversions, not <torch/extension.h>: that
// header also brings the whole C++ frontend (modules, optimizers, data loaders), which
// none of this uses and which takes longer to read than all of this file's own code.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>

#include "attention.h"
#include "attention_train.h"
#include "beam_topk.h"
#include "bf16_linear.h"
#include "bias_relu.h"
#include "cpu_level.h"
#include "dropout_mask.h"
#include "fp32_linear.h"
#include "int8_linear.h"
#include "log_softmax.h"
#include "operands.h"
#include "sentence_books.h"
#include "smoothed_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using Fields = std::vector<std::string>;

// The named contract: the fields of each structure the Python side hands over
// (backends/cpu/contract.py: STRUCTURES), compared at load by the Python side.
const std::map<std::string, Fields> kContract = {
    {"step", {"heads", "d_k", "d_v", "eps", "embed_scale", "source_tokens", "source_positions",
              "encoder_layers", "tokens", "positions", "projection", "module_log_softmax",
              "layers"}},
    {"encoder_layer", {"self_qkv", "self_out", "ffn_w1", "ffn_w2", "norm1", "norm2"}},
    {"layer", {"self_qkv", "self_out", "cross_q", "cross_kv", "cross_out", "ffn_w1", "ffn_w2",
               "norm1", "norm2", "norm3"}},
    {"norm", {"weight", "bias"}},
    {"linear.plain", {"weight", "bias"}},
    {"linear.packed", {"packed", "bias", "rows", "out_features"}},
    {"linear.fp32_rows", {"weight", "rows", "bias"}},
    {"linear.int8_rows", {"rows", "scale", "column_sum", "bias", "out_features"}},
    {"linear.int8", {"weight", "bias", "reduce_range"}},
    // Per layer, the cache's attributes a step reads (and, over the prefix cache, writes).
    {"cache.prefix", {"self_k", "self_v", "pending", "cross_k", "cross_v", "cross_bias"}},
    {"cache.slots", {"self_k", "self_v", "cross_k", "cross_v", "cross_bias"}},
};

// Field `name` of `structure` in the dict `from`; a name missing from the table is a bug
// of this file, a key missing from the dict one of the Python side: both say which.
py::object field(const py::dict& from, const std::string& structure, const char* name) {
  const Fields& names = kContract.at(structure);
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw std::logic_error(structure + ": field " + name + " is not in the contract table");
  }
  if (!from.contains(name)) {
    throw std::invalid_argument(structure + ": the Python side gave no field " + name);
  }
  return from[name];
}

template <typename T>
T get(const py::dict& from, const std::string& structure, const char* name) {
  return field(from, structure, name).cast<T>();
}

OptTensor optional(const py::object& value) {
  return value.is_none() ? OptTensor() : OptTensor(value.cast<Tensor>());
}

// A cache layer's tensor attribute (kContract's "cache.*" fields), read every step.
OptTensor state(const py::handle& layer, const char* name) {
  return optional(layer.attr(name));
}
// A linear layer as the Python side built it (backends/cpu/linear.py): a plain nn.Linear
// (fp32), an fp32 one with this module's layout for few rows (AVX2 CPUs), a packed bf16
// one (oneDNN's layout, and this module's for few rows), an int8 one for this module's
// per-row kernel, or PyTorch's dynamically quantized int8 weight (no compiled kernel).
class Linear {
 public:
  enum class Kind { kPlain, kFp32Rows, kPacked, kInt8, kInt8Rows };

  explicit Linear(const py::dict& spec) {
    const auto kind = spec["kind"].cast<std::string>();
    const std::string structure = "linear." + kind;
    if (kind == "plain") {
      kind_ = Kind::kPlain;
      weight_ = get<Tensor>(spec, structure, "weight");
      bias_ = optional(field(spec, structure, "bias"));
    } else if (kind == "fp32_rows") {  // fp32: the weight, and the kernel's layout of it
      kind_ = Kind::kFp32Rows;
      weight_ = get<Tensor>(spec, structure, "weight");
      rows_packed_ = get<Tensor>(spec, structure, "rows");
      bias_ = optional(field(spec, structure, "bias"));
    } else if (kind == "packed") {  // bf16: oneDNN's packed weight, and maybe the kernel's
      kind_ = Kind::kPacked;
      weight_ = get<Tensor>(spec, structure, "packed");
      bias_ = optional(field(spec, structure, "bias"));
      rows_packed_ = optional(field(spec, structure, "rows"));
      n_ = get<int64_t>(spec, structure, "out_features");
    } else if (kind == "int8_rows") {  // the module's own kernel (int8_linear.cpp)
      kind_ = Kind::kInt8Rows;
      weight_ = get<Tensor>(spec, structure, "rows");
      scale_ = get<Tensor>(spec, structure, "scale");
      column_sum_ = get<Tensor>(spec, structure, "column_sum");
      bias_ = optional(field(spec, structure, "bias"));
      n_ = get<int64_t>(spec, structure, "out_features");
    } else if (kind == "int8") {
      // The quantized weight, packed again here: the packed form is a TorchScript object,
      // which the Python binding cannot hand over.
      kind_ = Kind::kInt8;
      const OptTensor bias = optional(field(spec, structure, "bias"));
      torch::jit::Stack stack{get<Tensor>(spec, structure, "weight"), bias};
      op("quantized::linear_prepack").callBoxed(&stack);
      packed_ = stack.back();
      reduce_range_ = get<bool>(spec, structure, "reduce_range");
    } else {
      throw std::invalid_argument("unknown linear kind " + kind);
    }
  }

  Tensor operator()(const Tensor& x) const { return run(x, false); }

  // max(0, x W^T + b): fused into the product except for plain layers.
  Tensor relu(const Tensor& x) const { return run(x, true); }

  // residual + x W^T + b: fused into the module's products (fp32 and bf16 for few rows,
  // int8 by rows).
  Tensor add(const Tensor& x, const Tensor& residual) const {
    if (kind_ == Kind::kFp32Rows) {
      return nmt::rows_linear(x, weight_, *rows_packed_, bias_, residual, false);
    }
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
      case Kind::kFp32Rows:
        return nmt::rows_linear(x, weight_, *rows_packed_, bias_, std::nullopt, relu);
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

struct EncoderLayer {
  Linear qkv, out, ff1, ff2;
  Norm norm1, norm2;
};

struct Layer {
  Linear qkv, self_out, cross_q, cross_kv, cross_out, ff1, ff2;
  Norm norm1, norm2, norm3;
};

// Field `name` of a layer's spec (`structure`: "layer" or "encoder_layer") as a Linear or
// a Norm.
Linear linear_of(const py::dict& spec, const std::string& structure, const char* name) {
  return Linear(get<py::dict>(spec, structure, name));
}

Norm norm_of(const py::dict& spec, const std::string& structure, const char* name) {
  const auto norm = get<py::dict>(spec, structure, name);
  return {get<Tensor>(norm, "norm", "weight"), get<Tensor>(norm, "norm", "bias")};
}

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
      : heads_(get<int64_t>(spec, "step", "heads")),
        d_k_(get<int64_t>(spec, "step", "d_k")),
        d_v_(get<int64_t>(spec, "step", "d_v")),
        eps_(get<double>(spec, "step", "eps")),
        embed_scale_(get<double>(spec, "step", "embed_scale")),
        source_tokens_(get<Tensor>(spec, "step", "source_tokens")),
        source_positions_(get<Tensor>(spec, "step", "source_positions")),
        tokens_(get<Tensor>(spec, "step", "tokens")),
        positions_(get<Tensor>(spec, "step", "positions")),
        projection_(get<py::dict>(spec, "step", "projection")),
        module_log_softmax_(get<bool>(spec, "step", "module_log_softmax")) {
    const std::string E = "encoder_layer";
    for (const auto& item : get<py::list>(spec, "step", "encoder_layers")) {
      const auto layer = item.cast<py::dict>();
      encoder_.push_back(EncoderLayer{
          linear_of(layer, E, "self_qkv"), linear_of(layer, E, "self_out"),
          linear_of(layer, E, "ffn_w1"), linear_of(layer, E, "ffn_w2"),
          norm_of(layer, E, "norm1"), norm_of(layer, E, "norm2")});
    }
    const std::string D = "layer";
    for (const auto& item : get<py::list>(spec, "step", "layers")) {
      const auto layer = item.cast<py::dict>();
      layers_.push_back(Layer{
          linear_of(layer, D, "self_qkv"), linear_of(layer, D, "self_out"),
          linear_of(layer, D, "cross_q"), linear_of(layer, D, "cross_kv"),
          linear_of(layer, D, "cross_out"), linear_of(layer, D, "ffn_w1"),
          linear_of(layer, D, "ffn_w2"), norm_of(layer, D, "norm1"), norm_of(layer, D, "norm2"),
          norm_of(layer, D, "norm3")});
    }
  }

  // src (B, S) ids and key_mask (B, 1, 1, S), true on real tokens -> the encoder's output
  // (B, S, D): Transformer.encode at inference (EncoderLayer.forward without dropout,
  // its linear layers' ReLU and residual add fused as `linear_relu` and `linear_add`
  // fuse them, its attention PyTorch's fused kernel as the CPU plan's decoding
  // attention), the same calls in the same order.
  Tensor encode(const Tensor& src, const Tensor& key_mask) const {
    c10::InferenceMode guard;
    const int64_t batch = src.size(0), length = src.size(1);
    const int64_t qk = heads_ * d_k_, vdim = heads_ * d_v_;
    Tensor x = at::add(at::embedding(source_tokens_, src).mul(embed_scale_),
                       source_positions_.narrow(0, 0, length));
    for (const EncoderLayer& layer : encoder_) {
      const auto qkv = layer.qkv(x).split_with_sizes({qk, qk, vdim}, -1);
      const Tensor q = qkv[0].view({batch, length, heads_, d_k_}).transpose(1, 2);
      const Tensor k = qkv[1].view({batch, length, heads_, d_k_}).transpose(1, 2);
      const Tensor v = qkv[2].view({batch, length, heads_, d_v_}).transpose(1, 2);
      const Tensor ctx = at::scaled_dot_product_attention(q, k, v, key_mask, 0.0, false);
      x = layer.out.add(ctx.transpose(1, 2).reshape({batch, length, vdim}), x);
      x = norm(x, layer.norm1);
      x = layer.ff2.add(layer.ff1.relu(x), x);
      x = norm(x, layer.norm2);
    }
    return x;
  }

  // Every decoder layer's cross-attention keys and values of `memory` (B, S, D) stored in
  // the SlotCache's `layers` ("cache.slots": cross_k and cross_v (B, S, h, d) in `dtype`,
  // cross_bias (B, S) float32, -inf at padding, or None where `key_mask` has none):
  // what SlotLayer.store_memory stores of MultiHeadAttention.project_kv's keys and values.
  void cache_memory(const Tensor& memory, const Tensor& key_mask, const py::list& layers,
                    at::ScalarType dtype) const {
    c10::InferenceMode guard;
    const int64_t batch = memory.size(0), length = memory.size(1), qk = heads_ * d_k_;
    OptTensor bias;
    if (!key_mask.all().item<bool>()) {
      const Tensor mask = key_mask.view({batch, -1});
      bias = at::zeros(mask.sizes(), at::kFloat).masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity());
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Tensor kv = layers_[l].cross_kv(memory);
      py::object layer = layers[l];
      layer.attr("cross_k") =
          kv.narrow(-1, 0, qk).view({batch, length, heads_, d_k_}).to(dtype).contiguous();
      layer.attr("cross_v") = kv.narrow(-1, qk, heads_ * d_v_)
                                  .view({batch, length, heads_, d_v_})
                                  .to(dtype)
                                  .contiguous();
      layer.attr("cross_bias") = bias.has_value() ? py::cast(*bias) : py::none();
    }
  }

  // ids (B,) at `position` -> log-probabilities (B, V) in float32 (with `log_probs`; else
  // the logits, see `forward`), over core/cache.py's
  // DecoderCache: `layers` are its LayerCaches ("cache.prefix": self_k, self_v (none
  // before the first step), pending rows, cross_k, cross_v, cross_bias); the
  // cross-attention tensors must already be there (the Python side stores them before the
  // first step). Each layer's self_k and self_v are replaced by the prefix with this
  // step's keys and values, and its pending reorder is cleared, as LayerCache.append_self
  // does.
  Tensor step(const Tensor& ids, int64_t position, const py::list& layers, bool log_probs) const {
    c10::InferenceMode guard;
    const int64_t rows = ids.size(0), bh = rows * heads_;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_k_));
    std::vector<std::pair<Tensor, Tensor>> appended;
    const auto self_attention = [&](size_t l, const Tensor& q, const Tensor& k_new,
                                    const Tensor& v_new) {
      const py::object layer = layers[l];
      const OptTensor self_k = state(layer, "self_k"), self_v = state(layer, "self_v");
      const at::ScalarType dtype = state(layer, "cross_k")->scalar_type();  // the cache's
      Tensor k = k_new.view({rows, heads_, 1, d_k_});
      Tensor v = v_new.view({rows, heads_, 1, d_v_});
      if (self_k.has_value() && self_v.has_value()) {
        const OptTensor pending = state(layer, "pending");
        k = gather_append(*self_k, pending, k);
        v = gather_append(*self_v, pending, v);
      } else {  // the first step (LayerCache.append_self)
        k = k.to(dtype).contiguous();
        v = v.to(dtype).contiguous();
      }
      const int64_t keys = k.size(2);
      Tensor qh = q.to(k.scalar_type()).reshape({bh, 1, d_k_});
      Tensor scores = at::bmm(qh, k.view({bh, keys, d_k_}).transpose(1, 2)).mul_(scale);
      appended.emplace_back(k, v);
      return at::bmm(scores.softmax(-1), v.view({bh, keys, d_v_})).view({rows, heads_ * d_v_});
    };
    const auto cross_attention = [&](size_t l, const Tensor& q_in) {
      const py::object layer = layers[l];
      const Tensor cross_k = *state(layer, "cross_k");
      const Tensor cross_v = *state(layer, "cross_v");
      const OptTensor bias = state(layer, "cross_bias");
      const int64_t keys = cross_k.size(2);
      Tensor q = q_in.to(cross_k.scalar_type()).reshape({bh, 1, d_k_});
      Tensor k_t = cross_k.view({bh, keys, d_k_}).transpose(1, 2);
      Tensor scores = bias.has_value() ? at::baddbmm(bias->view({bh, 1, keys}), q, k_t, 1.0, scale)
                                       : at::bmm(q, k_t).mul_(scale);
      return at::bmm(scores.softmax(-1), cross_v.view({bh, keys, d_v_})).view({rows, heads_ * d_v_});
    };
    Tensor lprobs = forward(ids, position, self_attention, cross_attention, log_probs);
    for (size_t l = 0; l < appended.size(); ++l) {
      py::object layer = layers[l];
      layer.attr("self_k") = appended[l].first;
      layer.attr("self_v") = appended[l].second;
      layer.attr("pending") = py::none();
    }
    return lprobs;
  }

  // The same over backends/cpu/slot_cache.py's SlotCache, with the module's attention
  // kernel: `layers` are its SlotLayers ("cache.slots": self_k, self_v (W, T, h, d), which
  // the kernel writes in place, cross_k, cross_v (N, S, h, d) and cross_bias); `slots` and
  // `sources` are the cache's tables, already prepared for this step.
  // -> log-probabilities (B, V) in float32.
  Tensor step_slots(const Tensor& ids, int64_t position, const py::list& layers,
                    const Tensor& slots, const Tensor& sources, bool log_probs) const {
    c10::InferenceMode guard;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_k_));
    const auto self_attention = [&](size_t l, const Tensor& q, const Tensor& k_new,
                                    const Tensor& v_new) {
      const py::object layer = layers[l];
      return nmt::attend_prefix(q, k_new, v_new, *state(layer, "self_k"),
                                *state(layer, "self_v"), slots, position + 1, scale,
                                std::nullopt);
    };
    const auto cross_attention = [&](size_t l, const Tensor& q) {
      const py::object layer = layers[l];
      return nmt::attend_memory(q, *state(layer, "cross_k"), *state(layer, "cross_v"), sources,
                                state(layer, "cross_bias"), scale, std::nullopt);
    };
    return forward(ids, position, self_attention, cross_attention, log_probs);
  }

  // One sentence's beam search from `step` to its end over the SlotCache: the loop of
  // core/search.py's _BeamSearch.run for a batch of one sentence, each step this step's
  // logits and the fused log-softmax and choice (beam_choose.cpp), as
  // backends/cpu/decoder.py's decode_advance takes them, with no Python between steps.
  // The state is the Python loop's between two steps: `tokens` (k,) each beam's newest
  // token, `cum` (k,) their running scores, `history` (k, L), `finished` the scores of
  // the hypotheses already set aside (the best `nbest` of them beat), `any_finished`
  // whether any ended; `limit` the sentence's length limit
  // and `lp_at_limit` its penalty there. The cache must have room for every step up to
  // the limit and for k rows (SlotCache.prepare(k) before; no buffer grows here), and
  // `slots` is its table. From step 0 (core/open_sentence.py: every token BOS, the first
  // beam alone open) the first step computes one row. -> (each hypothesis that ended, in the order the Python loop
  // sets them aside: (tokens, log-probability, step), the position reached, the table).
  py::tuple finish_sentence(Tensor tokens, int64_t step, const py::list& layers, Tensor slots,
                            const Tensor& sources, Tensor cum, Tensor history, int64_t k,
                            int64_t nbest, double alpha, int64_t limit, double lp_at_limit,
                            std::vector<double> finished, bool any_finished,
                            int64_t eos, const std::vector<int64_t>& banned) const {
    c10::InferenceMode guard;
    TORCH_CHECK(tokens.numel() == k && cum.numel() == k && history.size(0) == k,
                "finish_sentence: one sentence of k beams");
    TORCH_CHECK(slots.size(0) == k && slots.size(1) > limit && slots.scalar_type() == at::kLong,
                "finish_sentence: a slot table of k rows with room up to the length limit");
    TORCH_CHECK(cum.scalar_type() == at::kFloat, "finish_sentence: float32 scores");
    cum = cum.contiguous().view(-1);
    nmt::FinishedScores books(std::move(finished), nbest);
    const Tensor forced = at::ones({k}, at::kBool);
    std::vector<int64_t> open;  // this step's open beams, each step read off `cum`
    py::list ended;
    for (;; ++step) {
      // What returning to Python between steps allowed: Ctrl-C (a signal's handler may
      // raise), and other threads a turn with the GIL.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      { py::gil_scoped_release turn; }
      // Only the open beams' rows are computed: a closed one (score -inf) offers nothing
      // (beam_choose.cpp). Before the first step that is the first beam alone (BOS, the
      // others closed), as search's step 0 computes one row.
      const float* run = cum.const_data_ptr<float>();
      float best = -std::numeric_limits<float>::infinity();
      open.clear();
      for (int64_t j = 0; j < k; ++j) {
        best = std::max(best, run[j]);
        if (run[j] > -std::numeric_limits<float>::infinity()) open.push_back(j);
      }
      if (any_finished && books.done(best, step, alpha, lp_at_limit)) break;
      const auto rows = static_cast<int64_t>(open.size());
      if (rows == 0) break;
      const bool every = rows == k;
      const Tensor picked = every ? Tensor() : at::tensor(open, at::kLong);
      Tensor table = every ? slots.contiguous() : slots.index_select(0, picked);
      // SlotTable.prepare: this step's keys of row r go to slot r.
      int64_t* column = table.data_ptr<int64_t>() + step;
      for (int64_t r = 0; r < rows; ++r) column[r * table.size(1)] = r;
      const Tensor logits =
          step_slots(every ? tokens : tokens.index_select(0, picked), step, layers, table,
                     every ? sources : sources.index_select(0, picked), false);
      OptTensor logit_rows;
      if (every) {
        slots = table;
      } else {  // every beam's row back, a closed one's at the first (never read)
        Tensor place = at::full({k}, -1, at::kLong);
        place.index_copy_(0, picked, at::arange(rows, at::kLong));
        slots = table.index_select(0, place.clamp_min(0));
        logit_rows = place;
      }
      const OptTensor at_limit = step >= limit ? OptTensor(forced) : OptTensor();
      const auto [top_lp, next_cum, next_tokens, origin, grown, ends, any_ended] =
          nmt::beam_choose(logits, cum, history, k, eos, banned, at_limit, logit_rows);
      if (any_ended) {  // _BeamSearch._settle
        any_finished = true;
        const double lp = nmt::length_penalty(static_cast<double>(step) + 1.0, alpha);
        const bool* end = ends.const_data_ptr<bool>();
        const float* scores = top_lp.const_data_ptr<float>();
        const int64_t* ids = grown.const_data_ptr<int64_t>();
        const int64_t length = grown.size(1) - 1;  // without the EOS just chosen
        for (int64_t j = 0; j < k; ++j) {
          if (!end[j]) continue;
          books.add(static_cast<double>(scores[j]) / lp);
          std::vector<int64_t> hypothesis(ids + j * (length + 1), ids + j * (length + 1) + length);
          ended.append(py::make_tuple(hypothesis, static_cast<double>(scores[j]), step));
        }
      }
      slots = slots.index_select(0, origin);  // SlotCache.reorder within the sentence
      cum = next_cum.view(-1);
      history = grown;
      tokens = next_tokens.view(-1);
    }
    return py::make_tuple(ended, step, slots);
  }

 private:
  // The layers and the output projection around the two attentions, which depend on the
  // cache's layout: self_attention(layer, q, k, v) and cross_attention(layer, q) return
  // the context (B, h * d_v). `log_probs=false` returns the output layer's logits as its
  // product gives them, for search's fused log-softmax and choice (beam_choose.cpp).
  template <typename Self, typename Cross>
  Tensor forward(const Tensor& ids, int64_t position, const Self& self_attention,
                 const Cross& cross_attention, bool log_probs) const {
    const int64_t qk = heads_ * d_k_, vdim = heads_ * d_v_;
    Tensor y = at::add(at::embedding(tokens_, ids).mul(embed_scale_),
                       positions_.narrow(0, position, 1));
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const auto qkv = layer.qkv(y).split_with_sizes({qk, qk, vdim}, -1);
      Tensor ctx = self_attention(l, qkv[0], qkv[1], qkv[2]);
      y = layer.self_out.add(nmt::as_type(ctx, y.scalar_type()), y);
      y = norm(y, layer.norm1);
      ctx = cross_attention(l, layer.cross_q(y));
      y = layer.cross_out.add(nmt::as_type(ctx, y.scalar_type()), y);
      y = norm(y, layer.norm2);
      y = layer.ff2.add(layer.ff1.relu(y), y);
      y = norm(y, layer.norm3);
    }
    Tensor logits = projection_(y);
    if (!log_probs) return logits;
    // The log-softmax the Python side chose (backends/cpu/decoder.py decides, once).
    return module_log_softmax_ ? nmt::fast_log_softmax(logits)
                               : at::log_softmax(logits, -1, at::kFloat);
  }

  // LayerNorm over the last dimension: what at::layer_norm returns, without its composite
  // wrapper's call (the same kernel).
  Tensor norm(const Tensor& x, const Norm& n) const {
    return std::get<0>(at::native_layer_norm(x, {x.size(-1)}, n.weight, n.bias, eps_));
  }

  int64_t heads_, d_k_, d_v_;
  double eps_, embed_scale_;
  Tensor source_tokens_, source_positions_, tokens_, positions_;
  Linear projection_;
  bool module_log_softmax_;
  std::vector<EncoderLayer> encoder_;
  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<DecoderStep>(m, "DecoderStep")
      .def(py::init<const py::dict&>())
      .def("encode", &DecoderStep::encode)
      .def("cache_memory", &DecoderStep::cache_memory)
      .def("step", &DecoderStep::step)
      .def("step_slots", &DecoderStep::step_slots)
      // Named as core/open_sentence.py's OpenSentence fields, which the caller passes.
      .def("finish_sentence", &DecoderStep::finish_sentence, py::arg("tokens"), py::arg("step"),
           py::arg("layers"), py::arg("slots"), py::arg("sources"), py::arg("cum"),
           py::arg("history"), py::arg("beam"), py::arg("nbest"), py::arg("alpha"),
           py::arg("limit"), py::arg("lp_at_limit"), py::arg("finished"),
           py::arg("any_finished"), py::arg("eos"), py::arg("banned"));
  m.def("contract", [] { return kContract; });
  m.def("set_cpu_level_cap", &nmt::set_cpu_level_cap);
  m.def("cpu_level", [] { return static_cast<int64_t>(nmt::cpu_level()); });
  // Which loops each kernel runs at that level: what `nmt env` and the tests read.
  m.def("vectorized", [] {
    return std::map<std::string, bool>{
        {"attention", nmt::attention_kernel_available()},
        {"attention_train", nmt::attention_train_vectorized()},
        {"bf16_linear", nmt::bf16_kernel_available()},
        {"bias_relu", nmt::bias_relu_vectorized()},
        {"dropout_mask", nmt::dropout_mask_vectorized()},
        {"fp32_linear", nmt::fp32_kernel_available()},
        {"int8_linear", nmt::int8_kernel_available()},
        {"log_softmax", nmt::log_softmax_vectorized()},
        {"smoothed_loss", nmt::smoothed_loss_vectorized()},
    };
  });
  m.def("bf16_kernel_available", &nmt::bf16_kernel_available);
  m.def("pack_bf16", &nmt::pack_bf16);
  m.def("packed_linear", &nmt::packed_linear);
  m.def("kernel_rows", [] { return nmt::kKernelRows; });
  m.def("beam_topk", &nmt::beam_topk);
  m.def("beam_advance", &nmt::beam_advance);
  m.def("beam_choose", &nmt::beam_choose);
  m.def("fp32_kernel_available", &nmt::fp32_kernel_available);
  m.def("pack_fp32", &nmt::pack_fp32);
  m.def("fp32_linear", &nmt::fp32_linear);
  m.def("rows_linear", &nmt::rows_linear);
  m.def("fp32_kernel_rows", [] { return nmt::kFp32KernelRows; });
  m.def("int8_kernel_available", &nmt::int8_kernel_available);
  m.def("int8_vnni_available", &nmt::int8_vnni_available);
  m.def("int8_levels", &nmt::int8_levels);
  m.def("pack_int8", &nmt::pack_int8);
  m.def("int8_linear", &nmt::int8_linear);
  m.def("fast_log_softmax", &nmt::fast_log_softmax);
  m.def("attention_kernel_available", &nmt::attention_kernel_available);
  m.def("attend_prefix", &nmt::attend_prefix);
  m.def("attend_memory", &nmt::attend_memory);
  m.def("scaled_keep_mask", &nmt::scaled_keep_mask);
  m.def("dropout_add", &nmt::dropout_add);
  m.def("dropout_grad", &nmt::dropout_grad);
  m.def("dropout_grad_summed", &nmt::dropout_grad_summed);
  m.def("smoothed_loss_sweep", &nmt::smoothed_loss_sweep);
  m.def("attention_train_forward", &nmt::attention_train_forward);
  m.def("attention_train_backward", &nmt::attention_train_backward);
  m.def("attention_train_backward_into", &nmt::attention_train_backward_into);
  m.def("bias_relu_", &nmt::bias_relu_);
  m.def("relu_bias_backward", &nmt::relu_bias_backward);
}
