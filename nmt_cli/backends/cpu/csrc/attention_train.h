// Training's attention on a CPU, forward and backward (see attention_train.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace nmt {

// softmax(scale * q k^T, masked) v for every (sentence, head): q (B, h, L, d), k and v
// (B, h, S, d), float32 or bfloat16, each with its last dimension contiguous (other
// strides free: the heads of a projection's output as they are). `key_mask` (B, S) bool,
// true where a key may be attended, or none; `causal`: query i sees keys
// j <= i + S - L. Returns the context (B, h, L, d) in q's dtype, a view of a (B, L, h, d)
// tensor so that merging the heads costs nothing, and, when `want_probs`, the attention
// weights (B, h, L, S) float32 that the backward pass takes (undefined otherwise). A
// query that may see no key gets zero weights. `simd` false takes the plain loops. With
// `bias` ((3, h, d) float32: the biases of the projections that made q, k and v, left
// out of their products), attention runs on q, k and v plus their biases.
// Whether attention's forward and backward run vector loops here (AVX-512 or AVX2 + FMA,
// by nmt's CPU level; else plain ones).
bool attention_train_vectorized();

std::tuple<at::Tensor, at::Tensor> attention_train_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& key_mask, bool causal, double scale, bool want_probs,
    bool simd, const std::optional<at::Tensor>& bias);

// The gradients (dq, dk, dv) of the forward above given the context's gradient (B, h, L, d),
// its weights and the same `causal` and `bias`, each in its input's dtype, views of
// (B, L, h, d) / (B, S, h, d) tensors; and the biases' gradient (3, h, d), float32 sums
// of dq's, dk's and dv's rows before their rounding (undefined without `bias`).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_train_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& probs, double scale, bool causal, bool simd,
    const std::optional<at::Tensor>& bias);

// The same gradients written into dq, dk and dv, (B, h, n, d) each in its input's dtype
// and shape with its last dimension contiguous (other strides free: the heads of one
// tensor laid out as the projection that made q, k and v, so that the projection's
// gradient needs no concatenation); returns the biases' gradient as above.
at::Tensor attention_train_backward_into(const at::Tensor& grad_out, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& probs, double scale, bool causal,
                                         bool simd, at::Tensor& dq, at::Tensor& dk,
                                         at::Tensor& dv, const std::optional<at::Tensor>& bias);

}  // namespace nmt
