// Scalar conversions as raw PTX, so the kernels need neither cuda_fp16.h nor cuda_bf16.h
// (NVRTC has no default include path). 16-bit values travel as raw bits (u16).
#pragma once
#include "../arch.cuh"

namespace pyblasgemm {

PBG_DEVICE float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
PBG_DEVICE u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));  // round to nearest even, like cuBLAS
  return h;
}
// bf16 is the upper half of an fp32: widening is a shift.
PBG_DEVICE float bf16_to_f32(u16 h) { return __uint_as_float(static_cast<u32>(h) << 16); }
PBG_DEVICE u16 f32_to_bf16(float f) {
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));  // cvt.rn.bf16 is sm_80+
  return h;
}
// Round an fp32 to tf32 (10-bit mantissa), ties away from zero; result keeps fp32 layout.
PBG_DEVICE u32 f32_to_tf32(float f) {
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return r;
}
// Unpack a half2 register (low half = lower column) to two floats.
PBG_DEVICE void half2_to_f32x2(u32 h2, float& lo, float& hi) {
  lo = f16_to_f32(static_cast<u16>(h2 & 0xffffu));
  hi = f16_to_f32(static_cast<u16>(h2 >> 16));
}

}  // namespace pyblasgemm
