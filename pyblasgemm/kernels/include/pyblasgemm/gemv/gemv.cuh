// pyblasgemm/gemv/gemv.cuh -- decode-shaped products: one operand has at most 64 rows, the
// other (the weight) is streamed from memory once. See docs/design/gemv.md.
//
// The problem, canonical (the host maps every BLAS layout onto it, pyblasgemm/kernels/gemv.py):
//   D[r, t] = sum_p W[r, p] * X[t, p],   out[r, t] = alpha * D[r, t] + beta * out[r, t]
//   r < R (the weight's rows), t < T <= 64 (tokens), p < K;
//   W[r, p] at w[r * w_rs + p * w_ks], X[t, p] at x[t * x_ts + p * x_ks], out at c[r * c_rs + t * c_ts]
//   (strides in elements). x @ W.T with W as torch.nn.Linear holds it is w_ks = 1 ("K-contiguous").
//
// Four mainloops (template PATH), one CTA framework:
//   kMmaK  16-bit / int8, W K-contiguous: each thread's 16-byte load of a weight row is split
//          into MMA fragments as it is (no shuffles); k is permuted identically in both operands.
//   kMmaR  16-bit, W R-contiguous: 16- (8-) byte loads along r at four consecutive k, paired
//          into k-pairs with PRMT; rows are permuted, the accumulator says where each lands.
//   kFmaK  float32, W K-contiguous: FFMA, 8 lanes along k x 4 along rows and tokens; the CTA
//          framework adds the 8 k lanes' sums in lane order.
//   kFmaR  float32 / int8, W R-contiguous: FFMA (IMAD), lanes along rows, the activation value
//          read once per warp (a broadcast).
// Work split (stream-k over (row tile, k-step) units): the grid's G CTAs take equal contiguous
// unit ranges; a row tile finished by one CTA is stored at once, otherwise every contributor
// writes its fp32 (int32) partial to its own workspace slot, raises the tile's counter, and the
// last to arrive sums the slots in contributor order (bitwise reproducible whoever is last),
// applies alpha/beta, stores, and zeroes the counter for the next call. One launch; no CTA ever
// waits for another.
#pragma once
#include "../arch.cuh"
#include "../ptx/sm80_mma.cuh"
#include "../ptx/sm80_cvt.cuh"
#include "../epilogue/sm80_smem_epilogue.cuh"

namespace pyblasgemm {
namespace gemv {

struct alignas(8) U32x2 { u32 x, y; };

enum Path : int { kMmaK = 0, kMmaR = 1, kFmaK = 2, kFmaR = 3 };
// template LOADS: bit 0 = W rows allow aligned vector loads, bit 1 = X rows do (K-contiguous X)
constexpr int kWVec = 1, kXVec = 2;
// template PIPE of the kMmaK mainloop: bits 0-2 ring depth (0: its default), bit 3 activations in
// the ring, bit 4 the ring in shared memory, filled by cp.async (each lane copies and reads back
// only its own 16-byte vectors: no barrier, only cp.async.wait_group)
constexpr int kXPre = 8, kAsync = 16, kNoPrefetch = 32;
// sm_90's ptxas keeps two token groups' prefetched activations within 128 registers; sm_80's
// spills them (tests/test_gemv_compile.py), so there kXPre applies to one token group only
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kXPreMaxTG = 1;
#else
constexpr int kXPreMaxTG = 2;
#endif

// ---- element kinds: operand width, accumulator, output conversion ---------------------------
struct OutF16 {
  static constexpr int kBytes = 2;
  static PBG_DEVICE float load(const char* p) { return f16_to_f32(*reinterpret_cast<const u16*>(p)); }
  static PBG_DEVICE void store(char* p, float v) { *reinterpret_cast<u16*>(p) = f32_to_f16(v); }
};
struct OutBF16 {
  static constexpr int kBytes = 2;
  static PBG_DEVICE float load(const char* p) { return bf16_to_f32(*reinterpret_cast<const u16*>(p)); }
  static PBG_DEVICE void store(char* p, float v) { *reinterpret_cast<u16*>(p) = f32_to_bf16(v); }
};
struct OutF32 {
  static constexpr int kBytes = 4;
  static PBG_DEVICE float load(const char* p) { return *reinterpret_cast<const float*>(p); }
  static PBG_DEVICE void store(char* p, float v) { *reinterpret_cast<float*>(p) = v; }
};
struct OutS32 {
  static constexpr int kBytes = 4;
  static PBG_DEVICE int load(const char* p) { return *reinterpret_cast<const int*>(p); }
  static PBG_DEVICE void store(char* p, int v) { *reinterpret_cast<int*>(p) = v; }
};

// Tensor-core kinds: Atom is the mma.sync wrapper (ptx/sm80_mma.cuh).
template <class Atom, class Out, int EB, class AccT>
struct MmaKind {
  static constexpr int kElemBytes = EB, kCBytes = Out::kBytes;
  typedef AccT Acc;
  typedef AccT Scale;
  typedef Out O;
  static PBG_DEVICE void mma(Acc* d, const u32* a, const u32* b) { Atom::fma(d, a, b); }
};
typedef MmaKind<SM80_16x8x16_F32F16F16F32_TN, OutF16, 2, float> KindF16;
typedef MmaKind<SM80_16x8x16_F32BF16BF16F32_TN, OutBF16, 2, float> KindBF16;
typedef MmaKind<SM80_16x8x16_F32F16F16F32_TN, OutF32, 2, float> KindF16Out32;
typedef MmaKind<SM80_16x8x16_F32BF16BF16F32_TN, OutF32, 2, float> KindBF16Out32;
typedef MmaKind<SM80_16x8x32_S32S8S8S32_TN, OutS32, 1, int> KindS8;

// CUDA-core kinds: element e of a 32-bit word (EB = 4: the word; EB = 1: byte e, sign-extended)
// and the multiply-add. Float32 through fma.rn (PTX): not flushed by CuPy's -ftz=true, so
// products in the subnormal range are kept as the float32 reference keeps them.
struct KindF32 {
  static constexpr int kElemBytes = 4, kCBytes = 4;
  typedef float Acc;
  typedef float Scale;
  typedef OutF32 O;
  static PBG_DEVICE float elem(u32 word, int) { return __uint_as_float(word); }
  static PBG_DEVICE float mad(float acc, float w, float x) { return fma_ieee(w, x, acc); }
};
struct KindS8Fma {
  static constexpr int kElemBytes = 1, kCBytes = 4;
  typedef int Acc;
  typedef int Scale;
  typedef OutS32 O;
  static PBG_DEVICE int elem(u32 word, int e) { return static_cast<int>(static_cast<signed char>(word >> (8 * e))); }
  // int32 sums wrap modulo 2^32 as cuBLAS's (and mma.sync's) do, without signed-overflow UB
  static PBG_DEVICE int mad(int acc, int w, int x) { return static_cast<int>(static_cast<u32>(acc) + static_cast<u32>(w * x)); }
};

template <class T>
struct IsFloat { static constexpr bool value = false; };
template <>
struct IsFloat<float> { static constexpr bool value = true; };

PBG_DEVICE float acc_add(float a, float b) { return add_ieee(a, b); }
PBG_DEVICE int acc_add(int a, int b) { return static_cast<int>(static_cast<u32>(a) + static_cast<u32>(b)); }

// ---- loads ---------------------------------------------------------------------------------
// The weight is read once: no L1 allocation, L2 evict-first (the activations, the partials and
// C stay), and a 256-byte L2 fetch (a warp reads 64-128 contiguous bytes of a row per step; the
// rest of the 256-byte block is the next steps').
PBG_DEVICE u64 evict_first_policy() {
  u64 pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
PBG_DEVICE U32x4 ld_stream16(const char* p, u64 pol) {
  U32x4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
  return v;
}
// The same load without the L2 prefetch-size hint (the L2 fetches only the requested sectors):
// PIPE bit 5 of the kMmaK mainloop (an experiment against the 256-byte fetch's L2 traffic).
PBG_DEVICE U32x4 ld_stream16_nopf(const char* p, u64 pol) {
  U32x4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
  return v;
}
PBG_DEVICE U32x2 ld_stream8(const char* p, u64 pol) {
  U32x2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v2.u32 {%0,%1}, [%2], %3;\n"
               : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(pol));
  return v;
}
PBG_DEVICE u32 ld_stream4(const char* p, u64 pol) {
  u32 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.u32 %0, [%1], %2;\n"
               : "=r"(v) : "l"(p), "l"(pol));
  return v;
}
// The same 16 bytes of weight into shared memory (cp.async: the bytes in flight hold no
// registers), L2 only, evict-first, 256-byte L2 fetch; activations: cp.async.ca (L1 kept).
PBG_DEVICE u32 smem_u32(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }
PBG_DEVICE void cp_stream16(u32 dst, const char* src, u64 pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "l"(pol) : "memory");
}
PBG_DEVICE void cp_x16(u32 dst, const char* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
}
PBG_DEVICE void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
PBG_DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// Activations: small and re-read by every warp of the CTA (and the SM's other CTAs): cached.
PBG_DEVICE U32x4 ld_x16(const char* p) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  return U32x4{v.x, v.y, v.z, v.w};
}
PBG_DEVICE U32x2 ld_x8(const char* p) {
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
  return U32x2{v.x, v.y};
}
PBG_DEVICE u32 ld_x4(const char* p) { return __ldg(reinterpret_cast<const unsigned int*>(p)); }

// One element's bits, zero-extended.
template <int EB>
PBG_DEVICE u32 ld_elem(const char* p) {
  if constexpr (EB == 1) return __ldg(reinterpret_cast<const unsigned char*>(p));
  else if constexpr (EB == 2) return __ldg(reinterpret_cast<const unsigned short*>(p));
  else return __ldg(reinterpret_cast<const unsigned int*>(p));
}
// WORDS * 4 / EB consecutive positions p0, p0 + 1, ... of a line (element at base + pos * stride
// elements; UNIT: stride 1, known here), packed little-endian as a vector load packs them;
// positions >= limit read as 0: the operand paths without aligned vectors (odd leading
// dimensions or pointers, a strided activation), tails included.
template <int EB, int WORDS, bool UNIT>
PBG_DEVICE void gather(u32* out, const char* base, long long stride, int p0, int limit) {
  constexpr int PER = 4 / EB;
  const i64 step = UNIT ? EB : stride * EB;   // one pointer walks the line: two registers
  const char* at = base + static_cast<i64>(p0) * step;
#pragma unroll
  for (int wd = 0; wd < WORDS; ++wd) out[wd] = 0u;
#pragma unroll
  for (int e = 0; e < WORDS * PER; ++e) {
    if (p0 + e < limit) out[e / PER] |= ld_elem<EB>(at) << (8 * EB * (e % PER));
    at += step;
  }
}
template <int WORDS>
PBG_DEVICE void zero(u32* out) {
#pragma unroll
  for (int wd = 0; wd < WORDS; ++wd) out[wd] = 0u;
}

PBG_DEVICE int imin(int a, int b) { return a < b ? a : b; }

// Runtime description shared by the mainloops and the CTA framework.
struct Params {
  const char* w;
  const char* x;
  char* c;
  void* ws;
  int* counters;
  int R, T, K;
  i64 w_rs, w_ks, x_ts, x_ks, c_rs, c_ts;
  int row_tiles;
};

// ---- mainloop kMmaK: W K-contiguous, m16n8k16 (int8: m16n8k32) with the weight on the M side --
// Lane (g = lane / 4, q = lane % 4). One step = KSTEP = 4 * KV * VE k values. Per 16-byte vector j
// the lane loads W[row, k0 + (4j + q) * VE + 0..VE) for rows g and g + 8 of each 16-row group, and
// X[token, same k] for tokens 8 tg + g. The vector's words .x .y feed MMA #1 (A: {row g .x, row
// g+8 .x, row g .y, row g+8 .y}, B: {.x, .y}), .z .w MMA #2: the MMA's k positions of lane q (A
// columns / B rows 2q, 2q+1, 2q+8, 2q+9; int8: 4q..4q+3, 16+4q..) are the same actual k in both
// operands, so each pair of MMAs sums all 4 * VE k values of the vector column exactly once.
// Accumulator (rg, tg, e): row 16 rg + g + 8 (e / 2), token 8 tg + 2 q + e % 2.
// PIPE (0: the defaults below): bits 0-2 the register ring's depth (tiles per warp, the loads of
// the next STAGES - 1 steps in flight while one is consumed); bit 3 (kXPre): the activations'
// vectors travel in the ring with the weight's (issued STAGES - 1 steps ahead, not at the step:
// without it every step waits one L2 round trip for its activations, which no other warp's
// bytes hide once every warp does the same; K-contiguous aligned activations, TG <= 2); bit 4
// (kAsync): the ring lives in shared memory, STAGES slots of NVEC 16-byte vectors per lane, filled
// by cp.async (implies kXPre), so the bytes in flight cost no registers.
template <class Kind, int RG, int KV, int TG, int LOADS, int PIPE = 0>
struct MmaK {
  typedef typename Kind::Acc Acc;
  static constexpr int EB = Kind::kElemBytes, VE = 16 / EB;
  static constexpr int ROWS = 16 * RG, KSTEP = 4 * KV * VE, FRAG = RG * TG * 4, OUT = FRAG, KSPLIT = 1;
  static constexpr bool WVEC = (LOADS & kWVec) != 0, XVEC = (LOADS & kXVec) != 0;
  // weight tiles in flight per warp (a register ring; 1: load and use, element loads): enough
  // bytes in flight for the memory's latency x bandwidth (H200: ~4.8 TB/s x ~1.5 us / 132 SMs)
  static constexpr int STAGES = !WVEC ? 1 : ((PIPE & 7) != 0 ? (PIPE & 7)
                                                : (!XVEC ? (TG <= 2 ? 2 : 1) : (TG == 1 ? 3 : 2)));
  // (the depth is explicit: the host sizes the ring from PIPE alone, gemv.ring_bytes)
  static constexpr bool ASYNC = (PIPE & kAsync) != 0 && (PIPE & 7) >= 2 && WVEC && XVEC && TG <= 2;
  static constexpr bool XPRE = ((PIPE & kXPre) != 0 && TG <= kXPreMaxTG || ASYNC) && WVEC && XVEC && STAGES > 1 &&
                               TG <= 2;
  static constexpr int XT = XPRE ? TG : 1;
  // ASYNC: a slot holds vector v of every lane at v * 512 + lane * 16 (a warp's 16-byte reads of
  // one vector are 512 contiguous bytes: no bank conflict)
  static constexpr int NVEC = RG * 2 * KV + XT * KV, SLOT_BYTES = NVEC * 512;
  static constexpr int RING_BYTES = ASYNC ? STAGES * SLOT_BYTES : 0;   // per warp
  // float accumulators: each step's MMA chain goes into fresh registers, then one rounding add
  // (the tensor cores accumulate with truncation, visible in a float32 C over long K)
  static constexpr bool kFresh = IsFloat<Acc>::value;
  struct Tile {
    U32x4 v[RG][2][KV];
    U32x4 x[XT][KV];   // XPRE: the step's activation vectors (token group, vector)
  };

  // WVEC (host): 16-byte aligned rows and K % VE == 0, so in the tail step a vector lies wholly
  // below K or wholly past it
  template <bool TAIL>
  static PBG_DEVICE void load_w(const Params& p, int row0, int ks, Tile& t, u64 pol) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int k0 = ks * KSTEP;
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // rows past R read row R - 1 (valid memory); their results are never stored
        const int row = imin(row0 + 16 * rg + 8 * h + g, p.R - 1);
        const char* rp = p.w + static_cast<i64>(row) * p.w_rs * EB;
#pragma unroll
        for (int j = 0; j < KV; ++j) {
          const int k = k0 + (4 * j + q) * VE;
          if constexpr (!WVEC) gather<EB, 4, true>(&t.v[rg][h][j].x, rp, 1, k, p.K);
          else if (!TAIL || k < p.K)
            t.v[rg][h][j] = (PIPE & kNoPrefetch) ? ld_stream16_nopf(rp + static_cast<i64>(k) * EB, pol)
                                                 : ld_stream16(rp + static_cast<i64>(k) * EB, pol);
          else zero<4>(&t.v[rg][h][j].x);
        }
      }
    if constexpr (XPRE) load_x<TAIL>(p, ks, t.x);
  }

  // ASYNC: step ks's vectors into the slot at shared address `slot` (this lane's: + lane * 16)
  static PBG_DEVICE void issue(const Params& p, int row0, int ks, u32 slot, u64 pol) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int k0 = ks * KSTEP;
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = imin(row0 + 16 * rg + 8 * h + g, p.R - 1);
        const char* rp = p.w + static_cast<i64>(row) * p.w_rs * EB;
#pragma unroll
        for (int j = 0; j < KV; ++j)
          cp_stream16(slot + ((rg * 2 + h) * KV + j) * 512, rp + static_cast<i64>(k0 + (4 * j + q) * VE) * EB, pol);
      }
#pragma unroll
    for (int tg = 0; tg < XT; ++tg) {
      if (8 * tg >= p.T) continue;
      const int tok = imin(8 * tg + g, p.T - 1);
      const char* xr = p.x + static_cast<i64>(tok) * p.x_ts * EB;
#pragma unroll
      for (int j = 0; j < KV; ++j)
        cp_x16(slot + (RG * 2 * KV + tg * KV + j) * 512, xr + static_cast<i64>(k0 + (4 * j + q) * VE) * EB);
    }
  }
  // ASYNC: this lane's vectors of a filled slot (`s`: the slot's address + lane * 16) into a tile
  static PBG_DEVICE void fetch(const unsigned char* s, Tile& t) {
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < KV; ++j)
          t.v[rg][h][j] = *reinterpret_cast<const U32x4*>(s + ((rg * 2 + h) * KV + j) * 512);
#pragma unroll
    for (int tg = 0; tg < XT; ++tg)
#pragma unroll
      for (int j = 0; j < KV; ++j)
        t.x[tg][j] = *reinterpret_cast<const U32x4*>(s + (RG * 2 * KV + tg * KV + j) * 512);
  }

  // the activation vectors of step ks, token groups < TG (groups past T are skipped: their
  // registers are never read)
  template <bool TAIL>
  static PBG_DEVICE void load_x(const Params& p, int ks, U32x4 (*xv)[KV]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int k0 = ks * KSTEP;
#pragma unroll
    for (int tg = 0; tg < XT; ++tg) {
      if (8 * tg >= p.T) continue;
      const int tok = imin(8 * tg + g, p.T - 1);   // tokens past T: a copy of T - 1, never stored
      const char* xr = p.x + static_cast<i64>(tok) * p.x_ts * EB;
#pragma unroll
      for (int j = 0; j < KV; ++j) {
        const int k = k0 + (4 * j + q) * VE;
        if (!TAIL || k < p.K) xv[tg][j] = ld_x16(xr + static_cast<i64>(k) * EB);
        else zero<4>(&xv[tg][j].x);
      }
    }
  }

  // token-group outer: one group's activation vectors are live at a time
  template <bool TAIL>
  static PBG_DEVICE void step(const Params& p, int ks, const Tile& t, Acc* acc) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int k0 = ks * KSTEP;
#pragma unroll
    for (int tg = 0; tg < TG; ++tg) {
      if (8 * tg >= p.T) continue;
      const int tok = imin(8 * tg + g, p.T - 1);   // tokens past T: a copy of T - 1, never stored
      U32x4 xv[KV];
      if constexpr (XPRE) {
#pragma unroll
        for (int j = 0; j < KV; ++j) xv[j] = t.x[tg][j];
      } else if constexpr (XVEC) {
        const char* xr = p.x + static_cast<i64>(tok) * p.x_ts * EB;
#pragma unroll
        for (int j = 0; j < KV; ++j) {
          const int k = k0 + (4 * j + q) * VE;
          if (!TAIL || k < p.K) xv[j] = ld_x16(xr + static_cast<i64>(k) * EB);
          else zero<4>(&xv[j].x);
        }
      } else {
        stage_x(p, tg, k0, xv);
      }
#pragma unroll
      for (int rg = 0; rg < RG; ++rg) {
        Acc* d = acc + (rg * TG + tg) * 4;
        Acc fresh[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};
        Acc* sink = kFresh ? fresh : d;
#pragma unroll
        for (int j = 0; j < KV; ++j) {
          const U32x4& lo = t.v[rg][0][j];
          const U32x4& hi = t.v[rg][1][j];
          const u32 a0[4] = {lo.x, hi.x, lo.y, hi.y}, b0[2] = {xv[j].x, xv[j].y};
          Kind::mma(sink, a0, b0);
          const u32 a1[4] = {lo.z, hi.z, lo.w, hi.w}, b1[2] = {xv[j].z, xv[j].w};
          Kind::mma(sink, a1, b1);
        }
        if constexpr (kFresh) {
#pragma unroll
          for (int e = 0; e < 4; ++e) d[e] = acc_add(d[e], fresh[e]);
        }
      }
    }
  }

  // Activations without aligned K-contiguous rows: the warp copies the token group's 8 x KSTEP
  // block into its own shared-memory scratch (the area it parks its accumulators in after the
  // mainloop), K-contiguous, reading 8 neighbouring tokens per k (coalesced when tokens are
  // contiguous); each lane then takes its vectors from there. Positions past K read as 0.
  static PBG_DEVICE void stage_x(const Params& p, int tg, int k0, U32x4* xv) {
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    unsigned char* scratch = gemv_smem + (threadIdx.x >> 5) * (OUT * 32 * 4);
    static_assert(8 * KSTEP * EB <= OUT * 32 * 4, "the block fits the warp's parking area");
    __syncwarp();   // the previous group's vectors are read
#pragma unroll 2
    for (int idx = lane; idx < 8 * KSTEP; idx += 32) {
      const int tl = idx & 7, kk = idx >> 3, k = k0 + kk;
      const int tok = imin(8 * tg + tl, p.T - 1);
      u32 bits = 0;
      if (k < p.K) bits = ld_elem<EB>(p.x + (static_cast<i64>(tok) * p.x_ts + static_cast<i64>(k) * p.x_ks) * EB);
      if constexpr (EB == 1) scratch[tl * KSTEP + kk] = static_cast<unsigned char>(bits);
      else if constexpr (EB == 2) reinterpret_cast<u16*>(scratch)[tl * KSTEP + kk] = static_cast<u16>(bits);
      else reinterpret_cast<u32*>(scratch)[tl * KSTEP + kk] = bits;
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < KV; ++j)
      xv[j] = *reinterpret_cast<const U32x4*>(scratch + (g * KSTEP + (4 * j + q) * VE) * EB);
  }

  static PBG_DEVICE void finish(Acc*) {}
  // workspace order of an accumulator's 32 lanes: position p holds lane (p % 8) * 4 + p / 8, so
  // the lanes of one q sit side by side (with T <= 2 only q = 0 holds tokens: 32 bytes)
  static PBG_DEVICE int lane_at(int p) { return (p & 7) * 4 + (p >> 3); }
  static PBG_DEVICE void coord(int i, int lane, int& row, int& tok) {
    const int g = lane >> 2, q = lane & 3;
    const int rg = i / (TG * 4), tg = (i / 4) % TG, e = i % 4;
    row = 16 * rg + g + 8 * (e >> 1);
    tok = 8 * tg + 2 * q + (e & 1);
  }
};

// ---- mainloop kMmaR: 16-bit W R-contiguous (W[r, p] at w[r + p * w_ks]) -----------------------
// Lane (g, q) loads RPT (2, 4, 8) consecutive rows RPT g .. RPT g + RPT - 1 (one 2 RPT-byte vector) at each
// of the four k = k0 + 4q + c, c < 4 (one step = 16 k). PRMT pairs them per row: P[i][0] = (k 4q,
// 4q+1), P[i][1] = (4q+2, 4q+3) of row RPT g + i. MMA tile mt (of RPT / 2) takes rows RPT g + 2mt
// (as its row g) and RPT g + 2mt + 1 (as row g + 8): A = {P[2mt][0], P[2mt+1][0], P[2mt][1],
// P[2mt+1][1]}; B = X[token, k0 + 4q .. +3] as two words. MMA k positions 2q, 2q+1 / 2q+8, 2q+9
// are actual k 4q, 4q+1 / 4q+2, 4q+3 in both operands.
// Accumulator (mt, tg, e): row RPT g + 2 mt + e / 2, token 8 tg + 2 q + e % 2.
template <class Kind, int RPT, int TG, int LOADS>
struct MmaR {
  typedef typename Kind::Acc Acc;
  static constexpr int EB = Kind::kElemBytes;
  static_assert(EB == 2, "kMmaR pairs 16-bit values");
  static_assert(RPT == 2 || RPT == 4 || RPT == 8, "a lane loads 4, 8 or 16 bytes of a k column");
  static constexpr int MT = RPT / 2, ROWS = 8 * RPT, KSTEP = 16, FRAG = MT * TG * 4, OUT = FRAG, KSPLIT = 1;
  static constexpr int WORDS = RPT / 2;   // 32-bit words per lane per k column
  static constexpr bool WVEC = (LOADS & kWVec) != 0, XVEC = (LOADS & kXVec) != 0;
  static constexpr int STAGES = WVEC && XVEC ? 2 : 1;   // the PRMT pairs' registers leave room for two
  static constexpr bool ASYNC = false;
  static constexpr int RING_BYTES = 0;
  struct Tile { u32 v[4][WORDS]; };

  template <bool TAIL>
  static PBG_DEVICE void load_w(const Params& p, int row0, int ks, Tile& t, u64 pol) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int k0 = ks * KSTEP;
    const int r0 = row0 + RPT * g;
    // WVEC (host): aligned columns and R % RPT == 0, so a vector lies wholly below R or wholly
    // past it; one past it reads rows R - RPT.. instead (valid memory; rows >= R are never stored)
    const int rv = r0 < p.R ? r0 : p.R - RPT;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int k = k0 + 4 * q + c;
      if (TAIL && k >= p.K) {
        zero<WORDS>(t.v[c]);
      } else if constexpr (WVEC) {
        const char* cp = p.w + (static_cast<i64>(k) * p.w_ks + rv) * EB;
        if constexpr (RPT == 8) {
          const U32x4 v = ld_stream16(cp, pol);
          t.v[c][0] = v.x; t.v[c][1] = v.y; t.v[c][2] = v.z; t.v[c][3] = v.w;
        } else if constexpr (RPT == 4) {
          const U32x2 v = ld_stream8(cp, pol);
          t.v[c][0] = v.x; t.v[c][1] = v.y;
        } else {
          t.v[c][0] = ld_stream4(cp, pol);
        }
      } else {
        gather<EB, WORDS, true>(t.v[c], p.w + static_cast<i64>(k) * p.w_ks * EB, 1, r0, p.R);
      }
    }
  }

  template <bool TAIL>
  static PBG_DEVICE void step(const Params& p, int ks, const Tile& t, Acc* acc) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int k0 = ks * KSTEP, k = k0 + 4 * q;
    U32x2 xv[TG];
#pragma unroll
    for (int tg = 0; tg < TG; ++tg) {
      if (8 * tg >= p.T) continue;
      const int tok = imin(8 * tg + g, p.T - 1);
      const char* xr = p.x + static_cast<i64>(tok) * p.x_ts * EB;
      // XVEC (host): 8-byte aligned rows and K % 4 == 0
      if constexpr (!XVEC) gather<EB, 2, false>(&xv[tg].x, xr, p.x_ks, k, p.K);
      else if (!TAIL || k < p.K) xv[tg] = ld_x8(xr + static_cast<i64>(k) * EB);
      else zero<2>(&xv[tg].x);
    }
    // the pair (k 4q, 4q+1) / (4q+2, 4q+3) of row RPT g + i: selector 0x5410 takes the low halves
    // of both words, 0x7632 the high halves (row i lives in half i % 2 of word i / 2); built per
    // tile, so only one tile's four registers are live
    auto pair = [&](int i, int h) {
      return __byte_perm(t.v[2 * h][i / 2], t.v[2 * h + 1][i / 2], (i & 1) ? 0x7632u : 0x5410u);
    };
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const u32 a[4] = {pair(2 * mt, 0), pair(2 * mt + 1, 0), pair(2 * mt, 1), pair(2 * mt + 1, 1)};
#pragma unroll
      for (int tg = 0; tg < TG; ++tg) {
        if (8 * tg >= p.T) continue;
        Acc* d = acc + (mt * TG + tg) * 4;
        const u32 b[2] = {xv[tg].x, xv[tg].y};
        Acc fresh[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};
        Kind::mma(fresh, a, b);
#pragma unroll
        for (int e = 0; e < 4; ++e) d[e] = acc_add(d[e], fresh[e]);
      }
    }
  }

  static PBG_DEVICE void finish(Acc*) {}
  static PBG_DEVICE int lane_at(int p) { return (p & 7) * 4 + (p >> 3); }
  static PBG_DEVICE void coord(int i, int lane, int& row, int& tok) {
    const int g = lane >> 2, q = lane & 3;
    const int mt = i / (TG * 4), tg = (i / 4) % TG, e = i % 4;
    row = RPT * g + 2 * mt + (e >> 1);
    tok = 8 * tg + 2 * q + (e & 1);
  }
};

// ---- mainloop kFmaK: W K-contiguous on CUDA cores (float32) ----------------------------------
// Lane (kl = lane % 8, rl, tl): lane / 8 splits into RL = 4 / LT row lanes x LT token lanes
// (rl = (lane / 8) % RL, tl = (lane / 8) / RL). Rows i RL + rl (i < RPT), tokens tl + LT jj
// (jj < TPT = 8 TG / LT), k = k0 + kl * VE + 0..VE (one step = 8 VE k): a load instruction reads
// RL rows x 128 contiguous bytes (the LT token lanes of a row share its addresses), X[t, same k]
// one 128-byte line. The KSPLIT = 8 lanes kl of one (rl, tl) hold partial sums of the same entries,
// which the CTA framework adds in lane order. Accumulator i: row (i / TPT) RL + rl, token
// tl + LT (i % TPT).
template <class Kind, int RPT, int LT, int TG, int LOADS>
struct FmaK {
  typedef typename Kind::Acc Acc;
  static constexpr int EB = Kind::kElemBytes, VE = 16 / EB, RL = 4 / LT, TPT = 8 * TG / LT;
  static_assert(LT == 1 || LT == 2 || LT == 4, "four lanes of rows and tokens per k lane");
  static constexpr int ROWS = RL * RPT, KSTEP = 8 * VE, FRAG = RPT * TPT, OUT = FRAG, KSPLIT = 8;
  static constexpr bool WVEC = (LOADS & kWVec) != 0, XVEC = (LOADS & kXVec) != 0;
  // one token group: the weight's bytes bound the step (prefetch); more: the FFMAs (T per weight
  // element) do, and the registers go to the sums
  static constexpr int STAGES = WVEC && TG == 1 ? 2 : 1;
  static constexpr bool ASYNC = false;
  static constexpr int RING_BYTES = 0;
  struct Tile { U32x4 v[RPT]; };

  template <bool TAIL>
  static PBG_DEVICE void load_w(const Params& p, int row0, int ks, Tile& t, u64 pol) {
    const int lane = threadIdx.x & 31, kl = lane & 7, rl = (lane >> 3) % RL;
    const int k = ks * KSTEP + kl * VE;
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      const int row = imin(row0 + i * RL + rl, p.R - 1);
      const char* rp = p.w + static_cast<i64>(row) * p.w_rs * EB;
      if constexpr (!WVEC) gather<EB, 4, true>(&t.v[i].x, rp, 1, k, p.K);
      else if (!TAIL || k < p.K) t.v[i] = ld_stream16(rp + static_cast<i64>(k) * EB, pol);
      else zero<4>(&t.v[i].x);
    }
  }

  template <bool TAIL>
  static PBG_DEVICE void step(const Params& p, int ks, const Tile& t, Acc* acc) {
    const int lane = threadIdx.x & 31, kl = lane & 7, tl = (lane >> 3) / RL;
    const int k = ks * KSTEP + kl * VE;
    constexpr int PER = 4 / EB;
#pragma unroll
    for (int jj = 0; jj < TPT; ++jj) {
      const int tok = tl + LT * jj;
      if (tok >= p.T) continue;
      const char* xr = p.x + static_cast<i64>(tok) * p.x_ts * EB;
      U32x4 xv;
      if constexpr (!XVEC) gather<EB, 4, false>(&xv.x, xr, p.x_ks, k, p.K);
      else if (!TAIL || k < p.K) xv = ld_x16(xr + static_cast<i64>(k) * EB);
      else zero<4>(&xv.x);
      const u32 xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const u32 ww[4] = {t.v[i].x, t.v[i].y, t.v[i].z, t.v[i].w};
        Acc s = acc[i * TPT + jj];
#pragma unroll
        for (int e = 0; e < VE; ++e)
          s = Kind::mad(s, Kind::elem(ww[e / PER], e % PER), Kind::elem(xw[e / PER], e % PER));
        acc[i * TPT + jj] = s;
      }
    }
  }

  static PBG_DEVICE void finish(Acc*) {}
  // workspace order: positions 0..3 hold the kl = 0 lanes (the entries' owners), one 16-byte
  // vector; position p holds lane (p % 4) * 8 + p / 4
  static PBG_DEVICE int lane_at(int p) { return (p & 3) * 8 + (p >> 2); }
  static PBG_DEVICE void coord(int i, int lane, int& row, int& tok) {
    const int sub = lane >> 3;
    row = (i / TPT) * RL + sub % RL;
    tok = sub / RL + LT * (i % TPT);
  }
};

// ---- mainloop kFmaR: W R-contiguous on CUDA cores (float32, int8) ---------------------------
// Lane (rl = lane % LR, tl = lane / LR), LR = 32 / LT: rows rl * 4 + e (one 4-element vector per
// k, LR lanes of a warp read LR * 4 consecutive rows), tokens tl + LT i (i < TPT = 8 TG / LT).
// One step = 4 k: four weight vectors, and per token one 4-element X vector (K-contiguous X).
// Accumulator (e, i): row rl * 4 + e, token tl + LT i.
template <class Kind, int LT, int TG, int LOADS>
struct FmaR {
  typedef typename Kind::Acc Acc;
  static constexpr int EB = Kind::kElemBytes, VE = 4, VB = VE * EB, LR = 32 / LT, TPT = 8 * TG / LT;
  static_assert(32 % LT == 0 && (8 * TG) % LT == 0, "lanes split evenly into rows and tokens");
  static constexpr int ROWS = LR * VE, KSTEP = 4, FRAG = VE * TPT, OUT = FRAG, KSPLIT = 1;
  static constexpr int WORDS = VB / 4;
  static constexpr bool WVEC = (LOADS & kWVec) != 0, XVEC = (LOADS & kXVec) != 0;
  static constexpr int STAGES = WVEC && TG <= 2 ? 2 : 1;   // more tokens: FFMA-bound, registers to sums
  static constexpr bool ASYNC = false;
  static constexpr int RING_BYTES = 0;
  struct Tile { u32 v[KSTEP][WORDS]; };

  template <bool TAIL>
  static PBG_DEVICE void load_w(const Params& p, int row0, int ks, Tile& t, u64 pol) {
    const int lane = threadIdx.x & 31, rl = lane % LR;
    const int k0 = ks * KSTEP, r0 = row0 + rl * VE;
    // WVEC: R % VE == 0 (host): as kMmaR, a vector past R reads the last VE rows instead
    const int rv = r0 < p.R ? r0 : p.R - VE;
#pragma unroll
    for (int c = 0; c < KSTEP; ++c) {
      const int k = k0 + c;
      if (TAIL && k >= p.K) {
        zero<WORDS>(t.v[c]);
      } else if constexpr (WVEC) {
        const char* cp = p.w + (static_cast<i64>(k) * p.w_ks + rv) * EB;
        if constexpr (VB == 16) {
          const U32x4 v = ld_stream16(cp, pol);
          t.v[c][0] = v.x; t.v[c][1] = v.y; t.v[c][2] = v.z; t.v[c][3] = v.w;
        } else {
          t.v[c][0] = ld_stream4(cp, pol);
        }
      } else {
        gather<EB, WORDS, true>(t.v[c], p.w + static_cast<i64>(k) * p.w_ks * EB, 1, r0, p.R);
      }
    }
  }

  template <bool TAIL>
  static PBG_DEVICE void step(const Params& p, int ks, const Tile& t, Acc* acc) {
    const int lane = threadIdx.x & 31, tl = lane / LR;
    const int k0 = ks * KSTEP;
    constexpr int PER = 4 / EB;
#pragma unroll
    for (int i = 0; i < TPT; ++i) {
      const int tok = tl + LT * i;
      if (tok < p.T) {
        const char* xr = p.x + static_cast<i64>(tok) * p.x_ts * EB;
        u32 xw[WORDS];
        // XVEC (host): 4-element aligned rows and K % 4 == 0: the step lies wholly below K
        if constexpr (XVEC && !TAIL) {
          if constexpr (VB == 16) {
            const U32x4 v = ld_x16(xr + static_cast<i64>(k0) * EB);
            xw[0] = v.x; xw[1] = v.y; xw[2] = v.z; xw[3] = v.w;
          } else {
            xw[0] = ld_x4(xr + static_cast<i64>(k0) * EB);
          }
        } else {
          gather<EB, WORDS, false>(xw, xr, p.x_ks, k0, p.K);
        }
#pragma unroll
        for (int c = 0; c < KSTEP; ++c) {
          const auto xc = Kind::elem(xw[c / PER], c % PER);
#pragma unroll
          for (int e = 0; e < VE; ++e)
            acc[e * TPT + i] = Kind::mad(acc[e * TPT + i], Kind::elem(t.v[c][e / PER], e % PER), xc);
        }
      }
    }
  }

  static PBG_DEVICE void finish(Acc*) {}
  static PBG_DEVICE int lane_at(int p) { return p; }
  static PBG_DEVICE void coord(int i, int lane, int& row, int& tok) {
    const int rl = lane % LR, tl = lane / LR;
    row = rl * VE + i / TPT;
    tok = tl + LT * (i % TPT);
  }
};

// PIPE: the kMmaK mainloop's ring (see MmaK); the other mainloops take 0 (their own depths)
template <class Kind, int PATH, int P1, int P2, int TG, int LOADS, int PIPE>
struct MainloopOf;
template <class Kind, int P1, int P2, int TG, int LOADS, int PIPE>
struct MainloopOf<Kind, kMmaK, P1, P2, TG, LOADS, PIPE> { typedef MmaK<Kind, P1, P2, TG, LOADS, PIPE> type; };
template <class Kind, int P1, int P2, int TG, int LOADS>
struct MainloopOf<Kind, kMmaR, P1, P2, TG, LOADS, 0> { typedef MmaR<Kind, P1, TG, LOADS> type; };
template <class Kind, int P1, int P2, int TG, int LOADS>
struct MainloopOf<Kind, kFmaK, P1, P2, TG, LOADS, 0> { typedef FmaK<Kind, P1, P2, TG, LOADS> type; };
template <class Kind, int P1, int P2, int TG, int LOADS>
struct MainloopOf<Kind, kFmaR, P1, P2, TG, LOADS, 0> { typedef FmaR<Kind, P1, TG, LOADS> type; };

// ---- the CTA framework -----------------------------------------------------------------------
// The CTA whose unit range [c U / G, (c+1) U / G) holds unit u (every CTA has >= 1 unit: G <= U).
PBG_DEVICE int cta_of(long long u, long long units, long long G) {
  return static_cast<int>(((u + 1) * G - 1) / units);
}
PBG_DEVICE int atom_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
PBG_DEVICE float ld_partial(const float* p) { return __ldcg(p); }
PBG_DEVICE int ld_partial(const int* p) { return __ldcg(p); }

// One warp's mainloop over its steps ks0, ks0 + stride, ... < ks1 (possibly none; the CTA's warps
// along k interleave their steps): the steps wholly inside K through a ring of M::STAGES weight
// tiles in registers (the loads of the next STAGES - 1 steps are in flight while a step's
// activations are read and its products formed; 1: load, then use), then the row tile's last
// step where K % KSTEP != 0, with guarded loads.
template <class M>
PBG_DEVICE void mainloop(const Params& p, int row0, int ks0, int ks1, int stride, typename M::Acc* acc, u64 pol,
                         unsigned char* ring) {
  constexpr int S = M::STAGES;
  const int body_end = imin(ks1, p.K / M::KSTEP);
  int ks = ks0;
  if constexpr (M::ASYNC) {
    // `ring`: this warp's S slots; the lane's vectors at + lane * 16. One commit group per step
    // (empty past the segment's end), so wait_group<S - 1> means: step ks's copies have landed.
    // A slot is refilled one step after it was read: the read's registers fed that step's MMAs,
    // issued (in order) before the refill.
    unsigned char* mine = ring + (threadIdx.x & 31) * 16;
    const u32 mine_s = smem_u32(mine);
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
      if (ks + i * stride < body_end) M::issue(p, row0, ks + i * stride, mine_s + i * M::SLOT_BYTES, pol);
      cp_commit();
    }
    int slot = 0;
    for (; ks < body_end; ks += stride) {
      const int ahead = slot == 0 ? S - 1 : slot - 1;
      if (ks + (S - 1) * stride < body_end)
        M::issue(p, row0, ks + (S - 1) * stride, mine_s + ahead * M::SLOT_BYTES, pol);
      cp_commit();
      cp_wait<S - 1>();
      typename M::Tile t;
      M::fetch(mine + slot * M::SLOT_BYTES, t);
      M::template step<false>(p, ks, t, acc);
      slot = slot == S - 1 ? 0 : slot + 1;
    }
  } else if constexpr (S > 1) {
    typename M::Tile ring[S];
#pragma unroll
    for (int i = 0; i < S - 1; ++i)
      if (ks + i * stride < body_end) M::template load_w<false>(p, row0, ks + i * stride, ring[i], pol);
    while (ks < body_end) {
#pragma unroll
      for (int i = 0; i < S; ++i) {   // unrolled: every ring index is a constant
        if (ks >= body_end) break;
        if (ks + (S - 1) * stride < body_end)
          M::template load_w<false>(p, row0, ks + (S - 1) * stride, ring[(i + S - 1) % S], pol);
        M::template step<false>(p, ks, ring[i], acc);
        ks += stride;
      }
    }
  } else {
    for (; ks < body_end; ks += stride) {
      typename M::Tile t;
      M::template load_w<false>(p, row0, ks, t, pol);
      M::template step<false>(p, ks, t, acc);
    }
  }
  if (ks < ks1) {   // ks == the row tile's last step, which K ends inside
    typename M::Tile t;
    M::template load_w<true>(p, row0, ks, t, pol);
    M::template step<true>(p, ks, t, acc);
  }
}

PBG_DEVICE float4 ld_partial4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
PBG_DEVICE int4 ld_partial4(const int* p) { return __ldcg(reinterpret_cast<const int4*>(p)); }
PBG_DEVICE float2 ld_partial2(const float* p) { return __ldcg(reinterpret_cast<const float2*>(p)); }
PBG_DEVICE int2 ld_partial2(const int* p) { return __ldcg(reinterpret_cast<const int2*>(p)); }

template <class Acc, int VW>
struct alignas(4 * VW) Vec { Acc v[VW]; };
// A VW-wide load from L2 (partials written by other SMs: not from L1)
template <class Acc, int VW>
PBG_DEVICE Vec<Acc, VW> ld_vec(const Acc* p, const Vec<Acc, VW>&) {
  Vec<Acc, VW> out;
  if constexpr (VW == 4) {
    const auto t = ld_partial4(p);
    out.v[0] = t.x; out.v[1] = t.y; out.v[2] = t.z; out.v[3] = t.w;
  } else if constexpr (VW == 2) {
    const auto t = ld_partial2(p);
    out.v[0] = t.x; out.v[1] = t.y;
  } else {
    out.v[0] = ld_partial(p);
  }
  return out;
}

// The CTA: WR x WK warps over one row tile of WR * ROWS rows (warp w: rows (w % WR) * ROWS..,
// warp steps w / WR, w / WR + WK, ...). A unit is (row tile, CTA step of WK warp steps); CTA c
// takes units [c U / G, (c+1) U / G).
// After a segment every warp parks its accumulators in shared memory [warp][i][lane]. The CTA's
// partial of the row tile is NE = WR * OUT * 32 workspace positions [wr][i][p] (p: M::lane_at's
// order); thread t owns the VW consecutive positions of each of its NV vectors (t + v THREADS) VW,
// so it sums (the WK warps and the KSPLIT lanes of each entry in order), publishes and reads
// partials with VW-wide accesses at constant offsets from one base per contributor: few
// registers, and all of a contributor's loads in flight together. Then either the CTA holds
// the whole row tile and stores C, or it publishes its partial to slot rt + c and counts itself
// in; the last contributor to arrive adds the slots in contributor order and stores C. The
// sums' order never depends on timing: every launch gives the same bits.
template <class Kind, int PATH, int P1, int P2, int TG, int LOADS, int WR, int WK, int PIPE>
__global__ void __launch_bounds__(256, 2)
gemv_kernel(const char* w, const char* x, char* c, void* ws, int* counters, int R, int T, int K, i64 w_rs, i64 w_ks,
            i64 x_ts, i64 x_ks, i64 c_rs, i64 c_ts, float alpha, float beta, int ialpha, int ibeta, int row_tiles) {
  typedef typename MainloopOf<Kind, PATH, P1, P2, TG, LOADS, PIPE>::type M;
  typedef typename Kind::Acc Acc;
  typedef typename Kind::Scale Scale;
  typedef typename Kind::O Out;
  constexpr int OUT = M::OUT, THREADS = 32 * WR * WK, NE = WR * OUT * 32;
  constexpr int PT = NE / THREADS;                       // positions per thread (OUT / WK)
  static_assert(PT * THREADS == NE && PT >= 1, "the CTA's warps share its positions evenly");
  constexpr int VW = PT >= 4 ? 4 : (PT >= 2 ? 2 : 1);   // positions per access
  constexpr int NV = PT / VW;                             // accesses per thread
  static_assert(NV * VW == PT, "whole vectors per thread");
  const Params p{w, x, c, ws, counters, R, T, K, w_rs, w_ks, x_ts, x_ks, c_rs, c_ts, row_tiles};
  const Scale sa = pick_scale(static_cast<Scale*>(nullptr), alpha, ialpha);
  const Scale sb = pick_scale(static_cast<Scale*>(nullptr), beta, ibeta);
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  Acc* park = reinterpret_cast<Acc*>(gemv_smem);        // [warp][OUT][32]
  // then (kAsync) each warp's ring of weight and activation slots (the host sizes both)
  constexpr int PARK_BYTES = (THREADS * OUT * 4 + 15) / 16 * 16;
  __shared__ int s_prev;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wr = warp % WR, wk = warp / WR;
  constexpr int CTA_ROWS = WR * M::ROWS;
  const int wsteps = (K + M::KSTEP - 1) / M::KSTEP;      // warp steps per row tile
  const int csteps = (wsteps + WK - 1) / WK;             // CTA steps (units) per row tile
  const long long units = static_cast<long long>(row_tiles) * csteps, G = gridDim.x, cta = blockIdx.x;
  const long long u_end = (cta + 1) * units / G;
  Acc* slots = static_cast<Acc*>(ws);
  const u64 pol = evict_first_policy();
  for (long long u = cta * units / G; u < u_end;) {
    const int rt = static_cast<int>(u / csteps);
    const long long tile_u0 = static_cast<long long>(rt) * csteps;
    const long long seg_end = u_end < tile_u0 + csteps ? u_end : tile_u0 + csteps;
    const int s0 = static_cast<int>(u - tile_u0), s1 = static_cast<int>(seg_end - tile_u0);
    {
      Acc acc[M::FRAG];
#pragma unroll
      for (int i = 0; i < M::FRAG; ++i) acc[i] = Acc(0);
      mainloop<M>(p, rt * CTA_ROWS + wr * M::ROWS, s0 * WK + wk, imin(s1 * WK, wsteps), WK, acc, pol,
                  gemv_smem + PARK_BYTES + warp * M::RING_BYTES);
      M::finish(acc);
#pragma unroll
      for (int i = 0; i < OUT; ++i) park[(warp * OUT + i) * 32 + lane] = acc[i];
    }
    __syncthreads();
    const int first = cta_of(tile_u0, units, G), last = cta_of(tile_u0 + csteps - 1, units, G);
    const bool shared = first != last;
    // position s -> the entry (parked index e = [wr][i][lane]) and its row and token; false
    // where it is no entry of C (row >= R, token >= T, or a KSPLIT lane that owns none)
    auto locate = [&](int s, int& e, int& row, int& tok) {
      const int ln = M::lane_at(s & 31);
      e = (s & ~31) | ln;
      M::coord((s >> 5) % OUT, ln, row, tok);
      row += rt * CTA_ROWS + (s / (32 * OUT)) * M::ROWS;
      return ln % M::KSPLIT == 0 && row < R && tok < T;
    };
    // the CTA's sums of this thread's positions (warps along k in warp order, each entry's
    // KSPLIT lanes in lane order), kept in shared memory in place of the entry's first parked
    // value (no other thread reads that word); bit (v VW + q) of `live`: position
    // (t + v THREADS) VW + q is an entry of C
    // (loops over v stay rolled: unrolled, the compiler keeps every position's row, token and
    // address live across the phases, past the register bound)
    u32 live = 0;
#pragma unroll 1
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int q = 0; q < VW; ++q) {
        int e, row, tok;
        if (locate((threadIdx.x + v * THREADS) * VW + q, e, row, tok)) {
          live |= 1u << (v * VW + q);
          Acc sum = park[e];
          for (int k = 0; k < WK; ++k)
#pragma unroll
            for (int kk = 0; kk < M::KSPLIT; ++kk)
              if (k + kk > 0) sum = acc_add(sum, park[k * NE + e + kk]);
          park[e] = sum;
        }
      }
    // entry index of this thread's position (v, q) (its sum's place in shared memory)
    auto entry = [&](int v, int q) {
      const int s = (threadIdx.x + v * THREADS) * VW + q;
      return (s & ~31) | M::lane_at(s & 31);
    };
    constexpr u32 kVecMask = (1u << VW) - 1;
    bool finisher = true;
    if (shared) {
      Acc* mine = slots + (rt + cta) * NE + threadIdx.x * VW;
#pragma unroll 1
      for (int v = 0; v < NV; ++v) {
        if ((live >> (v * VW)) & kVecMask) {
          Vec<Acc, VW> out;
#pragma unroll
          for (int q = 0; q < VW; ++q) out.v[q] = park[entry(v, q)];   // dead positions: never read back
          *reinterpret_cast<Vec<Acc, VW>*>(mine + v * THREADS * VW) = out;
        }
      }
      __threadfence();   // this thread's partial is visible GPU-wide ...
      __syncthreads();   // ... for every thread, before thread 0 counts the CTA in
      if (threadIdx.x == 0) s_prev = atom_add_acq_rel_gpu(counters + rt, 1);
      __syncthreads();
      finisher = s_prev == last - first;   // the last contributor: every other partial is published
      if (finisher) {
        // contributor order (this CTA's own slot read back too): the same bits whoever is last;
        // the loads of CB contributors x VB vectors (<= 16 values) in flight together
        constexpr int VB = PT > 16 ? 16 / VW : NV;
        constexpr int CB = PT >= 16 ? 1 : 16 / PT;
        const Acc* base = slots + (rt + first) * NE + threadIdx.x * VW;
#pragma unroll 1
        for (int v0 = 0; v0 < NV; v0 += VB) {
          for (int c0 = 0; c0 <= last - first; c0 += CB) {
            Vec<Acc, VW> part[CB][VB];
#pragma unroll
            for (int b = 0; b < CB; ++b)
#pragma unroll
              for (int vv = 0; vv < VB; ++vv)
                if (c0 + b <= last - first && ((live >> ((v0 + vv) * VW)) & kVecMask))
                  part[b][vv] = ld_vec(base + (c0 + b) * static_cast<long long>(NE) + (v0 + vv) * THREADS * VW, part[b][vv]);
#pragma unroll
            for (int b = 0; b < CB; ++b)
#pragma unroll
              for (int vv = 0; vv < VB; ++vv)
#pragma unroll
                for (int q = 0; q < VW; ++q)
                  if (c0 + b <= last - first && ((live >> ((v0 + vv) * VW + q)) & 1)) {
                    Acc& sum = park[entry(v0 + vv, q)];
                    sum = c0 + b == 0 ? part[b][vv].v[q] : acc_add(sum, part[b][vv].v[q]);
                  }
          }
        }
      }
    }
    if (finisher) {
      // C = alpha * sum + beta * C, one vector's positions at a time (their old values of C
      // loaded together first); beta == 0: C is never read (a NaN there stays out)
      const bool read_c = sb != Scale(0);
#pragma unroll 1
      for (int v = 0; v < NV; ++v) {
        if (!((live >> (v * VW)) & kVecMask)) continue;
        char* cp[VW];
        Acc old[VW];
#pragma unroll
        for (int q = 0; q < VW; ++q) {
          int e, row, tok;
          cp[q] = nullptr;
          if (((live >> (v * VW + q)) & 1) && locate((threadIdx.x + v * THREADS) * VW + q, e, row, tok)) {
            cp[q] = c + (static_cast<i64>(row) * c_rs + static_cast<i64>(tok) * c_ts) * Kind::kCBytes;
            if (read_c) old[q] = Out::load(cp[q]);
          }
        }
#pragma unroll
        for (int q = 0; q < VW; ++q) {
          if (cp[q] != nullptr) {
            const Acc sum = park[entry(v, q)];
            Out::store(cp[q], read_c ? axpby(sa, sum, sb, old[q]) : ax(sa, sum));
          }
        }
      }
      if (shared && threadIdx.x == 0) counters[rt] = 0;   // ready for the next launch (stream order)
    }
    __syncthreads();   // park and s_prev are rewritten by the next segment
    u = seg_end;
  }
}

// ---- the row-block split (template ROWS of the host's plan: gemv.ROWS_TILES) ------------------
// For x @ W.T with 16-byte K-contiguous loads of both operands and T <= 16. A CTA is
// WK = blockDim.x / 32 warps (chosen per problem by the host) over whole row blocks of
// M::ROWS rows: warp w takes warp steps w, w + WK, ... of the block's K (the same mainloop and ring
// as gemv_kernel), the WK warps' sums meet in shared memory and are added in warp order, and the
// CTA stores C. No workspace, no atomics, no second segment: the host sizes WK so that every
// row block has its own resident CTA (one wave, every warp streaming the same bytes within one
// step), so no CTA publishes a partial or waits on an L2 round trip after its last weight byte;
// blocks past the grid (a weight with more row blocks than resident CTAs) go grid-stride.
// Sums in a fixed order: bitwise reproducible. The parameters are gemv_kernel's (ws, counters
// unused; row_tiles = row blocks).
template <class Kind, int RG, int KV, int TG, int PIPE>
__global__ void __launch_bounds__(512, 1)
gemv_rows_kernel(const char* w, const char* x, char* c, void*, int*, int R, int T, int K, i64 w_rs, i64 w_ks,
                 i64 x_ts, i64 x_ks, i64 c_rs, i64 c_ts, float alpha, float beta, int ialpha, int ibeta,
                 int row_blocks) {
  typedef MmaK<Kind, RG, KV, TG, kWVec | kXVec, PIPE> M;
  static_assert(!M::ASYNC, "the row-block split keeps its ring in registers (shared memory holds the sums)");
  typedef typename Kind::Acc Acc;
  typedef typename Kind::Scale Scale;
  typedef typename Kind::O Out;
  constexpr int OUT = M::OUT, NE = OUT * 32;
  const Params p{w, x, c, nullptr, nullptr, R, T, K, w_rs, w_ks, x_ts, x_ks, c_rs, c_ts, row_blocks};
  const Scale sa = pick_scale(static_cast<Scale*>(nullptr), alpha, ialpha);
  const Scale sb = pick_scale(static_cast<Scale*>(nullptr), beta, ibeta);
  const bool read_c = sb != Scale(0);
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  Acc* park = reinterpret_cast<Acc*>(gemv_smem);        // [warp][OUT][32]
  const int wk_count = static_cast<int>(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wsteps = (K + M::KSTEP - 1) / M::KSTEP;
  const u64 pol = evict_first_policy();
  for (int blk = blockIdx.x; blk < row_blocks; blk += gridDim.x) {
    {
      Acc acc[M::FRAG];
#pragma unroll
      for (int i = 0; i < M::FRAG; ++i) acc[i] = Acc(0);
      mainloop<M>(p, blk * M::ROWS, warp, wsteps, wk_count, acc, pol, nullptr);
#pragma unroll
      for (int i = 0; i < OUT; ++i) park[(warp * OUT + i) * 32 + lane] = acc[i];
    }
    __syncthreads();
#pragma unroll 1
    for (int e = threadIdx.x; e < NE; e += blockDim.x) {
      int row, tok;
      M::coord(e >> 5, e & 31, row, tok);
      row += blk * M::ROWS;
      if (row < R && tok < T) {
        Acc sum = park[e];
#pragma unroll 1
        for (int k = 1; k < wk_count; ++k) sum = acc_add(sum, park[k * NE + e]);
        char* cp = c + (static_cast<i64>(row) * c_rs + static_cast<i64>(tok) * c_ts) * Kind::kCBytes;
        Out::store(cp, read_c ? axpby(sa, sum, sb, Out::load(cp)) : ax(sa, sum));
      }
    }
    __syncthreads();   // park is rewritten by the next block
  }
}

}  // namespace gemv
}  // namespace pyblasgemm
