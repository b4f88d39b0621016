// The dropout mask's vector loop (dropout_mask.cpp), written once over the 64-bit words
// `W` (dropout_mask.cpp's Words8 for AVX-512, Words4 for AVX2): dropout_mask.cpp includes
// it inside a namespace compiled for each target, with `W` declared, after its `kGolden`,
// `kMix1` and `kMix2`. No include guard and no includes.

// Words begin .. end - 1 (those whose four elements are all below n), into out[4w -
// origin ...], W::kCount at a time: SplitMix64 on 64-bit lanes, each word's four 16-bit
// quarters (its elements in order, little-endian) compared with the threshold in place,
// the mask's values selected by the comparison. Integer arithmetic throughout, so the
// mask is the plain loop's bit for bit. Returns the first word not done (the rest go to the plain loop).
template <typename scalar_t>
int64_t fill_vector(scalar_t* out, int64_t origin, int64_t n, int64_t begin, int64_t end,
                    uint64_t seed, uint32_t threshold, scalar_t kept, scalar_t dropped) {
  using Vec = typename W::Vec;
  constexpr int64_t kCount = W::kCount;
  const Vec golden = W::set1(kGolden), c1 = W::set1(kMix1), c2 = W::set1(kMix2);
  const Vec step = W::set1(static_cast<uint64_t>(kCount) * kGolden);
  const Vec limit = W::quarters(threshold);
  // The counters of words begin .. begin + kCount - 1: seed + (w + 1) * golden.
  Vec counter = W::add(
      W::set1(seed), W::mullo(W::add(W::set1(static_cast<uint64_t>(begin + 1)), W::iota()), golden));
  int64_t w = begin;
  for (; w + kCount <= end && 4 * (w + kCount) <= n; w += kCount) {
    Vec z = W::mullo(W::mix(counter, 30), c1);
    z = W::mix(W::mullo(W::mix(z, 27), c2), 31);
    if constexpr (std::is_same_v<scalar_t, float>) {
      W::store(out + (4 * w - origin), z, limit, kept, dropped);
    } else {  // bf16 or half: their bit patterns
      uint16_t k, d;
      std::memcpy(&k, &kept, sizeof k);
      std::memcpy(&d, &dropped, sizeof d);
      W::store(reinterpret_cast<uint16_t*>(out) + (4 * w - origin), z, limit, k, d);
    }
    counter = W::add(counter, step);
  }
  return w;
}
