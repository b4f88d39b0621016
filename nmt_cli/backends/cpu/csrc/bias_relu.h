// Training's feed-forward on a CPU: its first layer's bias and ReLU in one pass after
// the product, and their gradients in one pass before the products of the backward pass
// (see bias_relu.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace nmt {

// Whether the passes run vector loops here (AVX-512 or AVX2 + FMA, by nmt's CPU level;
// else their plain ones).
bool bias_relu_vectorized();

// y (rows x n, contiguous, float32 or bfloat16) <- max(0, y + bias), in place; bias (n)
// float32. A NaN stays NaN, as PyTorch's ReLU keeps it.
void bias_relu_(at::Tensor& y, const at::Tensor& bias);

// grad and y (rows x n, contiguous, y = bias_relu_'s output) -> (grad where y > 0 else
// 0, in grad's dtype; its column sums, float32 (n)): the gradients of the product's
// output and of the bias. The sums run over fixed blocks of rows in a fixed order, so
// they do not depend on the number of threads. `in_place` writes the first over grad (a
// contiguous one: else over its contiguous copy) and returns it.
std::tuple<at::Tensor, at::Tensor> relu_bias_backward(const at::Tensor& grad,
                                                      const at::Tensor& y, bool in_place);

}  // namespace nmt
