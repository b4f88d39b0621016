// Beam search's step after the output layer in one pass over the logits: the log-softmax
// and the choice of candidates (beam_topk.cpp) fused, for the models whose log-softmax is
// the module's (log_softmax.cpp).
//
// Unfused, a step's (rows, V) logits are read three times and written as
// log-probabilities, search forces EOS on rows at their length limit, and beam_topk reads
// them all again: at 128 sentences x beam 4 the two are an eighth of an fp32 step on an
// AVX2 CPU (BENCHMARKS.md), mostly moving rows that no longer fit the cache. Here each row
// is read while it is in the cache: its max and sum of exponentials (the log-softmax's
// own passes, row_log_sum_exp), then its candidates' scores, compared with the sentence's
// k-th best sixteen or eight at a time. The scores are the unfused ones bit for bit (see
// beam_choose_row.h), so this is an optimization search cannot see: it is tested equal to
// fast_log_softmax, forcing and beam_advance.
//
// A closed beam (running score -inf) offers nothing: every score it could give is -inf
// or NaN, which never enter (best_k.h). So its row is skipped unread, and a step may
// compute the logits of the open beams only: `logit_rows` then gives each beam's row of
// `logits`, -1 for a closed one, and the results are those of the full logits exactly.
#include "beam_topk.h"
#include "best_k.h"
#include "cpu_level.h"
#include "log_softmax.h"
#include "operands.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include "simd_width.h"
#endif

namespace nmt {
namespace {

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
namespace choose_avx512 {
using V = simd::Lanes16;
#include "beam_choose_row.h"
}  // namespace choose_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace choose_avx2 {
using V = simd::Lanes8;
#include "beam_choose_row.h"
}  // namespace choose_avx2
#pragma GCC pop_options
#endif

inline float logit_at(const float* x, int64_t i) { return x[i]; }
inline float logit_at(const uint16_t* x, int64_t i) {  // bf16 widened exactly
  const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Per sentence, its k best candidates into out_v, out_i (beam_topk's outputs), at the
// widest level in force (only called where log_softmax_takes the logits' dtype).
template <typename T>
void choose(const T* logits, const int64_t* logit_rows, const float* run, const bool* forced,
            int64_t rows, int64_t vocab, int64_t k, int64_t eos,
            const std::vector<int64_t>& banned, float* out_v, int64_t* out_i) {
#if defined(__x86_64__)
  const auto offer = simd::by_level(&choose_avx512::offer_row<T>, &choose_avx2::offer_row<T>);
  at::parallel_for(0, rows / k, 1, [&](int64_t begin, int64_t end) {
    BestK best(k);
    for (int64_t s = begin; s < end; ++s) {
      best.reset();
      for (int64_t beam = 0; beam < k; ++beam) {
        const int64_t row = s * k + beam;
        if (run[row] == -std::numeric_limits<float>::infinity()) continue;  // closed
        const T* x = logits + (logit_rows != nullptr ? logit_rows[row] : row) * vocab;
        const float lse = row_log_sum_exp(x, vocab);
        if (forced != nullptr && forced[row]) {  // only EOS, at its log-probability
          best.offer((logit_at(x, eos) - lse) + run[row], beam * vocab + eos);
        } else {
          offer(x, vocab, lse, run[row], beam * vocab, banned, best);
        }
      }
      best.write(out_v + s * k, out_i + s * k);
    }
  });
#else
  TORCH_CHECK(false, "beam_choose: no vector log-softmax here");
#endif
}

// The unfused steps, as search makes them: fast_log_softmax, EOS forced (every other
// token -inf), beam_advance. Where the module's log-softmax is PyTorch's. A closed beam
// whose row was not computed gets the log-probabilities of zeros (finite: its candidates
// stay -inf).
Advanced unfused(const at::Tensor& computed, const int64_t* logit_rows, const at::Tensor& cum,
                 const at::Tensor& history, int64_t k, int64_t eos,
                 const std::vector<int64_t>& banned, const bool* forced) {
  at::Tensor logits = computed;
  if (logit_rows != nullptr) {
    logits = at::zeros({cum.numel(), computed.size(1)}, computed.options());
    for (int64_t r = 0; r < cum.numel(); ++r) {
      if (logit_rows[r] >= 0) logits[r].copy_(computed[logit_rows[r]]);
    }
  }
  const at::Tensor lprobs = fast_log_softmax(logits).contiguous();
  const int64_t rows = lprobs.size(0), vocab = lprobs.size(1);
  float* lp = lprobs.data_ptr<float>();
  for (int64_t r = 0; forced != nullptr && r < rows; ++r) {
    if (!forced[r]) continue;
    float* row = lp + r * vocab;
    const float kept = row[eos];
    std::fill(row, row + vocab, -std::numeric_limits<float>::infinity());
    row[eos] = kept;
  }
  return beam_advance(lprobs, cum, history, k, eos, banned);
}

}  // namespace

Advanced beam_choose(const at::Tensor& logits_in, const at::Tensor& cum_in,
                     const at::Tensor& history, int64_t k, int64_t eos,
                     const std::vector<int64_t>& banned,
                     const std::optional<at::Tensor>& forced_in,
                     const std::optional<at::Tensor>& logit_rows_in) {
  RECORD_FUNCTION("nmt::beam_choose", std::vector<c10::IValue>());
  TORCH_CHECK(logits_in.dim() == 2, "beam_choose: (rows, V) logits");
  const int64_t rows = cum_in.numel(), vocab = logits_in.size(1);
  check_history(history, rows);
  TORCH_CHECK(k >= 1 && rows % k == 0, "beam_choose: rows = sentences x k");
  const at::Tensor cum = as_vector(cum_in, at::kFloat);
  at::Tensor logit_rows;
  if (logit_rows_in.has_value()) {
    logit_rows = as_vector(*logit_rows_in, at::kLong);
    TORCH_CHECK(logit_rows.numel() == rows, "beam_choose: one logits row a beam");
    const int64_t* at = logit_rows.const_data_ptr<int64_t>();
    const float* run = cum.const_data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      TORCH_CHECK(at[r] < logits_in.size(0) &&
                      (at[r] >= 0 || run[r] == -std::numeric_limits<float>::infinity()),
                  "beam_choose: an open beam's logits row missing or out of range");
    }
  } else {
    TORCH_CHECK(logits_in.size(0) == rows, "beam_choose: a logits row a beam");
  }
  const int64_t* row_of = logit_rows.defined() ? logit_rows.const_data_ptr<int64_t>() : nullptr;
  TORCH_CHECK(eos >= 0 && eos < vocab, "beam_choose: EOS out of the vocabulary");
  for (const int64_t id : banned) {
    TORCH_CHECK(id >= 0 && id < vocab, "beam_choose: banned id out of the vocabulary");
  }
  at::Tensor forced;
  if (forced_in.has_value()) {
    forced = as_vector(*forced_in, at::kBool);
    TORCH_CHECK(forced.numel() == rows, "beam_choose: one forced flag a row");
  }
  const bool* force = forced.defined() ? forced.const_data_ptr<bool>() : nullptr;
  if (!log_softmax_takes(logits_in.scalar_type())) {
    return unfused(logits_in, row_of, cum_in, history, k, eos, banned, force);
  }
  const at::Tensor logits = logits_in.contiguous();
  at::Tensor values = at::empty({rows / k, k}, cum.options());
  at::Tensor indices = at::empty({rows / k, k}, cum.options().dtype(at::kLong));
  float* out_v = values.data_ptr<float>();
  int64_t* out_i = indices.data_ptr<int64_t>();
  const float* run = cum.const_data_ptr<float>();
  if (logits.scalar_type() == at::kFloat) {
    choose(logits.const_data_ptr<float>(), row_of, run, force, rows, vocab, k, eos, banned, out_v,
           out_i);
  } else {
    const auto* bits = reinterpret_cast<const uint16_t*>(logits.const_data_ptr());
    choose(bits, row_of, run, force, rows, vocab, k, eos, banned, out_v, out_i);
  }
  return beam_books(values, indices, history, k, vocab, eos);
}

}  // namespace nmt
