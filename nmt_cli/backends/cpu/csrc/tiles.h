// The register tiling the few-row kernels share (bf16_linear.cpp, int8_linear.cpp): an
// output of M rows x N columns is cut into tiles of up to kMaxRows rows x kMaxCols
// blocks of kLanes columns, each computed by one specialisation tile<R, C> that keeps
// its R x C accumulators in registers over the whole K.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace nmt::tiles {

constexpr int64_t kLanes = 16;  // output columns a 512-bit register accumulates
constexpr int kMaxCols = 4;     // register blocks of columns a tile holds
constexpr int kMaxRows = 4;     // input rows a tile holds

template <typename Operands>
using TileFn = void (*)(const Operands&, int64_t row, int64_t block);

// Every tile of an (m x blocks * kLanes) output: table[rows - 1][cols - 1] for each.
// Threads split the columns (whole tiles' columns, all rows), a share being at least
// `min_work` multiply-adds of the K-long sums.
template <typename Operands>
void for_each_tile(const Operands& op, int64_t m, int64_t blocks, int64_t k, int64_t min_work,
                   const TileFn<Operands>* const (&table)[kMaxRows]) {
  const int64_t tiles = (blocks + kMaxCols - 1) / kMaxCols;
  const int64_t work = std::max<int64_t>(1, m * kMaxCols * kLanes * k);
  const int64_t grain = std::max<int64_t>(1, min_work / work);
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t block = t * kMaxCols;
      const int cols = static_cast<int>(std::min<int64_t>(kMaxCols, blocks - block));
      for (int64_t row = 0; row < m; row += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - row));
        table[rows - 1][cols - 1](op, row, block);
      }
    }
  });
}

}  // namespace nmt::tiles
