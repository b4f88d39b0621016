// Beam search's choice of candidates, one pass over the scores, no full sort.
//
// A step's candidates for sentence s are its K beams' log-probabilities plus each beam's
// running score, K x V of them, and search keeps the best k. `torch.topk` partially sorts
// (value, index) pairs, which on one sentence's 4 x 8,000 is a large part of a
// one-sentence step (BENCHMARKS.md), and the separate add of the running scores is another
// full pass. Here each sentence is one pass: every score is computed in fp32 exactly as
// the separate add does it, compared with the k-th best so far, and inserted into a short
// sorted list when it beats it.
//
// Order: larger first; equal scores in the order of their flat index (beam-major), so of
// two equal candidates the one from the earlier beam, or the lower token id, ranks
// first. (torch.topk leaves the order of equal values to its partial sort.) A sentence
// with fewer than k finite candidates (its beams mostly closed) fills its last slots
// with -inf at the lowest indices not chosen.
#include "beam_topk.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace nmt {

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
    std::vector<float> best_v(k);
    std::vector<int64_t> best_i(k);
    for (int64_t s = begin; s < end; ++s) {
      std::fill(best_v.begin(), best_v.end(), kNegInf);
      std::fill(best_i.begin(), best_i.end(), -1);
      float threshold = kNegInf;  // the k-th best so far; only strictly larger enter
      for (int64_t beam = 0; beam < k; ++beam) {
        const int64_t row = s * k + beam;
        const float add = run[row];
        const float* x = lp + row * vocab;
        for (int64_t v = 0; v < vocab; ++v) {
          const float score = x[v] + add;
          if (!(score > threshold)) continue;
          // Insert after every entry >= score: equal scores keep their index order.
          int64_t at = k - 1;
          while (at > 0 && best_v[at - 1] < score) {
            best_v[at] = best_v[at - 1];
            best_i[at] = best_i[at - 1];
            --at;
          }
          best_v[at] = score;
          best_i[at] = beam * vocab + v;
          threshold = best_v[k - 1];
        }
      }
      int64_t next_free = 0;
      for (int64_t j = 0; j < k; ++j) {
        if (best_i[j] >= 0) continue;
        // fewer than k finite candidates: -inf ones, at the lowest indices not taken
        auto taken = [&](int64_t i) {
          for (int64_t t = 0; t < k; ++t) {
            if (best_i[t] == i) return true;
          }
          return false;
        };
        while (taken(next_free)) ++next_free;
        best_i[j] = next_free++;
      }
      for (int64_t j = 0; j < k; ++j) {
        out_v[s * k + j] = best_v[j];
        out_i[s * k + j] = best_i[j];
      }
    }
  });
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, bool>
beam_advance(const at::Tensor& lprobs, const at::Tensor& cum, const at::Tensor& history_in,
             int64_t k, int64_t eos, const std::vector<int64_t>& banned) {
  RECORD_FUNCTION("nmt::beam_advance", std::vector<c10::IValue>());
  TORCH_CHECK(lprobs.dim() == 2 && lprobs.is_contiguous() && lprobs.scalar_type() == at::kFloat,
              "beam_advance: contiguous (rows, V) float32 log-probabilities");
  const int64_t rows = lprobs.size(0), vocab = lprobs.size(1);
  const at::Tensor history = history_in.contiguous();
  TORCH_CHECK(history.dim() == 2 && history.size(0) == rows && history.scalar_type() == at::kLong,
              "beam_advance: (rows, L) int64 history");
  float* lp = lprobs.data_ptr<float>();
  for (const int64_t id : banned) {
    TORCH_CHECK(id >= 0 && id < vocab, "beam_advance: banned id out of the vocabulary");
    for (int64_t r = 0; r < rows; ++r) lp[r * vocab + id] = -std::numeric_limits<float>::infinity();
  }
  auto [top, flat] = beam_topk(lprobs, cum, k);
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
