// mma.sync wrappers for float8 operands (sm_89 and newer: Ada, Hopper). Same m16n8k32 shape and
// fragment layout as the s8 atom (each 32-bit register carries four consecutive k values, one
// byte each; A: 4 registers, B: 2), f32 accumulators. ATYPE / BTYPE: 0 = e4m3, 1 = e5m2 (either
// type per operand: the PTX takes .atype and .btype separately).
// The header compiles for every arch (the kinds header includes it); an atom *instantiated*
// for an arch below sm_89 fails to compile (a dependent static_assert), never compiles to
// nothing.
#pragma once
#include "../arch.cuh"

namespace pyblasgemm {

template <int ATYPE, int BTYPE>
struct SM89_16x8x32_F32F8F8F32_TN {
  static_assert((ATYPE == 0 || ATYPE == 1) && (BTYPE == 0 || BTYPE == 1), "fp8 type: 0 e4m3, 1 e5m2");
  static PBG_DEVICE void fma(float* d, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__)
    static_assert(ATYPE >= 0 && __CUDA_ARCH__ >= 890, "mma.sync with e4m3 / e5m2 operands needs sm_89 or newer");
#endif
#define PBG_FP8_MMA(AT, BT)                                                                        \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." AT "." BT ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
               "{%8,%9}, {%0,%1,%2,%3};\n"                                                         \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
    if constexpr (ATYPE == 0 && BTYPE == 0) PBG_FP8_MMA("e4m3", "e4m3");
    else if constexpr (ATYPE == 0 && BTYPE == 1) PBG_FP8_MMA("e4m3", "e5m2");
    else if constexpr (ATYPE == 1 && BTYPE == 0) PBG_FP8_MMA("e5m2", "e4m3");
    else PBG_FP8_MMA("e5m2", "e5m2");
#undef PBG_FP8_MMA
  }
};

}  // namespace pyblasgemm
