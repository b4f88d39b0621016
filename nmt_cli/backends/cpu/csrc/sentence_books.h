// One sentence's books in beam search: the rules of core/search.py's _BeamSearch for one
// sentence, so that the compiled loop (decoder_step.cpp, DecoderStep::finish_sentence)
// stops exactly where the Python loop stops. Each rule is the reference's arithmetic in
// the reference's order (doubles, C's pow like Python's float `**`), and the loop is
// tested against the Python one (tests/unit/test_sentence_search.py).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace nmt {

// GNMT's length penalty ((5 + length) / 6) ** alpha (core/search.py, length_penalty_value).
inline double length_penalty(double length, double alpha) {
  return std::pow((5.0 + length) / 6.0, alpha);
}

// The scores of a sentence's finished hypotheses as _BeamSearch._add keeps them: once it
// has `nbest`, only the best `nbest`, and the worst of those is the score to beat (-inf
// until then).
class FinishedScores {
 public:
  FinishedScores(std::vector<double> scores, int64_t nbest)
      : scores_(std::move(scores)), nbest_(nbest) {
    keep_best();
  }

  void add(double score) {
    scores_.push_back(score);
    keep_best();
  }

  // _BeamSearch._done for one sentence: no open beam can beat its nbest-th finished
  // hypothesis. `best_open` is the best running score (-inf when every beam closed); the
  // best an open beam can reach is it over the largest penalty it can still reach.
  bool done(float best_open, int64_t step, double alpha, double lp_at_limit) const {
    const double lp_next = length_penalty(static_cast<double>(step) + 1.0, alpha);
    return kth_best_ >= static_cast<double>(best_open) / std::max(lp_at_limit, lp_next);
  }

 private:
  void keep_best() {
    if (static_cast<int64_t>(scores_.size()) < nbest_) return;
    std::stable_sort(scores_.begin(), scores_.end(), std::greater<double>());
    scores_.resize(static_cast<size_t>(nbest_));
    kth_best_ = scores_.back();
  }

  std::vector<double> scores_;
  int64_t nbest_;
  double kth_best_ = -std::numeric_limits<double>::infinity();
};

}  // namespace nmt
