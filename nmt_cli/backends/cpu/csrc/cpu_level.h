// The instruction-set level the kernels may use: the CPU's own, capped by nmt's CPU level
// (nmt_cli/cpu_level.py resolves NMT_CPU_LEVEL and passes it once, when the module loads).
// Each kernel asks here, at run time, whether its vector loops may run and otherwise takes
// its plain ones (or reports itself unavailable), so one AVX-512 machine runs and tests the
// AVX2 and generic paths too. The ladder is nmt_cli/cpu_level.py's LEVELS.
#pragma once

#include <cstdint>

namespace nmt {

enum class CpuLevel : int64_t {
  kGeneric = 0,
  kAvx2 = 1,
  kAvx512 = 2,       // F, BW, VL, DQ
  kAvx512Vnni = 3,   // + VNNI
  kAvx512Bf16 = 4,   // + BF16
  kAmx = 5,          // + AMX tiles (no kernel here uses them; oneDNN does)
};

// What the CPU itself has, read once from the CPU (the ladder up to AVX-512 BF16).
CpuLevel detected_cpu_level();

// The level in force: the detected one, lowered by set_cpu_level_cap.
CpuLevel cpu_level();

inline bool cpu_level_at_least(CpuLevel level) {
  return static_cast<int64_t>(cpu_level()) >= static_cast<int64_t>(level);
}

// Lower (or, up to the detected level, raise back) the level the kernels use.
void set_cpu_level_cap(int64_t level);

}  // namespace nmt
