// An int8 linear layer with per-row dynamic quantization (see int8_linear.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace nmt {

// Whether int8_linear runs at the CPU level in force: AVX2 or more.
bool int8_kernel_available();

// Whether it runs its AVX-512 VNNI route, 8-bit weights (otherwise AVX-512BW's or AVX2's,
// 7-bit).
bool int8_vnni_available();

// The grids of the route at the level in force, levels a side of zero: {activations,
// weights}. VNNI {127, 127}; AVX-512BW {127, 63}; AVX2 {63, 63} (int8_linear.cpp says why).
std::tuple<int64_t, int64_t> int8_levels();

// weight (N, K) float -> (packed int8 (ceil(N/16), ceil(K/4), 16, 4), per-column scale
// (N) float32, per-column sum of the int8 weights (N) int32). Symmetric, one scale a row
// of W: max |w| / 127 for the VNNI route; max |w| / 63 for the 7-bit routes, whose packed
// weight is viewed (ceil(N/16), ceil(K/4), 2, 8, 4). For the route of the level in force.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int8(const at::Tensor& weight);

// [residual +] [relu](x W^T + bias) for x (..., K) float32: each row of x quantized with
// its own scale (max |x| / the route's activation levels), exact int32 sums, float32 out.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const at::Tensor& column_sum, int64_t n,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, bool relu);

}  // namespace nmt
