// Log-softmax of the output layer's logits for the models on the module's products (see
// log_softmax.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace nmt {

// Whether the three passes run here (AVX-512: float32 and bf16 logits; AVX2: float32);
// elsewhere fast_log_softmax is PyTorch's.
bool log_softmax_vectorized();

// Whether fast_log_softmax's own passes take logits of this dtype at the level in force
// (otherwise it is PyTorch's).
bool log_softmax_takes(at::ScalarType dtype);

// What fast_log_softmax subtracts from each logit of a row, max + log(sum(exp(x - max))),
// by the same passes, so that x - row_log_sum_exp(x) is its output bit for bit. Only
// where log_softmax_takes the dtype (bf16 as its raw bits).
float row_log_sum_exp(const float* x, int64_t n);
float row_log_sum_exp(const uint16_t* x, int64_t n);

// (R, V) bf16 or float32 logits -> (R, V) float32 log-probabilities.
at::Tensor fast_log_softmax(const at::Tensor& logits);

}  // namespace nmt
