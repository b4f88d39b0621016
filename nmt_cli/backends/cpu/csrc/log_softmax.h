// Log-softmax of the output layer's logits for the models on the module's products (see
// log_softmax.cpp).
#pragma once

#include <ATen/ATen.h>

namespace nmt {

// Whether the three passes run here (AVX-512: float32 and bf16 logits; AVX2: float32);
// elsewhere fast_log_softmax is PyTorch's.
bool log_softmax_vectorized();

// (R, V) bf16 or float32 logits -> (R, V) float32 log-probabilities.
at::Tensor fast_log_softmax(const at::Tensor& logits);

}  // namespace nmt
