// One-query attention for the decoder step on the module's products, reading the keys
// and values where the slot cache (backends/cpu/slot_cache.py) keeps them.
//
// Beam search reorders the rows after every step. PyTorch's attention wants each row's
// prefix contiguous, so the contiguous cache copies every prefix to its new row each
// step (an index_select of the whole cache, a large part of a 128-sentence step:
// BENCHMARKS.md) and then runs a few tiny batched products over it. Here the prefix
// never moves: step s's keys stay where they were written, a small table says in which
// slot each row's ancestor of step s wrote them, and the kernel reads them from there.
// Scores, softmax and the weighted sum of the values are one pass per row over its keys,
// all heads at once (each key row holds every head's keys, contiguous), in float32
// whatever the storage dtype. Cross-attention reads the encoder's keys once per source,
// not once per beam.
//
// Sums are taken in another order than PyTorch's products take them, so models on
// PyTorch's products keep PyTorch's attention (their outputs are promised identical to
// the Python step's over the contiguous cache); models whose products are the module's
// (fp32, bf16 and int8) use this one (backends/cpu/decoder.py decides). The body
// (attention_body.h) is written once and compiled for AVX-512 and for AVX2 + FMA.
#include "attention.h"
#include "cpu_level.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include "simd_width.h"

namespace nmt {
namespace {

// Where row r's keys/values of step s are: the index of their (h * d) row in the storage.
// The prefix storage is slot-major, (W, T, h, d): a row whose ancestors stayed in one
// slot reads one contiguous run.
struct PrefixRows {
  const int64_t* slots;
  int64_t slot_stride, steps, last;
  // This step's keys and values (rows of h * d, in the query's dtype), which each row
  // writes into its own slot before it attends: the step's only copy of them.
  const void *k_new, *v_new;
  int64_t k_stride, v_stride;
  int64_t operator()(int64_t r, int64_t s) const {
    return (s == last ? r : slots[r * slot_stride + s]) * steps + s;
  }
  const float* bias(int64_t) const { return nullptr; }
};

struct MemoryRows {
  const int64_t* sources;
  const float* bias_data;  // (N, S) or null
  int64_t length;
  int64_t operator()(int64_t r, int64_t s) const { return sources[r] * length + s; }
  const float* bias(int64_t r) const {
    return bias_data == nullptr ? nullptr : bias_data + sources[r] * length;
  }
};

struct Shape {
  int64_t heads, d_k, d_v, length;
  float scale;
  int64_t q_stride;  // elements from one query row to the next
};

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
namespace attend_avx512 {
using V = simd::Lanes16;
#include "attention_body.h"
}  // namespace attend_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace attend_avx2 {
using V = simd::Lanes8;
#include "attention_body.h"
}  // namespace attend_avx2
#pragma GCC pop_options

// The body at the widest level in force (attention_kernel_available() was asked first).
template <typename Q, typename KV, typename Rows>
void dispatch_level(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                    const Rows& rows, const Shape& sh, at::Tensor& out, float* weights) {
  const auto body = simd::by_level(&attend_avx512::dispatch_width<Q, KV, Rows>,
                                   &attend_avx2::dispatch_width<Q, KV, Rows>);
  body(q, keys, values, rows, sh, out, weights);
}

template <typename Rows>
at::Tensor attend(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values,
                  const Rows& rows, int64_t length, double scale,
                  const std::optional<at::Tensor>& weights) {
  const at::Tensor q = q_in.stride(-1) == 1 ? q_in : q_in.contiguous();
  const int64_t count = q.size(0), heads = keys.size(2);
  const Shape sh{heads, keys.size(3), values.size(3), length, static_cast<float>(scale),
                 q.stride(0)};
  TORCH_CHECK(q.dim() == 2 && q.size(1) == heads * sh.d_k, "attention: q is (rows, h * d_k)");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && values.size(2) == heads &&
                  keys.scalar_type() == values.scalar_type(),
              "attention: keys and values contiguous, of one dtype");
  at::Tensor out = at::empty({count, heads * sh.d_v}, q.options());
  float* w = nullptr;
  if (weights.has_value()) {
    TORCH_CHECK(weights->is_contiguous() && weights->scalar_type() == at::kFloat &&
                    weights->numel() == count * heads * length,
                "attention: weights are (rows, h, length) float32");
    w = weights->data_ptr<float>();
  }
  const bool q_bf16 = q.scalar_type() == at::kBFloat16, kv_bf16 = keys.scalar_type() == at::kBFloat16;
  TORCH_CHECK((q_bf16 || q.scalar_type() == at::kFloat) &&
                  (kv_bf16 || keys.scalar_type() == at::kFloat),
              "attention: float32 or bf16 tensors");
  if (q_bf16 && kv_bf16) {
    dispatch_level<uint16_t, uint16_t>(q, keys, values, rows, sh, out, w);
  } else if (q_bf16) {
    dispatch_level<uint16_t, float>(q, keys, values, rows, sh, out, w);
  } else if (kv_bf16) {
    dispatch_level<float, uint16_t>(q, keys, values, rows, sh, out, w);
  } else {
    dispatch_level<float, float>(q, keys, values, rows, sh, out, w);
  }
  return out;
}

}  // namespace

bool attention_kernel_available() {
  return cpu_level_at_least(CpuLevel::kAvx2);
}

at::Tensor attend_prefix(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                         const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& slots, int64_t length, double scale,
                         const std::optional<at::Tensor>& weights) {
  RECORD_FUNCTION("nmt::attend_prefix", std::vector<c10::IValue>());
  TORCH_CHECK(attention_kernel_available(), "attention kernel: this CPU lacks AVX2 and FMA");
  TORCH_CHECK(keys.dim() == 4 && length >= 1 && length <= keys.size(1), "attend_prefix: keys");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 2 && slots.stride(1) == 1 &&
                  slots.size(0) == q.size(0) && slots.size(1) >= length - 1 &&
                  q.size(0) <= keys.size(0),
              "attend_prefix: slots are (rows, >= length - 1) int64, rows <= slots of keys");
  TORCH_CHECK(k_new.dim() == 2 && v_new.dim() == 2 && k_new.stride(1) == 1 &&
                  v_new.stride(1) == 1 && k_new.size(0) == q.size(0) &&
                  v_new.size(0) == q.size(0) && k_new.scalar_type() == q.scalar_type() &&
                  v_new.scalar_type() == q.scalar_type() &&
                  k_new.size(1) == keys.size(2) * keys.size(3) &&
                  v_new.size(1) == values.size(2) * values.size(3),
              "attend_prefix: k_new, v_new are (rows, h * d) rows in q's dtype");
  const PrefixRows rows{slots.const_data_ptr<int64_t>(), slots.stride(0), keys.size(1), length - 1,
                        k_new.const_data_ptr(), v_new.const_data_ptr(), k_new.stride(0),
                        v_new.stride(0)};
  return attend(q, keys, values, rows, length, scale, weights);
}

at::Tensor attend_memory(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& sources, const std::optional<at::Tensor>& bias,
                         double scale, const std::optional<at::Tensor>& weights) {
  RECORD_FUNCTION("nmt::attend_memory", std::vector<c10::IValue>());
  TORCH_CHECK(attention_kernel_available(), "attention kernel: this CPU lacks AVX2 and FMA");
  TORCH_CHECK(keys.dim() == 4 && sources.scalar_type() == at::kLong && sources.dim() == 1 &&
                  sources.is_contiguous() && sources.size(0) == q.size(0),
              "attend_memory: keys (N, S, h, d), sources (rows,) int64");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->size(0) == keys.size(0) && bias->size(1) == keys.size(1),
                "attend_memory: bias is (N, S) float32");
    b = bias->const_data_ptr<float>();
  }
  const MemoryRows rows{sources.const_data_ptr<int64_t>(), b, keys.size(1)};
  return attend(q, keys, values, rows, keys.size(1), scale, weights);
}

}  // namespace nmt

#else  // elsewhere the slot cache is not used (backends/cpu/decoder.py asks first)

namespace nmt {

bool attention_kernel_available() { return false; }

at::Tensor attend_prefix(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double,
                         const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "attention kernel: x86-64 only");
}

at::Tensor attend_memory(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const std::optional<at::Tensor>&, double,
                         const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "attention kernel: x86-64 only");
}

}  // namespace nmt

#endif
