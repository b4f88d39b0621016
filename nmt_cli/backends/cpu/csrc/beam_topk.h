// Beam search's candidate selection (see beam_topk.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <vector>

namespace nmt {

// lprobs (N*k, V) float32 and cum (N*k,): per sentence, the k best of lprobs + cum over
// its k rows flattened (index beam * V + token), best first -> (values (N, k), indices).
std::tuple<at::Tensor, at::Tensor> beam_topk(const at::Tensor& lprobs, const at::Tensor& cum,
                                             int64_t k);

// What one step of beam search's bookkeeping returns (core/beam_advance.py's Advance):
// (scores (N, k), the running scores with candidates ending in `eos` closed at -inf,
// tokens (N, k), origin (N*k,): the row each continues, history (N*k, L+1): that row's
// tokens plus this one, ended (N, k): finite candidates ending in `eos`, whether any did).
using Advanced =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, bool>;

void check_history(const at::Tensor& history, int64_t rows);

// One step of beam search's bookkeeping after the model (core/search.py, torch_advance,
// is the same in PyTorch operations): `banned` token ids get -inf in lprobs (in place),
// the k best candidates of each sentence are chosen (beam_topk), and their books kept.
Advanced beam_advance(const at::Tensor& lprobs, const at::Tensor& cum, const at::Tensor& history,
                      int64_t k, int64_t eos, const std::vector<int64_t>& banned);

// The books of the chosen candidates: `top` (N, k) their scores, `flat` their indices
// beam * vocab + token within their sentence.
Advanced beam_books(const at::Tensor& top, const at::Tensor& flat, const at::Tensor& history,
                    int64_t k, int64_t vocab, int64_t eos);

// beam_advance on the log-softmax of `logits` (R, V), float32 or bf16, with EOS forced on
// the rows `forced` (R,) marks (every other token -inf), as search does it in PyTorch
// (core/beam_advance.py, decode_then_advance) with fast_log_softmax: the same results,
// bit for bit, computed without writing the log-probabilities (beam_choose.cpp). With
// `logit_rows` (R,), `logits` holds only some beams' rows: beam r's is logit_rows[r], -1
// for a closed beam (running score -inf), whose row is never read.
Advanced beam_choose(const at::Tensor& logits, const at::Tensor& cum, const at::Tensor& history,
                     int64_t k, int64_t eos, const std::vector<int64_t>& banned,
                     const std::optional<at::Tensor>& forced,
                     const std::optional<at::Tensor>& logit_rows);

}  // namespace nmt
