// Beam search's candidate selection (see beam_topk.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>
#include <vector>

namespace nmt {

// lprobs (N*k, V) float32 and cum (N*k,): per sentence, the k best of lprobs + cum over
// its k rows flattened (index beam * V + token), best first -> (values (N, k), indices).
std::tuple<at::Tensor, at::Tensor> beam_topk(const at::Tensor& lprobs, const at::Tensor& cum,
                                             int64_t k);

// One step of beam search's bookkeeping after the model (core/search.py, torch_advance,
// is the same in PyTorch operations): `banned` token ids get -inf in lprobs (in place),
// the k best candidates of each sentence are chosen (beam_topk), and for them ->
// (scores (N, k), the running scores with candidates ending in `eos` closed at -inf,
// tokens (N, k), origin (N*k,): the row each continues, history (N*k, L+1): that row's
// tokens plus this one, ended (N, k): finite candidates ending in `eos`, whether any did).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, bool>
beam_advance(const at::Tensor& lprobs, const at::Tensor& cum, const at::Tensor& history,
             int64_t k, int64_t eos, const std::vector<int64_t>& banned);

}  // namespace nmt
