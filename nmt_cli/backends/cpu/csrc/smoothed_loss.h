// Training's label-smoothed cross-entropy sweep over the logits on a CPU (see
// smoothed_loss.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace nmt {

// (N, V) float32 or bfloat16 logits, (N) int64 targets, (N) float32 token weights (1 for
// a real token, 0 for padding) -> per row logsumexp, mean logit and target logit (float32,
// (N) each) and, when `want_grad`, the gradient of the row's smoothed loss with respect
// to its logits, weight * (softmax - eps / V - (1 - eps) * onehot), in the logits' dtype
// (an undefined tensor otherwise); `in_place` writes that gradient over the logits and
// returns them as it (a caller that reads the logits no more saves a tensor of their
// size and the passes that fill it).
// Whether the sweep runs vector loops here (AVX-512 or AVX2 + FMA, by nmt's CPU level;
// else its plain ones).
bool smoothed_loss_vectorized();

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> smoothed_loss_sweep(
    const at::Tensor& logits, const at::Tensor& target, const at::Tensor& weight, double eps,
    bool want_grad, bool in_place);

}  // namespace nmt
