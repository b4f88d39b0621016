// One row's candidates offered to a sentence's BestK (beam_choose.cpp), written once over
// the lanes `V` (simd_width.h): beam_choose.cpp includes it inside a namespace compiled
// for AVX-512 with V = Lanes16 and inside one compiled for AVX2 + FMA with V = Lanes8. No
// include guard and no includes: it is meant to be included inside such a namespace, with
// `V` declared.

// Each candidate's score is (x - lse) + add, the two roundings fast_log_softmax's write
// and beam_topk's add make, so the scores are theirs bit for bit. A vector of them is
// compared with the k-th best so far at once; only the lanes above it, few after the
// first vectors, are offered one by one, in index order, as beam_topk offers them.
// `banned` token ids are never offered (-inf in the unfused path, which never enters).
template <typename T>
void offer_row(const T* x, int64_t n, float lse, float add, int64_t base,
               const std::vector<int64_t>& banned, BestK& best) {
  using Vec = V::Vec;
  using Mask = V::Mask;
  constexpr int64_t kWidth = V::kWidth;
  const Vec vlse = V::set1(lse), vadd = V::set1(add);
  alignas(64) float lanes[kWidth];
  for (int64_t i = 0; i < n; i += kWidth) {
    const Mask mask = V::first(n - i);
    const Vec score = V::add(V::sub(V::load(x + i, mask), vlse), vadd);
    uint32_t hits = V::above(mask, score, V::set1(best.threshold()));
    if (hits == 0) continue;
    V::store(lanes, score, V::first(kWidth));
    while (hits != 0) {
      const int lane = __builtin_ctz(hits);
      hits &= hits - 1;
      const int64_t token = i + lane;
      if (std::find(banned.begin(), banned.end(), token) == banned.end()) {
        best.offer(lanes[lane], base + token);
      }
    }
  }
}
