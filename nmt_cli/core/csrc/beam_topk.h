// Beam search's candidate selection (see beam_topk.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace nmt {

// lprobs (N*k, V) float32 and cum (N*k,): per sentence, the k best of lprobs + cum over
// its k rows flattened (index beam * V + token), best first -> (values (N, k), indices).
std::tuple<at::Tensor, at::Tensor> beam_topk(const at::Tensor& lprobs, const at::Tensor& cum,
                                             int64_t k);

}  // namespace nmt
