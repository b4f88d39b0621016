// Log-softmax of the output layer's logits for bf16 and int8 models (see log_softmax.cpp).
#pragma once

#include <ATen/ATen.h>

namespace nmt {

// (R, V) bf16 or float32 logits -> (R, V) float32 log-probabilities.
at::Tensor fast_log_softmax(const at::Tensor& logits);

}  // namespace nmt
