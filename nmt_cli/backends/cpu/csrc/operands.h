// Operands as the kernels read them, with no operator call where they already are so.
//
// A decoding step at batch 1 is a few hundred small calls: each kernel call takes a few
// microseconds there, and each ATen call around one (a reshape, a `to` of the type the
// tensor already has, a view) a fraction of a microsecond, through the dispatcher and
// often a new tensor. Together they were about a fifth of a batch-1 step (BENCHMARKS.md).
// Each helper returns the tensor itself where it already is what the kernel reads, and
// otherwise what the ATen calls it stands for return.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace nmt {

// `t` as a contiguous (m, k) matrix: t.reshape({m, k}).contiguous().
inline at::Tensor as_matrix(const at::Tensor& t, int64_t m, int64_t k) {
  if (t.dim() == 2 && t.size(0) == m && t.size(1) == k && t.is_contiguous()) return t;
  return t.reshape({m, k}).contiguous();
}

// `t` as a contiguous vector of `type`: t.to(type).contiguous().view(-1).
inline at::Tensor as_vector(const at::Tensor& t, at::ScalarType type) {
  if (t.dim() == 1 && t.scalar_type() == type && t.is_contiguous()) return t;
  return t.to(type).contiguous().view(-1);
}

// `t` in `type`: t.to(type).
inline at::Tensor as_type(const at::Tensor& t, at::ScalarType type) {
  return t.scalar_type() == type ? t : t.to(type);
}

}  // namespace nmt
