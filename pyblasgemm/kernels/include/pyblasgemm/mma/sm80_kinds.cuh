// Element-kind traits: operand/output storage, the mma.sync atom, accumulator registers,
// how raw fragments become MMA operands (tf32 rounding, 3xTF32 split) and C conversion.
#pragma once
#include "../arch.cuh"
#include "../ptx/sm80_mma.cuh"
#include "../ptx/sm80_cvt.cuh"
#include "../ptx/sm89_mma_fp8.cuh"

namespace pyblasgemm {

// Float accumulators staged as float32 with a float32 C: the members every float-C kind shares
// (tf32, 3xTF32, the FP32 FMA kind, the float8 kinds).
struct FloatC32 {
  typedef float AccReg;
  static constexpr int kAccRegs = 4;
  typedef float Stage;
  typedef float Scale;
  static constexpr int kCBytes = 4;
  static PBG_DEVICE void acc_to_stage(const AccReg* d, Stage* s) {
    s[0] = d[0]; s[1] = d[1]; s[2] = d[2]; s[3] = d[3];
  }
  static PBG_DEVICE float load_c(const char* p) { return *reinterpret_cast<const float*>(p); }
  static PBG_DEVICE u32 cvt_c(float v) { return __float_as_uint(v); }
  static PBG_DEVICE float c_from_bits(u32 h) { return __uint_as_float(h); }
};

// Shared shape facts: every atom is 16x8 and consumes 32 bytes of K per row, so a BK tile of
// BKB bytes holds BKB/32 MMA k-steps whatever the element width.
struct KindBase16 {
  static constexpr int kElemBytes = 2;
  static constexpr int kParts = 1;  // operand fragments per MMA (3xTF32 uses big + small)
  static constexpr bool kSimt = false;  // tensor cores (KindF32Simt: the FP32 FMA pipes)
  static PBG_DEVICE void prep(const u32* raw, u32 (*out)[4], int n) {
    for (int i = 0; i < n; ++i) out[0][i] = raw[i];
  }
};

template <class Atom, bool BF16>
struct Kind16F32 : KindBase16 {
  typedef float AccReg;
  static constexpr int kAccRegs = 4;
  typedef float Stage;  // fp32 staging / workspace
  typedef float Scale;
  static constexpr int kCBytes = 2;
  static PBG_DEVICE void mma(AccReg* d, const u32 (*a)[4], const u32 (*b)[4]) { Atom::fma(d, a[0], b[0]); }
  static PBG_DEVICE void acc_to_stage(const AccReg* d, Stage* s) {
    s[0] = d[0]; s[1] = d[1]; s[2] = d[2]; s[3] = d[3];
  }
  static PBG_DEVICE float load_c(const char* p) {
    u16 h = *reinterpret_cast<const u16*>(p);
    return BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  static PBG_DEVICE u32 cvt_c(float v) { return BF16 ? f32_to_bf16(v) : f32_to_f16(v); }
  static PBG_DEVICE float c_from_bits(u32 h) { return BF16 ? bf16_to_f32(static_cast<u16>(h)) : f16_to_f32(static_cast<u16>(h)); }
};

typedef Kind16F32<SM80_16x8x16_F32F16F16F32_TN, false> KindF16F32;
typedef Kind16F32<SM80_16x8x16_F32BF16BF16F32_TN, true> KindBF16F32;

// A kind with an fp32 C (shgemm / sbgemm): the output conversion differs (KindOut32), and on
// mma.sync the accumulation too (Kind16F32Rounded below).
template <class Base>
struct KindOut32 : Base {
  static constexpr int kCBytes = 4;
  static PBG_DEVICE float load_c(const char* p) { return *reinterpret_cast<const float*>(p); }
  static PBG_DEVICE u32 cvt_c(float v) { return __float_as_uint(v); }
  static PBG_DEVICE float c_from_bits(u32 h) { return __uint_as_float(h); }
};

// mma.sync adds into its fp32 accumulator with truncation: in a float32 C that bias shows
// (measured on an H100 at K = 1000: 1.2e-6 relative, cuBLAS's GemmEx 1.6e-7; a 16-bit C hides
// it under its own rounding). So the fp32-C kinds sum each k-step's MMA in fresh registers and
// add it with a round-to-nearest FADD, as the 3xTF32 kind does.
template <class Atom, bool BF16>
struct Kind16F32Rounded : Kind16F32<Atom, BF16> {
  typedef float AccReg;
  static PBG_DEVICE void mma(AccReg* d, const u32 (*a)[4], const u32 (*b)[4]) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    Atom::fma(t, a[0], b[0]);
    d[0] += t[0]; d[1] += t[1]; d[2] += t[2]; d[3] += t[3];
  }
};
typedef KindOut32<Kind16F32Rounded<SM80_16x8x16_F32F16F16F32_TN, false>> KindF16F32Out32;
typedef KindOut32<Kind16F32Rounded<SM80_16x8x16_F32BF16BF16F32_TN, true>> KindBF16F32Out32;

// f16 accumulation: half the accumulator registers, packed half2 (c0c1), (c2c3).
struct KindF16F16 : KindBase16 {
  typedef u32 AccReg;
  static constexpr int kAccRegs = 2;
  typedef float Stage;
  typedef float Scale;
  static constexpr int kCBytes = 2;
  static PBG_DEVICE void mma(AccReg* d, const u32 (*a)[4], const u32 (*b)[4]) {
    SM80_16x8x16_F16F16F16F16_TN::fma(d, a[0], b[0]);
  }
  static PBG_DEVICE void acc_to_stage(const AccReg* d, Stage* s) {
    half2_to_f32x2(d[0], s[0], s[1]);
    half2_to_f32x2(d[1], s[2], s[3]);
  }
  static PBG_DEVICE float load_c(const char* p) { return f16_to_f32(*reinterpret_cast<const u16*>(p)); }
  static PBG_DEVICE u32 cvt_c(float v) { return f32_to_f16(v); }
  static PBG_DEVICE float c_from_bits(u32 h) { return f16_to_f32(static_cast<u16>(h)); }
};

// s8 x s8 -> s32, exact integer accumulation; alpha/beta are integers, C is int32.
struct KindS8S32 {
  static constexpr int kElemBytes = 1;
  static constexpr int kParts = 1;
  static constexpr bool kSimt = false;
  typedef int AccReg;
  static constexpr int kAccRegs = 4;
  typedef int Stage;
  typedef int Scale;
  static constexpr int kCBytes = 4;
  static PBG_DEVICE void prep(const u32* raw, u32 (*out)[4], int n) {
    for (int i = 0; i < n; ++i) out[0][i] = raw[i];
  }
  static PBG_DEVICE void mma(AccReg* d, const u32 (*a)[4], const u32 (*b)[4]) {
    SM80_16x8x32_S32S8S8S32_TN::fma(d, a[0], b[0]);
  }
  static PBG_DEVICE void acc_to_stage(const AccReg* d, Stage* s) {
    s[0] = d[0]; s[1] = d[1]; s[2] = d[2]; s[3] = d[3];
  }
  static PBG_DEVICE int load_c(const char* p) { return *reinterpret_cast<const int*>(p); }
  static PBG_DEVICE u32 cvt_c(int v) { return static_cast<u32>(v); }
  static PBG_DEVICE int c_from_bits(u32 h) { return static_cast<int>(h); }
};

// fp32 operands on tensor cores. SPLIT=false: round to tf32 (10-bit mantissa, ~1e-3 rel).
// SPLIT=true (3xTF32): x = big + small with big = tf32(x), small = tf32(x - big); the product
// keeps big*big + big*small + small*big (small*small is below fp32 rounding), ~fp32 accuracy.
template <bool SPLIT>
struct KindTF32T : FloatC32 {
  static constexpr int kElemBytes = 4;
  static constexpr int kParts = SPLIT ? 2 : 1;
  static constexpr bool kSimt = false;
  static PBG_DEVICE void prep(const u32* raw, u32 (*out)[4], int n) {
    for (int i = 0; i < n; ++i) {
      float x = __uint_as_float(raw[i]);
      u32 big = f32_to_tf32(x);
      out[0][i] = big;
      // x - big is exact in fp32 (same exponent range, fewer bits); round it to tf32 too.
      if constexpr (SPLIT) out[1][i] = f32_to_tf32(x - __uint_as_float(big));
    }
  }
  static PBG_DEVICE void mma(AccReg* d, const u32 (*a)[4], const u32 (*b)[4]) {
    if constexpr (SPLIT) {
      // Tensor cores add into the fp32 accumulator with truncation, not round-to-nearest:
      // over a K=1000 chain that bias measured 4e-6..7e-6 relative (SGEMM: 1.6e-7). So each
      // k-step's three products go into a fresh accumulator and reach `d` through an FADD
      // (round-to-nearest), as in Ootomo & Yokota 2022. Small terms first: ~2^-11 of big.
      float t[4] = {0.f, 0.f, 0.f, 0.f};
      SM80_16x8x8_F32TF32TF32F32_TN::fma(t, a[1], b[0]);
      SM80_16x8x8_F32TF32TF32F32_TN::fma(t, a[0], b[1]);
      SM80_16x8x8_F32TF32TF32F32_TN::fma(t, a[0], b[0]);
      d[0] += t[0]; d[1] += t[1]; d[2] += t[2]; d[3] += t[3];
    } else {
      SM80_16x8x8_F32TF32TF32F32_TN::fma(d, a[0], b[0]);
    }
  }
};
typedef KindTF32T<false> KindTF32;
typedef KindTF32T<true> Kind3xTF32;

// IEEE float32 on the FP32 FMA pipes (SGEMM's arithmetic: one rounding per multiply-add, k in
// ascending order within a tile's K range). No tensor-core atom: the warp tile's lanes own the
// accumulator elements an m16n8 atom would give them (WarpMma::compute_stage_simt), so the
// staging, split-k / stream-k partials and every fused epilogue are the tensor-core kinds'.
struct KindF32Simt : FloatC32 {
  static constexpr int kElemBytes = 4;
  static constexpr int kParts = 1;
  static constexpr bool kSimt = true;
  // fma.rn.f32 in PTX: CuPy compiles with -ftz=true, which would flush subnormal products and
  // sums (SGEMM keeps them); inline PTX is not rewritten, and it is the same FFMA.
  static PBG_DEVICE float fma(float a, float b, float c) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
  }
};

// float8 x float8 -> f32 (sm_89+; ATYPE / BTYPE 0 = e4m3, 1 = e5m2): the s8 kind's operand path
// (1-byte elements, the same m16n8k32 fragments: ldmatrix when K-contiguous, byte gathers
// otherwise) with float accumulators and a float32 C (the staging tile; the fused store scales
// it and writes float32 / float16 / bfloat16, EPI & kEpiDequant). Each MMA sums its 32 products
// in fresh registers that a round-to-nearest FADD adds to the accumulator: the tensor core adds
// into an fp32 accumulator with truncation (Kind16F32Rounded's measurement), and the FP8 units
// of Hopper keep fewer bits still (DeepGEMM's reason to promote), so no chain longer than one
// k32 step stays inside the tensor core.
template <int ATYPE, int BTYPE>
struct KindFp8F32 : FloatC32 {
  static constexpr int kElemBytes = 1;
  static constexpr int kParts = 1;
  static constexpr bool kSimt = false;
  static PBG_DEVICE void prep(const u32* raw, u32 (*out)[4], int n) {
    for (int i = 0; i < n; ++i) out[0][i] = raw[i];
  }
  static PBG_DEVICE void mma(AccReg* d, const u32 (*a)[4], const u32 (*b)[4]) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    SM89_16x8x32_F32F8F8F32_TN<ATYPE, BTYPE>::fma(t, a[0], b[0]);
    d[0] += t[0]; d[1] += t[1]; d[2] += t[2]; d[3] += t[3];
  }
};
typedef KindFp8F32<0, 0> KindE4M3F32;
typedef KindFp8F32<0, 1> KindE4M3E5M2F32;
typedef KindFp8F32<1, 0> KindE5M2E4M3F32;
typedef KindFp8F32<1, 1> KindE5M2F32;

}  // namespace pyblasgemm
