// cp.async wrappers (sm_80): global -> shared copies that bypass the register file.
#pragma once
#include "../arch.cuh"

namespace pyblasgemm {

// 16-byte cp.async.cg (L2 only: operand tiles are reused from smem, not L1) with zero fill:
// only src_bytes (0..16) are read from global, the rest of the 16 smem bytes are written as 0.
// src_bytes == 0 reads nothing, which is how tile edges stay in bounds.
struct SM80_CP_ASYNC_CG_16B_ZFILL {
  static PBG_DEVICE void copy(void* smem_dst, const void* gmem_src, int src_bytes) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
    u32 dst = static_cast<u32>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
                 : "memory");
#else
    static_assert(sizeof(smem_dst) == 0, "cp.async needs sm_80");
#endif
  }
};

PBG_DEVICE void cp_async_commit() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most N committed groups are still in flight (N is an immediate in PTX).
template <int N>
PBG_DEVICE void cp_async_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace pyblasgemm
