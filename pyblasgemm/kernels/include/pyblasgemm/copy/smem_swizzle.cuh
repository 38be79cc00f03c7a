// XOR swizzle of 16-byte chunks inside a shared-memory tile. Shared memory has 32 banks of
// 4 bytes = 8 chunk slots per 128-byte line; an 8-lane ldmatrix/cp.async phase touches 8
// chunks, so it is conflict-free when those land in 8 different slots of their lines.
#pragma once
#include "../arch.cuh"

namespace pyblasgemm {

// Byte offset of chunk `chunk` (16 B) of row `row`, rows being CPR chunks long.
template <int CPR>
PBG_DEVICE int swz_chunk(int row, int chunk) {
  static_assert(CPR == 2 || CPR == 4 || CPR == 8 || CPR == 16 || CPR == 32, "row length");
  if constexpr (CPR >= 8) {
    // Rows span whole 128 B lines: XOR the slot with row%8, so 8 consecutive rows at the
    // same logical chunk (an ldmatrix phase) hit 8 different slots.
    return row * CPR * 16 + (((chunk & ~7) | ((chunk ^ row) & 7)) << 4);
  } else {
    // Short rows share a line: number chunks linearly, XOR the slot with the line index.
    int lin = row * CPR + chunk;
    int line = lin >> 3;
    return (line << 7) + (((lin ^ line) & 7) << 4);
  }
}

// Byte offset of element `col` (of EB bytes) of row `row`.
template <int CPR, int EB>
PBG_DEVICE int swz_elem(int row, int col) {
  constexpr int PER = 16 / EB;
  return swz_chunk<CPR>(row, col / PER) + (col % PER) * EB;
}

}  // namespace pyblasgemm
