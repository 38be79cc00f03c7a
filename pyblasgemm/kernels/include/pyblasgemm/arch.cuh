// pyblasgemm/arch.cuh -- architecture guard and the few integer types the device code uses.
// NVRTC compiles without the C standard headers, so we name fixed-width types ourselves.
#pragma once

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 800)
// mma.sync m16n8k16 bf16/tf32, cp.async and ldmatrix.x4 all need sm_80 or newer:
// refuse to build rather than emit a kernel whose tensor-core path is silently empty.
#error "pyblasgemm kernels need compute capability 8.0 or newer (compile with -arch=sm_80 or above)"
#endif

#ifndef PBG_DEVICE
#define PBG_DEVICE __device__ __forceinline__
#endif

namespace pyblasgemm {
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;
typedef long long i64;

// Four 32-bit words = one 16-byte shared/global vector access, the widest per-thread access.
struct alignas(16) U32x4 { u32 x, y, z, w; };
}  // namespace pyblasgemm
