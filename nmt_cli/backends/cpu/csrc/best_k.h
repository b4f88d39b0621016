// One sentence's k best candidates, kept while its scores stream past once: the rule of
// beam search's candidate selection (beam_topk.cpp), shared by the selection over
// log-probabilities and the one that computes them on the way (beam_choose.cpp), so that
// both rank alike.
//
// Order: larger first; equal scores in the order they were offered (callers offer in
// flat-index order, beam-major), because a score enters only when strictly larger than
// the k-th best so far and goes after every entry >= it. A NaN or -inf never enters. A
// sentence with fewer than k entries (its beams mostly closed) fills its last slots with
// -inf at the lowest indices not chosen.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace nmt {

class BestK {
 public:
  explicit BestK(int64_t k) : k_(k), values_(k), indices_(k) { reset(); }

  void reset() {
    std::fill(values_.begin(), values_.end(), -std::numeric_limits<float>::infinity());
    std::fill(indices_.begin(), indices_.end(), -1);
    threshold_ = -std::numeric_limits<float>::infinity();
  }

  // The k-th best so far: only a score strictly above it enters.
  float threshold() const { return threshold_; }

  void offer(float score, int64_t index) {
    if (!(score > threshold_)) return;
    int64_t at = k_ - 1;
    while (at > 0 && values_[at - 1] < score) {
      values_[at] = values_[at - 1];
      indices_[at] = indices_[at - 1];
      --at;
    }
    values_[at] = score;
    indices_[at] = index;
    threshold_ = values_[k_ - 1];
  }

  // The k entries, best first, into values[0..k) and indices[0..k).
  void write(float* values, int64_t* indices) {
    int64_t next_free = 0;
    for (int64_t j = 0; j < k_; ++j) {
      if (indices_[j] >= 0) continue;
      while (std::find(indices_.begin(), indices_.end(), next_free) != indices_.end()) {
        ++next_free;
      }
      indices_[j] = next_free++;
    }
    std::copy(values_.begin(), values_.end(), values);
    std::copy(indices_.begin(), indices_.end(), indices);
  }

 private:
  int64_t k_;
  std::vector<float> values_;
  std::vector<int64_t> indices_;
  float threshold_;
};

}  // namespace nmt
