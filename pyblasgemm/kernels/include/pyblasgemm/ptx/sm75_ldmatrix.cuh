// ldmatrix wrappers: one warp loads four 8x8 tiles of 16-bit values (8 rows of 16 bytes each)
// from shared memory straight into the mma.sync fragment layout. Names follow CuTe.
#pragma once
#include "../arch.cuh"

namespace pyblasgemm {

// Lane l supplies the address of row (l % 8) of matrix (l / 8); lane l receives, for each
// matrix j, the 32-bit pair at row l/4, columns 2*(l%4)..+1  -> register j.
struct SM75_U32x4_LDSM_N {
  static PBG_DEVICE void copy(const void* smem_src, u32& r0, u32& r1, u32& r2, u32& r3) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 750)
    u32 a = static_cast<u32>(__cvta_generic_to_shared(smem_src));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
#else
    static_assert(sizeof(smem_src) == 0, "ldmatrix needs sm_75");
#endif
  }
};

// Transposed variant: lane l receives row 2*(l%4)..+1, column l/4 of each matrix, i.e. the
// fragment of the transposed 8x8 tile. Only defined for 16-bit elements by the hardware.
struct SM75_U16x8_LDSM_T {
  static PBG_DEVICE void copy(const void* smem_src, u32& r0, u32& r1, u32& r2, u32& r3) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 750)
    u32 a = static_cast<u32>(__cvta_generic_to_shared(smem_src));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
#else
    static_assert(sizeof(smem_src) == 0, "ldmatrix needs sm_75");
#endif
  }
};

// Same two loads from a 32-bit shared-memory address (the pipelined mainloop keeps its
// per-lane offsets as shared addresses and folds compile-time parts into the immediate).
PBG_DEVICE void ldsm_x4(u32 a, u32& r0, u32& r1, u32& r2, u32& r3) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 750)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
#endif
}
PBG_DEVICE void ldsm_x4_trans(u32 a, u32& r0, u32& r1, u32& r2, u32& r3) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 750)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
#endif
}

}  // namespace pyblasgemm
