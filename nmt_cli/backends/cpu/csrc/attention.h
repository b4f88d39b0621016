// One query per row attending over the decoder's slot cache (see attention.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace nmt {

// Whether the level in force has the instructions the attention kernels need (AVX2 and
// FMA; AVX-512 where there is, at twice the width).
bool attention_kernel_available();

// Self-attention over a prefix that is never copied: keys (W, T, h, d_k) and values
// (W, T, h, d_v), float32 or bf16, hold step s of every row at [slot, s]. Row r's key of
// step s < length - 1 is in slot slots[r, s]; its newest one (step length - 1) in slot r,
// written there first from k_new and v_new (R, h * d) in q's dtype (converted as
// PyTorch's copy_ converts). q (R, h * d_k) float32 or bf16, rows of any stride ->
// (R, h * d_v) in q's dtype; `weights`, if given, (R, h, length) float32, receives the
// attention probabilities.
at::Tensor attend_prefix(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                         const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& slots, int64_t length, double scale,
                         const std::optional<at::Tensor>& weights);

// Cross-attention over the encoder's keys (N, S, h, d_k) and values (N, S, h, d_v) of N
// sources; row r reads source sources[r] (R,), and bias (N, S) float32 (0, or -inf at
// padding) is added to its scores. Shapes and dtypes otherwise as attend_prefix.
at::Tensor attend_memory(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& sources, const std::optional<at::Tensor>& bias,
                         double scale, const std::optional<at::Tensor>& weights);

}  // namespace nmt
