// Scalar float32 / bf16 conversions for the kernels' plain loops: bf16 as its 16-bit
// pattern, widened exactly and narrowed to nearest even, as PyTorch casts (the vector
// loops' lanes do the same, simd_lanes.h).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace nmt::scalar {

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {
  return static_cast<float>(c10::BFloat16(x, c10::BFloat16::from_bits()));
}

inline void narrow(float x, float* out) { *out = x; }
inline void narrow(float x, uint16_t* out) { *out = c10::BFloat16(x).x; }

// x rounded to T (float32, or bf16's pattern) and widened back.
template <typename T>
float rounded_to(float x) {
  T stored;
  narrow(x, &stored);
  return widen(stored);
}

}  // namespace nmt::scalar
