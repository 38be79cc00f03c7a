// Epilogue activations, one definition for every kernel that applies them (the elementwise
// epilogue pass today, the fused GEMM stores next). The codes are pyblasgemm.epilogue's
// ACTIVATIONS table; the host definitions there are the tests' reference.
#pragma once

namespace pyblasgemm {

// The fused epilogue's template argument EPI (0: none): kEpiOn | the activation code; for int8
// operands also kEpiDequant | (output type << kEpiOutShift) (0 float32, 1 float16, 2 bfloat16);
// for float8 operands the same, with kEpiScaleMOne / kEpiScaleNOne for per-tensor scales.
// The host's twin: pyblasgemm.kernels.jit.epilogue_code.
constexpr int kEpiOn = 8;
constexpr int kEpiDequant = 16;
constexpr int kEpiOutShift = 5;
// Per-tensor scales of a dequantized product (float8 operands): scale_m / scale_n point at one
// float, read on the device (a CUDA graph replays the pointer, never a copied value); without
// the bit they hold one value per C row / column.
constexpr int kEpiScaleMOne = 128;
constexpr int kEpiScaleNOne = 256;
// Block-scaled float8 products: 3 bits per side from kEpiBlockShift (C's rows, then its
// columns) say how that side's scale is laid out; any nonzero side makes the mainloop promote
// every 128-wide K block into the accumulator scaled (GemmCore::tile_to_smem), and the store
// then scales nothing. 1: one value; 2: one per row / column (every K block); 3: (dim, kb)
// row-major, one per row per K block (1 x 128); 4: (kb, ceil(dim / 128)) row-major, one per
// 128 x 128 block. kb = ceil(k / 128).
constexpr int kEpiBlockShift = 9;
// The Ozaki scheme's moduli GEMM (int8 operands, the Hopper kernel, sliced tiles only): the
// int32 product x of batch entry b is stored as one byte, its CRT digit u = (x * y_b) mod p_b
// (ozaki/ozaki.cuh's crt_digit), so the int32 planes never reach memory; the launch's bias
// pointer holds the digit table (kResidueWords words per batch entry: ResidueDigit), its
// bias_mode is ignored. pyblasgemm.kernels.jit.EPI_RESIDUE is the host's twin.
constexpr int kEpiResidue = 32768;   // 1 << 15
template <int EPI> struct EpiBlock {
  static constexpr int kModeM = (EPI >> kEpiBlockShift) & 7;
  static constexpr int kModeN = (EPI >> (kEpiBlockShift + 3)) & 7;
  static constexpr bool kOn = kModeM != 0 || kModeN != 0;
  static_assert(kModeM <= 4 && kModeN <= 4, "block scale modes are 0..4");
};

enum Activation : int { kActNone = 0, kActRelu = 1, kActGelu = 2, kActGeluTanh = 3, kActSilu = 4, kActSigmoid = 5 };

// float and double: the CUDA math library's erf / tanh / exp overloads of each type.
template <class T>
__device__ __forceinline__ T activate(T x, int code) {
  switch (code) {
    case kActRelu:  // x < 0 is false for NaN: NaN stays NaN, as torch.relu keeps it
      return x < T(0) ? T(0) : x;
    case kActGelu:  // exact GELU: x/2 (1 + erf(x / sqrt 2))
      return x * T(0.5) * (T(1) + erf(x * T(0.70710678118654752440)));
    case kActGeluTanh: {  // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
      return T(0.5) * x * (T(1) + tanh(u));
    }
    case kActSilu:  // x / (1 + e^-x): -0 below x = -88 (float), where e^-x is inf
      return x / (T(1) + exp(-x));
    case kActSigmoid:  // 1 / (1 + e^-x): 0 below x = -88 (float), where e^-x is inf
      return T(1) / (T(1) + exp(-x));
    default:
      return x;
  }
}

}  // namespace pyblasgemm
