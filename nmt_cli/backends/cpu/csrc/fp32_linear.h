// An fp32 linear layer for the few rows of a decoder step on AVX2 CPUs (see fp32_linear.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace nmt {

// Whether fp32_linear runs at the CPU level in force: AVX2 with FMA.
bool fp32_kernel_available();

// weight (N, K) -> the layout fp32_linear reads: (ceil(N/16), K, 16), zero-padded.
at::Tensor pack_fp32(const at::Tensor& weight);

// [residual +] [relu](x W^T + bias) for x (..., K) float32 with W packed by pack_fp32 for
// N outputs: each output one fused multiply-add a term in order of K, then the bias, the
// ReLU and the residual.
at::Tensor fp32_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, bool relu);

// The fp32 layer of backends/cpu/linear.py's Fp32Linear: [residual +] [relu](x W^T + b)
// for x (..., K). Up to kFp32KernelRows rows (where the kernel runs) fp32_linear with W
// packed (`packed`), else the product of `weight`: oneDNN's where it is oneDNN's packed
// layout (an mkldnn tensor: on CPUs where MKL's products are not the faster), PyTorch's
// (MKL's) where it is W as it is. From a few tens of rows their blocking is faster than
// the kernel's (BENCHMARKS.md).
constexpr int64_t kFp32KernelRows = 32;
at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& packed,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, bool relu);

}  // namespace nmt
