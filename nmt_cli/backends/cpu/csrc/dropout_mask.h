// Training's dropout mask on a CPU (see dropout_mask.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace nmt {

// Whether the mask's words are drawn in vector loops here (AVX2 four at a time, AVX-512
// eight); elsewhere the plain loop, with the same mask bit for bit.
bool dropout_mask_vectorized();

// A tensor of `like`'s shape and dtype (float32, bfloat16 or float16): 0 with probability
// round(p * 65536) / 65536, else 1 / (1 - p); the same for a seed whatever the threads.
at::Tensor scaled_keep_mask(const at::Tensor& like, double p, int64_t seed);

// residual + x * scaled_keep_mask(x, p, seed), without the mask ever stored: it is drawn a
// tile at a time in cache, the same mask bit for bit. residual and x of one shape,
// contiguous, float32 or bfloat16 each; the result in their promoted dtype, computed as
// PyTorch computes `residual + x * mask` (addcmul where the dtypes agree). With `bias`
// (float32, x's rows' width: a linear layer's, which the product left out), x + bias
// takes x's place, a float32 sum and so a float32 mask and result.
at::Tensor dropout_add(const at::Tensor& residual, const at::Tensor& x, double p,
                       int64_t seed, const std::optional<at::Tensor>& bias);

// (grad * the same mask), rounded to `dtype` (x's): dropout_add's gradient for x.
at::Tensor dropout_grad(const at::Tensor& grad, double p, int64_t seed, at::ScalarType dtype);

// The biased add's gradient: (grad * its float32 mask) rounded to `dtype` (x's), and the
// bias's, the float32 products summed over the rows of `columns` (the same whatever the
// threads).
std::tuple<at::Tensor, at::Tensor> dropout_grad_summed(const at::Tensor& grad, double p,
                                                       int64_t seed, at::ScalarType dtype,
                                                       int64_t columns);

}  // namespace nmt
