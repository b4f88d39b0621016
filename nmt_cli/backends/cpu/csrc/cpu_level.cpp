// The CPU level the kernels ask for (cpu_level.h).

#include "cpu_level.h"

#include <algorithm>
#include <atomic>

namespace nmt {
namespace {

// Unlimited until the Python side says otherwise.
std::atomic<int64_t> cap{static_cast<int64_t>(CpuLevel::kAmx)};

CpuLevel detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    return CpuLevel::kGeneric;
  }
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))) {
    return CpuLevel::kAvx2;
  }
  if (!__builtin_cpu_supports("avx512vnni")) return CpuLevel::kAvx512;
  if (!__builtin_cpu_supports("avx512bf16")) return CpuLevel::kAvx512Vnni;
  return CpuLevel::kAvx512Bf16;
#else
  return CpuLevel::kGeneric;
#endif
}

}  // namespace

CpuLevel detected_cpu_level() {
  static const CpuLevel detected = detect();
  return detected;
}

CpuLevel cpu_level() {
  return static_cast<CpuLevel>(std::min(static_cast<int64_t>(detected_cpu_level()),
                                        cap.load(std::memory_order_relaxed)));
}

void set_cpu_level_cap(int64_t level) {
  cap.store(std::clamp<int64_t>(level, 0, static_cast<int64_t>(CpuLevel::kAmx)),
            std::memory_order_relaxed);
}

}  // namespace nmt
