// Log-softmax of the output layer's logits for bf16 and int8 models (see log_softmax.cpp).
#pragma once

#include <ATen/ATen.h>

namespace nmt {

// (R, V) bf16 or float32 logits -> (R, V) float32 log-probabilities.
// Whether the three AVX-512 passes run here; elsewhere fast_log_softmax is PyTorch's.
bool log_softmax_vectorized();

at::Tensor fast_log_softmax(const at::Tensor& logits);

}  // namespace nmt
