// mma.sync wrappers (sm_80 warp-level tensor-core instructions). Name = shape, then the
// D, A, B, C types, then operand majorness (TN: A row-major = K-contiguous, B col-major =
// K-contiguous, the only majorness mma.sync accepts for these shapes).
// Fragment layout (g = lane/4, t = lane%4), 16x8 accumulator: c0,c1 at (g, 2t..2t+1),
// c2,c3 at (g+8, 2t..2t+1).
#pragma once
#include "../arch.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 800)
#error "sm80_mma.cuh: mma.sync m16n8k16 (bf16), m16n8k32 (s8) and m16n8k8 (tf32) need sm_80"
#endif

namespace pyblasgemm {

// f16 x f16 + f32 -> f32. A: 4 regs (16x16), B: 2 regs (16x8), C/D: 4 floats.
struct SM80_16x8x16_F32F16F16F32_TN {
  static PBG_DEVICE void fma(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// f16 x f16 + f16 -> f16: accumulators are two packed half2 registers (c0c1, c2c3).
struct SM80_16x8x16_F16F16F16F16_TN {
  static PBG_DEVICE void fma(u32* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
        : "+r"(d[0]), "+r"(d[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// bf16 x bf16 + f32 -> f32 (bf16 mma.sync is new in sm_80).
struct SM80_16x8x16_F32BF16BF16F32_TN {
  static PBG_DEVICE void fma(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// s8 x s8 + s32 -> s32, K = 32: each 32-bit register carries four consecutive k values.
struct SM80_16x8x32_S32S8S8S32_TN {
  static PBG_DEVICE void fma(int* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// tf32 x tf32 + f32 -> f32, K = 8: a0=(g,t) a1=(g+8,t) a2=(g,t+4) a3=(g+8,t+4); b0=(t,g) b1=(t+4,g).
struct SM80_16x8x8_F32TF32TF32F32_TN {
  static PBG_DEVICE void fma(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

}  // namespace pyblasgemm
