// A bf16 linear layer for the few rows of a decoder step (see bf16_linear.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace nmt {

// Whether this CPU has the instructions bf16_linear needs (AVX-512 with BF16).
bool bf16_kernel_available();

// weight (N, K) -> the layout bf16_linear reads: (ceil(N/16), K/2, 16, 2), zero-padded.
at::Tensor pack_bf16(const at::Tensor& weight);

// [residual +] [relu](x W^T + bias) for x (M, K) bf16 with W packed by pack_bf16 for N
// outputs: fp32 accumulation, one rounding to bf16 at the end (as oneDNN's fused forms).
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, bool relu);

// The bf16 layer of backends/cpu/linear.py's PackedLinear: [residual +] [relu](x W^T + b)
// for x (..., K). Up to kKernelRows rows (and `rows_packed` given) bf16_linear, else
// oneDNN's packed product (`onednn_packed`): at 256 rows and more the two are even, and
// oneDNN's blocking keeps a large weight (the output projection) in cache better.
// relu and residual are not asked for together.
constexpr int64_t kKernelRows = 128;
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& onednn_packed,
                         const std::optional<at::Tensor>& rows_packed, int64_t n,
                         const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual, bool relu);

}  // namespace nmt
