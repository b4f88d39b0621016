// Beam search's choice of candidates, one pass over the scores, no full sort.
//
// A step's candidates for sentence s are its K beams' log-probabilities plus each beam's
// running score, K x V of them, and search keeps the best k. `torch.topk` partially sorts
// (value, index) pairs, which on one sentence's 4 x 8,000 is a large part of a
// one-sentence step (BENCHMARKS.md), and the separate add of the running scores is another
// full pass. Here each sentence is one pass: every score is computed in fp32 exactly as
// the separate add does it, compared with the k-th best so far, and inserted into a short
// sorted list when it beats it (best_k.h, which says how ties rank: by flat index, where
// torch.topk leaves the order of equal values to its partial sort).
#include "beam_topk.h"
#include "best_k.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace nmt {

void check_history(const at::Tensor& history, int64_t rows) {
  TORCH_CHECK(history.dim() == 2 && history.size(0) == rows && history.scalar_type() == at::kLong,
              "beam search: (rows, L) int64 history");
}

std::tuple<at::Tensor, at::Tensor> beam_topk(const at::Tensor& lprobs_in,
                                             const at::Tensor& cum_in, int64_t k) {
  RECORD_FUNCTION("nmt::beam_topk", std::vector<c10::IValue>());
  TORCH_CHECK(lprobs_in.dim() == 2 && lprobs_in.scalar_type() == at::kFloat,
              "beam_topk: (rows, V) float32 log-probabilities");
  const at::Tensor lprobs = lprobs_in.contiguous();
  const at::Tensor cum = cum_in.to(at::kFloat).contiguous().view(-1);
  const int64_t rows = lprobs.size(0), vocab = lprobs.size(1);
  TORCH_CHECK(cum.numel() == rows && k >= 1 && rows % k == 0, "beam_topk: rows = sentences x k");
  const int64_t sentences = rows / k, width = k * vocab;
  TORCH_CHECK(k <= width, "beam_topk: k above the candidates");
  at::Tensor values = at::empty({sentences, k}, lprobs.options());
  at::Tensor indices = at::empty({sentences, k}, lprobs.options().dtype(at::kLong));
  const float* lp = lprobs.const_data_ptr<float>();
  const float* run = cum.const_data_ptr<float>();
  float* out_v = values.data_ptr<float>();
  int64_t* out_i = indices.data_ptr<int64_t>();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, sentences, 1, [&](int64_t begin, int64_t end) {
    BestK best(k);
    for (int64_t s = begin; s < end; ++s) {
      best.reset();
      for (int64_t beam = 0; beam < k; ++beam) {
        const int64_t row = s * k + beam;
        const float add = run[row];
        const float* x = lp + row * vocab;
        for (int64_t v = 0; v < vocab; ++v) best.offer(x[v] + add, beam * vocab + v);
      }
      best.write(out_v + s * k, out_i + s * k);
    }
  });
  return {values, indices};
}

Advanced beam_advance(const at::Tensor& lprobs, const at::Tensor& cum, const at::Tensor& history,
                      int64_t k, int64_t eos, const std::vector<int64_t>& banned) {
  RECORD_FUNCTION("nmt::beam_advance", std::vector<c10::IValue>());
  TORCH_CHECK(lprobs.dim() == 2 && lprobs.is_contiguous() && lprobs.scalar_type() == at::kFloat,
              "beam_advance: contiguous (rows, V) float32 log-probabilities");
  const int64_t rows = lprobs.size(0), vocab = lprobs.size(1);
  check_history(history, rows);
  float* lp = lprobs.data_ptr<float>();
  for (const int64_t id : banned) {
    TORCH_CHECK(id >= 0 && id < vocab, "beam_advance: banned id out of the vocabulary");
    for (int64_t r = 0; r < rows; ++r) lp[r * vocab + id] = -std::numeric_limits<float>::infinity();
  }
  auto [top, flat] = beam_topk(lprobs, cum, k);
  return beam_books(top, flat, history, k, vocab, eos);
}

Advanced beam_books(const at::Tensor& top, const at::Tensor& flat, const at::Tensor& history_in,
                    int64_t k, int64_t vocab, int64_t eos) {
  const at::Tensor history = history_in.contiguous();
  const int64_t rows = top.numel();
  const int64_t sentences = rows / k, length = history.size(1);
  const auto long_opts = history.options();
  at::Tensor tokens = at::empty({sentences, k}, long_opts);
  at::Tensor origin = at::empty({rows}, long_opts);
  at::Tensor grown = at::empty({rows, length + 1}, long_opts);
  at::Tensor next_cum = at::empty({sentences, k}, top.options());
  at::Tensor ended = at::empty({sentences, k}, top.options().dtype(at::kBool));
  const float* tv = top.const_data_ptr<float>();
  const int64_t* fi = flat.const_data_ptr<int64_t>();
  const int64_t* h = history.const_data_ptr<int64_t>();
  int64_t* tok = tokens.data_ptr<int64_t>();
  int64_t* org = origin.data_ptr<int64_t>();
  int64_t* g = grown.data_ptr<int64_t>();
  float* nc = next_cum.data_ptr<float>();
  bool* end = ended.data_ptr<bool>();
  bool any = false;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t sentence = i / k, token = fi[i] % vocab;
    const int64_t from = sentence * k + fi[i] / vocab;
    tok[i] = token;
    org[i] = from;
    std::copy(h + from * length, h + (from + 1) * length, g + i * (length + 1));
    g[i * (length + 1) + length] = token;
    const bool is_eos = token == eos;
    end[i] = is_eos && tv[i] > -std::numeric_limits<float>::infinity();
    any = any || end[i];
    nc[i] = is_eos ? -std::numeric_limits<float>::infinity() : tv[i];
  }
  return {top, next_cum, tokens, origin, grown, ended, any};
}

}  // namespace nmt
