// The Ozaki scheme II on the GPU: the passes around the int8 residue GEMMs.
//
// The host side (pyblasgemm/kernels/ozaki_kernels.py) prepends the tables these kernels read
// for one moduli count (kOzMod, kOzMagic, kOzPow16/32/48, and the CRT constants kOzChunks, kOzCrtY, kOzCrtM,
// kOzCrtP, kOzCrtInvP in constant memory: generated from pyblasgemm.ozaki, the one source) and
// launches, for C = alpha * op(A) op(B) + beta * C in float64 (float32 / complex64 operands:
// the same passes on their values, which float64 holds exactly; C rounded once to float32):
//
//   1. ozaki_line_stats: per line (a row of op(A), a column of op(B)) the largest |x| and the
//      smallest nonzero |x|; a non-finite element makes the largest +Inf; the 'fast' scaling
//      (pyblasgemm.ozaki.split_fast) also W, the line's sum of squared 20-bit units;
//   2. ozaki_line_scale: per line the power-of-two exponent (bits - top, top from frexp of the
//      largest; 'fast': G - top + j from W and the host's thresholds), whether a nonzero
//      element truncates to 0 there (the range the scaling cannot hold: that line is
//      multiplied natively afterwards), and counters of both cases; 'fast': each line's bits;
//   3. ozaki_residues<COUNT>: trunc(x * 2^e) mod p for each modulus, int8 in the symmetric
//      range, written K-contiguous (the int8 GEMMs read both operands K-major: "TN"); with
//      the guard, one more plane of |trunc(x * 2^e)| >> (bits - 7) and per line the sum of
//      (|trunc| >> (bits - 16)) + 1 over its nonzero elements (pyblasgemm.ozaki.guard_planes;
//      'fast': each line's own bits).
//      ozaki_residues_pipe<COUNT, T, V> writes the same bytes from a split of each integer
//      (two DFMA, a DADD and an IMAD a modulus), V = 16 or 8 positions a thread, one 16- or
//      8-byte store a plane, the next tile's loads in flight, where row % V == 0 (the host's
//      residues_kernel_applies). Both write lines of row >= len bytes, zeros past len;
//   1-3 in one pass: ozaki_scale_residues<COUNT, T, V, L> (and _cluster<..., Q> on Hopper) holds
//      an operand's lines on chip between their statistics and residues and writes all three
//      passes' outputs, bit for bit, from one read (below; the plan says which operands take it);
//   4. (COUNT int8 GEMMs with int32 results, batched, one more for the guard: not here)
//   5. ozaki_reconstruct<COUNT, CPLX>: per element the CRT sum in 39-bit float64 chunks minus
//      the nearest multiple of P, 2^-(e_i + f_j), alpha and beta; CPLX pairs
//      column j with column n + j as the real and imaginary parts of a complex result. With
//      the guard, an element whose error bound the guard plane cannot prove is left alone and
//      counted (pyblasgemm.ozaki.guard_failures): the host computes it natively.
//      ozaki_reconstruct_rows<COUNT, CPLX, TC, STAGE> gives the same bits 4 rows a thread, one
//      16-byte load per plane, where m % 4 == 0 and the planes are 16-byte aligned (the host's
//      rows_kernel_applies); ozaki_reconstruct, one element a thread, everywhere else. From
//      the digit store's byte planes (the Hopper int8 kernel's kEpiResidue) the same bits:
//      ozaki_reconstruct_digits16 (16 rows a lane staged, m % 16 == 0), the row kernel (one
//      word of 4 rows a plane) or the element kernel.
//
// Every floating-point step is written with _rn intrinsics (no contraction into FMA), in the
// order pyblasgemm.ozaki runs it on the host: both produce the same bits.
//
// The operand passes (stats, residues) are templates on the operand's element type T (double,
// or float read directly: a float64 copy of a float32 operand would cost 8 bytes written and
// read per element), the reconstruction on C's type TC (float: the double result rounded once
// by store_c, subnormals kept).
#pragma once

#include "../ptx/sm80_cp_async.cuh"

#ifndef PBG_OZAKI_TABLES
#error "ozaki.cuh needs one moduli count's tables first: pyblasgemm.kernels.ozaki_kernels.tables_source"
#endif

namespace pyblasgemm {
namespace ozaki {

// x mod p_l for x < 2^30: Barrett with magic = ceil(2^38 / p) = (2^38 + eps) / p (eps < p <=
// 256, and magic < 2^32 as every modulus is above 64): the quotient's error x * eps / (p 2^38)
// stays below 1 / p, so it is exact. One wide multiply, a shift and a multiply-subtract.
__device__ __forceinline__ unsigned mod_wide(unsigned x, int l) {
    const unsigned q = (unsigned)(((unsigned long long)x * kOzMagic[l]) >> 38);
    return x - q * (unsigned)kOzMod[l];
}

// x mod p_l for any 32-bit x: (x >> 16) * (2^16 mod p) + (x & 0xffff) < 2^24
__device__ __forceinline__ unsigned mod_u32(unsigned x, int l) {
    return mod_wide((x >> 16) * kOzPow16[l] + (x & 0xffffu), l);
}

// x mod p_l for x < 2^62 (the scaled integers): its 16-bit digits times 2^(16 i) mod p sum to
// below 2^14 * 255 + 2 * 2^16 * 255 + 2^16 < 2^26
__device__ __forceinline__ unsigned mod_u62(unsigned long long x, int l) {
    const unsigned hi = (unsigned)(x >> 32), lo = (unsigned)x;
    return mod_wide((hi >> 16) * kOzPow48[l] + (hi & 0xffffu) * kOzPow32[l] + (lo >> 16) * kOzPow16[l]
                    + (lo & 0xffffu), l);
}

// An operand's element as a double, exactly: a float through inline PTX, as CuPy compiles with
// -ftz=true, under which (double)x is cvt.ftz.f64.f32 and flushes a subnormal float32 to 0
// (seen in this header's PTX: the subnormal operands' elements would have vanished)
__device__ __forceinline__ double to_double(double x) { return x; }
__device__ __forceinline__ double to_double(float x) {
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(x));
    return r;
}

// C's element from the double result: a double as is; a float rounded to nearest once, by
// inline PTX (CuPy compiles with -ftz=true, which would flush a subnormal float32 result)
__device__ __forceinline__ void store_c(double* dst, double v) { *dst = v; }
__device__ __forceinline__ void store_c(float* dst, double v) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(v));
    *dst = r;
}

constexpr double kOzMaxFinite = 1.7976931348623157e308;

// One element |x| (v) into a line's statistics: the largest (Inf and NaN make it +Inf: NaN fails
// the comparison) and the smallest nonzero. Both kernels that scale lines call it.
__device__ __forceinline__ void line_stat_add(double v, double& big, double& small) {
    big = v <= kOzMaxFinite ? fmax(big, v) : __longlong_as_double(0x7ff0000000000000ULL);
    if (v != 0.0 && v < small) small = v;
}

// The 'fast' scaling's w^2 of one element |x| (v) of a line with norm_bits - top = shift:
// w = ceil(v 2^shift), at least 1 where v != 0 (pyblasgemm.ozaki.split_fast's unit; w <= 2^20)
__device__ __forceinline__ unsigned long long norm_square(double v, int shift) {
    // exact: a power of two (a result below 1 may round, and ceil makes it 1 either way)
    double w = ceil(ldexp(v, shift));
    if (v != 0.0 && w < 1.0) w = 1.0;
    const unsigned long long u = (unsigned long long)w;
    return u * u;
}

// norm_bits - top of a line whose largest |x| is big (max < 2^top), or kNoNorm for a zero or
// non-finite line (no W: the first is not scaled, the second runs natively)
constexpr int kNoNorm = 1 << 30;
__device__ __forceinline__ int norm_shift(double big, int norm_bits) {
    int top = 0;
    if (!(big > 0.0 && big <= kOzMaxFinite)) return kNoNorm;
    frexp(big, &top);
    return norm_bits - top;
}

// One line's scaling from its statistics (ozaki_line_scale's rule, documented there): the
// exponent e, whether a nonzero element truncates to 0 (lost), the bits it keeps, and whether
// it is non-finite. norms: W of the line ('fast'), thresholds null otherwise.
struct LineScale {
    int e, lost, kept, non_finite;
};
__device__ __forceinline__ LineScale line_scale(double b, double smallest, unsigned long long w, int bits,
                                                const unsigned long long* __restrict__ thresholds,
                                                int n_thresholds, int j_low, int norm_bits) {
    LineScale s = {0, 0, 0, 0};
    if (!(b <= kOzMaxFinite)) {
        s.non_finite = 1;
    } else if (b > 0.0) {
        int top;
        frexp(b, &top);
        if (thresholds != nullptr) {
            int passed = 0;
            while (passed < n_thresholds && w <= thresholds[passed]) ++passed;
            s.e = norm_bits - top + (j_low - 1 + passed);
        } else {
            s.e = bits - top;
        }
        s.kept = s.e + top;
        s.lost = ldexp(smallest, s.e) < 1.0;
    }
    return s;
}

}  // namespace ozaki
}  // namespace pyblasgemm

// Lines of a strided matrix: line i, position t at x[i * s_line + t * s_k]. Block (32, 32):
// k_contig (s_k == 1): warp y walks line blockIdx.x * 32 + y with its lanes along t;
// else lane x takes line blockIdx.x * 32 + x and warp y the t = y, y + 32, ... (coalesced
// across lanes when s_line == 1).
// norms != nullptr (the 'fast' scaling): then a second walk over each line, with its top known
// (max < 2^top), sums w^2 with w = ceil(|x| 2^(norm_bits - top)), at least 1 where x != 0:
// pyblasgemm.ozaki.split_fast's W. Integers (w <= 2^20, W < 2^64: _norm_bits), summed in 64-bit
// integers, so the order of the sum cannot change W: the host's value. Non-finite and zero
// lines get W = 0 (the first runs natively, the second is not scaled).
template <typename T>
__global__ void __launch_bounds__(1024)
ozaki_line_stats(const T* __restrict__ x, long long lines, long long len, long long s_line,
                 long long s_k, int k_contig, double* __restrict__ biggest, double* __restrict__ smallest,
                 int norm_bits, unsigned long long* __restrict__ norms) {
    __shared__ double s_big[32][33];
    __shared__ double s_small[32][33];
    __shared__ unsigned long long s_norm[32][33];
    // norm_bits - top of each line (within +-1100: top is a double's exponent), kNoNorm: no W
    using pyblasgemm::ozaki::kNoNorm;
    __shared__ int s_shift[32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int slot = k_contig ? ty : tx;       // which of the block's 32 lines
    const int part = k_contig ? tx : ty;       // which of the 32 walkers of that line
    const long long line = (long long)blockIdx.x * 32 + slot;
    double big = 0.0, small = __longlong_as_double(0x7ff0000000000000ULL);   // +Inf
    if (line < lines) {
        const T* row = x + line * s_line;
        for (long long t = part; t < len; t += 32)                                 // Inf, NaN kept
            pyblasgemm::ozaki::line_stat_add(fabs(pyblasgemm::ozaki::to_double(row[t * s_k])), big, small);
    }
    s_big[slot][part] = big;
    s_small[slot][part] = small;
    __syncthreads();
    if (ty == 0) {          // 32 lanes reduce their line's 32 partials
        const long long mine = (long long)blockIdx.x * 32 + tx;
        double b = s_big[tx][0], s = s_small[tx][0];
        for (int i = 1; i < 32; ++i) {
            b = fmax(b, s_big[tx][i]);
            s = fmin(s, s_small[tx][i]);
        }
        if (mine < lines) {
            biggest[mine] = b;
            smallest[mine] = s;
        }
        s_shift[tx] = pyblasgemm::ozaki::norm_shift(b, norm_bits);
    }
    if (norms == nullptr) return;               // (the same for the whole block)
    __syncthreads();
    unsigned long long w2 = 0;
    const int shift = s_shift[slot];
    if (line < lines && shift != kNoNorm) {
        const T* row = x + line * s_line;
        for (long long t = part; t < len; t += 32)
            w2 += pyblasgemm::ozaki::norm_square(fabs(pyblasgemm::ozaki::to_double(row[t * s_k])), shift);
    }
    s_norm[slot][part] = w2;
    __syncthreads();
    if (ty == 0) {
        const long long mine = (long long)blockIdx.x * 32 + tx;
        unsigned long long total = 0;
        for (int i = 0; i < 32; ++i) total += s_norm[tx][i];
        if (mine < lines) norms[mine] = total;
    }
}

// Per line: exponent e = bits - top (biggest < 2^top; 0 for a zero line), lost = a nonzero
// element below 2^-e (it would truncate to 0); counts[0] += non-finite lines, counts[1] +=
// lost lines.
// The 'fast' scaling (norms != nullptr: ozaki_line_stats's W): e = norm_bits - top + j, j the
// largest integer with 4^j W <= Q, from pyblasgemm.ozaki.norm_thresholds (n_thresholds uint64,
// entry i = min(floor(Q / 4^(j_low + i)), 2^64 - 1)): j = j_low - 1 + the number of entries
// >= W. Exact: W is an integer below 2^64, so 4^j W <= Q iff W <= floor(Q / 4^j) (and where
// that is 2^64 or more, W <= 2^64 - 1 holds too); the test is monotone in j, so the entries
// that pass are a prefix. The table ends at j = MAX_BITS - norm_bits, which is the host's cap
// e <= MAX_BITS - top. line_bits (when given) = e + top, 0 for a zero or non-finite line.
extern "C" __global__ void ozaki_line_scale(const double* __restrict__ biggest,
                                            const double* __restrict__ smallest, long long lines,
                                            int bits, int* __restrict__ exps,
                                            unsigned char* __restrict__ lost, int* __restrict__ counts,
                                            const unsigned long long* __restrict__ norms,
                                            const unsigned long long* __restrict__ thresholds,
                                            int n_thresholds, int j_low, int norm_bits,
                                            int* __restrict__ line_bits) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= lines) return;
    const pyblasgemm::ozaki::LineScale sc = pyblasgemm::ozaki::line_scale(
        biggest[i], smallest[i], norms != nullptr ? norms[i] : 0ULL, bits, norms != nullptr ? thresholds : nullptr,
        n_thresholds, j_low, norm_bits);
    if (sc.non_finite) atomicAdd(counts, 1);
    exps[i] = sc.e;
    lost[i] = (unsigned char)sc.lost;
    if (line_bits != nullptr) line_bits[i] = sc.kept;
    if (sc.lost) atomicAdd(counts + 1, 1);
}

namespace pyblasgemm {
namespace ozaki {

// The guard's shifts of a line that keeps bits b (pyblasgemm.ozaki.guard_planes): the plane's
// top bits |q| >> (b - kOzGuardHiBits) and the sums' units 2^(b - kOzGuardSumBits), at least 0
__device__ __forceinline__ int guard_hi_shift(int b) { return max(b - kOzGuardHiBits, 0); }
__device__ __forceinline__ int guard_sum_shift(int b) { return max(b - kOzGuardSumBits, 0); }

}  // namespace ozaki
}  // namespace pyblasgemm

// trunc(x * 2^e[line]) mod each modulus, symmetric, int8: out[l][line][t] (plane l holds
// lines x row bytes: row >= len, the positions from len on written as zeros, so the moduli's
// GEMM reads 16-byte lines of whole rows without a packed copy). A 32-line x 128-position tile
// goes through shared memory, read along whichever of line / t is contiguous; each thread then
// takes 4 consecutive positions of a line and writes them as one 4-byte word per plane (a warp
// writes 128 contiguous bytes; bytes one by one where row is not a multiple of 4). Block
// (32, 8); grid.y walks the line tiles (its limit is 65535).
// guard (sums != nullptr): plane COUNT gets |q| >> shift_hi, and sums[line] gains the sum of
// (|q| >> shift_sum) + 1 over the nonzero elements (one 64-bit atomic per warp and tile row:
// integer sums, so their order cannot change the bits). line_bits != nullptr (the 'fast'
// scaling): the two shifts are each line's own, from its bits (guard_hi_shift, guard_sum_shift).
template <int COUNT, typename T>
__global__ void __launch_bounds__(256)
ozaki_residues(const T* __restrict__ x, long long lines, long long len, long long row, long long s_line,
               long long s_k, int k_contig, const int* __restrict__ exps,
               signed char* __restrict__ out, int shift_hi, int shift_sum,
               unsigned long long* __restrict__ sums, const int* __restrict__ line_bits) {
    using namespace pyblasgemm::ozaki;
    __shared__ double tile[32][129];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long t0 = (long long)blockIdx.x * 128;
    const long long plane = lines * row;
    const bool words = (row & 3) == 0;
    for (long long line0 = (long long)blockIdx.y * 32; line0 < lines; line0 += 32LL * gridDim.y) {
        __syncthreads();                        // the previous tile's readers are done
        if (k_contig) {                         // lanes along t: 32 x 8 B per warp and line
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const int r = ty + 8 * (i & 3), c = tx + 32 * (i >> 2);
                const long long line = line0 + r, t = t0 + c;
                tile[r][c] = (line < lines && t < len) ? to_double(x[line * s_line + t * s_k]) : 0.0;
            }
        } else {                                // lanes along lines
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const int c = ty + 8 * i;
                const long long line = line0 + tx, t = t0 + c;
                tile[tx][c] = (line < lines && t < len) ? to_double(x[line * s_line + t * s_k]) : 0.0;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = ty + 8 * i;
            const long long line = line0 + r, t = t0 + 4 * tx;
            const int lb = (line_bits != nullptr && line < lines) ? line_bits[line] : 0;
            const int sh_hi = line_bits != nullptr ? guard_hi_shift(lb) : shift_hi;
            const int sh_sum = line_bits != nullptr ? guard_sum_shift(lb) : shift_sum;
            if (sums != nullptr) {              // the whole warp takes part in the reduction
                unsigned long long part = 0;
                if (line < lines && t < len) {
                    const int e = exps[line];
                    for (int v = 0; v < 4 && t + v < len; ++v) {
                        const double xv = tile[r][4 * tx + v];
                        const long long qv = (long long)trunc(ldexp(xv, e));
                        const unsigned long long uv = qv < 0 ? (unsigned long long)(-qv) : (unsigned long long)qv;
                        if (xv != 0.0) part += (uv >> sh_sum) + 1;
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
                if (tx == 0 && line < lines && part != 0) atomicAdd(sums + line, part);
            }
            if (line >= lines || t >= row) continue;      // (x past len was read as 0)
            const int e = exps[line];
            long long q[4];
            unsigned long long u[4];
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                // |x * 2^e| < 2^bits <= 2^62: exact in double, and its integer part fits an int64
                q[v] = (long long)trunc(ldexp(tile[r][4 * tx + v], e));
                u[v] = q[v] < 0 ? (unsigned long long)(-q[v]) : (unsigned long long)q[v];
            }
            signed char* dst = out + line * row + t;
            if (sums != nullptr) {              // the guard's plane: the top 7 bits, 0..127
                unsigned word = 0;
#pragma unroll
                for (int v = 0; v < 4; ++v) word |= (unsigned)(u[v] >> sh_hi) << (8 * v);
                if (words && t + 3 < row) {
                    *reinterpret_cast<unsigned*>(dst + COUNT * plane) = word;
                } else {
                    for (int v = 0; v < 4 && t + v < row; ++v) dst[COUNT * plane + v] = (signed char)(u[v] >> sh_hi);
                }
            }
#pragma unroll
            for (int l = 0; l < COUNT; ++l) {
                const int p = kOzMod[l];
                unsigned word = 0;
                signed char b[4];
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const int r_ = (int)mod_u62(u[v], l);
                    int s = (q[v] < 0 && r_ != 0) ? p - r_ : r_;         // q mod p in [0, p)
                    if (s > p / 2 - (p % 2 == 0)) s -= p;                // 256: 128.. -> -128..
                    b[v] = (signed char)s;
                    word |= (unsigned)(unsigned char)s << (8 * v);
                }
                if (words && t + 3 < row) {
                    *reinterpret_cast<unsigned*>(dst + l * plane) = word;
                } else {
                    for (int v = 0; v < 4 && t + v < row; ++v) dst[l * plane + v] = b[v];
                }
            }
        }
    }
}

// The residue pass by tiles (ozaki_residues_pipe): the same bytes as ozaki_residues
// from fewer instructions. ozaki_residues spends ~13 integer instructions per element and
// modulus (mod_u62's four digits, Barrett, the sign, the symmetric range): ~28 G of them at
// 8192^2 x 2 operands x 16 moduli, on the 64-lane integer pipe, 2.0 ms on an H200 against the
// 1.05 ms its 3.4 GB take at 3.2 TB/s. Here each element's q = trunc(x 2^e) is split once into
// q = a 2^28 + b (doubles, exact: |a| < 2^34, |b| <= 2^27) and each modulus costs two DFMA, one
// DADD, one IMAD and 3/4 of a PRMT (residue_byte).
namespace pyblasgemm {
namespace ozaki {

// 1.5 * 2^52: m + y for |y| < 2^51 is a double of exponent 52 whose low 32 bits hold y mod 2^32
// (two's complement), and fma(x, y, m) - m = rint(x y) while |x y| < 2^51
constexpr double kRoundMagic = 6755399441055744.0;

// q = a 2^28 + b with a = rint(q 2^-28): both exact (q 2^-28 is exact, |q| < 2^62)
__device__ __forceinline__ void split28(double q, double& a, double& b) {
    a = __dsub_rn(__fma_rn(q, 3.7252902984619140625e-09, kRoundMagic), kRoundMagic);
    b = __fma_rn(-a, 268435456.0, q);
}

// The symmetric residue of q = a 2^28 + b modulo p_l (ozaki_residues's byte) in the low byte:
// v = a (2^28 mod p) + b is q mod p's class and exact (|v| < 2^34 * 255 + 2^27 < 2^43); k =
// rint(v / p) from v * fl(1/p), whose error |v| 2^-53 / p < 2^-10 / p cannot cross a half
// integer (v / p is at least 1 / (2p) away from one for odd p); so v - k p is the residue in
// [-(p-1)/2, (p-1)/2], which is ozaki_residues's symmetric range for odd p. p = 256: the low
// byte of v - 256 k is v's, q mod 256's byte either way. The low 32 bits of v and k come from
// m + v and m + k (kRoundMagic): one IMAD, wrapping mod 2^32, gives the byte.
__device__ __forceinline__ unsigned residue_byte(double a, double b, int l) {
    const double v = __fma_rn(a, kOzPow28d[l], b);
    const double k = __fma_rn(v, kOzInvMod[l], kRoundMagic);
    const double w = __dadd_rn(v, kRoundMagic);
    return (unsigned)__double2loint(w) - (unsigned)__double2loint(k) * (unsigned)kOzMod[l];
}

// ozaki_residues's byte of q (u = |q|) modulo p_l, its steps: any q the conversion gave (the
// tile kernel's path for |q| >= 2^62, Inf and NaN, which only lines the host runs natively hold)
__device__ __forceinline__ unsigned residue_byte_wide(long long q, unsigned long long u, int l) {
    const int p = kOzMod[l];
    const int r_ = (int)mod_u62(u, l);
    int s = (q < 0 && r_ != 0) ? p - r_ : r_;
    if (s > p / 2 - (p % 2 == 0)) s -= p;
    return (unsigned)(unsigned char)s;
}

// 4 low bytes into one word, byte v of the word from w[v]
__device__ __forceinline__ unsigned pack4(unsigned w0, unsigned w1, unsigned w2, unsigned w3) {
    return __byte_perm(__byte_perm(w0, w1, 0x0040), __byte_perm(w2, w3, 0x0040), 0x5410);
}

// V bytes of one plane as one store (V = 16: uint4, 8: uint2); dst is V-byte aligned
template <int V>
__device__ __forceinline__ void store_bytes(signed char* dst, const unsigned (&w)[V / 4]) {
    if (V == 16) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3 % (V / 4)]);
    } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1 % (V / 4)]);
    }
}

// A tile of 128 positions t by 2V lines (256 threads, V consecutive positions of one line each).
// Shared memory holds it as doubles, line r at r * kStride, position p at slot(p) = p + (p / V)
// (V / 8) (2 pads per 16): with an odd kStride (145) the three access patterns are free of bank
// conflicts beyond the two wavefronts a warp's 8-byte accesses need: the fill along t (k_contig:
// 32 consecutive p of one line), the fill along lines (32 lines, one p: r * 145 = r mod 16 bank
// pairs) and the threads' reads (V = 16: 8 chunks of 2 lines per half-warp, 2c + r mod 16; V = 8:
// 16 chunks of one line, 9c mod 16).
template <int V>
struct ResidueTile {
    static constexpr int kThreads = 256;
    static constexpr int kPositions = 128;
    static constexpr int kChunks = kPositions / V;          // threads per line
    static constexpr int kLines = kThreads / kChunks;       // 2 V
    static constexpr int kStride = kPositions + 16 + 1;
    static __device__ __forceinline__ int slot(int p) { return p + (p / V) * (V / 8); }
};

// A thread's V elements (load(v): element v as a double, e: the line's exponent): q split
// into a, b (split28); with the guard (guard true) its plane's words (hi, ozaki_residues's
// expression) and the line sum's part. Returns whether an element left the split's range
// (|q| >= 2^62, Inf, NaN): then residue_planes_wide writes the thread's planes.
template <int V, typename Load>
__device__ __forceinline__ bool split_elements(Load load, int e, bool guard, int shift_hi, int shift_sum,
                                               double (&a)[V], double (&b)[V], unsigned (&hi)[V / 4],
                                               unsigned long long& part) {
    bool wide = false;
#pragma unroll
    for (int v = 0; v < V; ++v) {
        const double xv = load(v);
        // |x * 2^e| < 2^bits <= 2^62: exact in double, and its integer part fits an int64
        const double qd = trunc(ldexp(xv, e));
        wide = wide || !(fabs(qd) < 4611686018427387904.0);                // 2^62
        if (guard) {
            const long long q = (long long)qd;
            const unsigned long long u = q < 0 ? (unsigned long long)(-q) : (unsigned long long)q;
            if (xv != 0.0) part += (u >> shift_sum) + 1;
            hi[v / 4] |= (unsigned)(u >> shift_hi) << (8 * (v % 4));       // ozaki_residues's word
        }
        split28(qd, a[v], b[v]);
    }
    return wide;
}

// Every modulus' V bytes from the split elements, one store a plane (plane: a plane's bytes).
// Not unrolled: unrolled, ptxas interleaved several planes and spilled (168 bytes at V = 16,
// 16 moduli); rolled, the three constants are loads a plane (LDC). The count is hidden from
// the compiler (an empty asm), which otherwise straightened the one-plane loop and spilled
// 24 bytes at V = 16.
template <int COUNT, int V>
__device__ __forceinline__ void residue_planes(const double (&a)[V], const double (&b)[V], signed char* dst,
                                               long long plane) {
    int count = COUNT;
    asm("" : "+r"(count));
#pragma unroll 1
    for (int l = 0; l < count; ++l) {
        unsigned w[V / 4];
#pragma unroll
        for (int g = 0; g < V / 4; ++g) {
            w[g] = pack4(residue_byte(a[4 * g], b[4 * g], l), residue_byte(a[4 * g + 1], b[4 * g + 1], l),
                         residue_byte(a[4 * g + 2], b[4 * g + 2], l), residue_byte(a[4 * g + 3], b[4 * g + 3], l));
        }
        store_bytes<V>(dst + l * plane, w);
    }
}

// The same planes by ozaki_residues's steps (residue_byte_wide), the elements loaded again
template <int COUNT, int V, typename Load>
__device__ __forceinline__ void residue_planes_wide(Load load, int e, signed char* dst, long long plane) {
#pragma unroll 1
    for (int l = 0; l < COUNT; ++l) {
        unsigned w[V / 4] = {};
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const long long q = (long long)trunc(ldexp(load(v), e));
            const unsigned long long u = q < 0 ? (unsigned long long)(-q) : (unsigned long long)q;
            w[v / 4] |= residue_byte_wide(q, u, l) << (8 * (v % 4));
        }
        store_bytes<V>(dst + l * plane, w);
    }
}

// cp.async of one element (4 or 8 bytes, .ca: the only sizes below 16 bytes), zero-filled
// where in is false (no bytes read)
template <typename T>
__device__ __forceinline__ void copy_element_async(T* smem, const T* gmem, bool in) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"((int)sizeof(T)),
                 "r"(in ? (int)sizeof(T) : 0)
                 : "memory");
}

}  // namespace ozaki
}  // namespace pyblasgemm

// ozaki_residues's output, bit for bit (planes, the guard's plane, the line sums), where row % V
// == 0 and out is 16-byte aligned (the host's residues_kernel_applies): block 256, a persistent
// grid (the host launches the blocks that fit at once) walking the tiles (t fastest). Each tile
// arrives by cp.async (one element a copy, coalesced along whichever of line / t is contiguous,
// zero-filled past the edges) into shared memory of the operand's own type; each thread reads its
// V elements and splits them (split_elements), and only then, after a barrier, the next tile's
// copies are issued into the same buffer, in flight while this tile's planes are written: V
// bytes of every plane as one store (a warp: 128 contiguous bytes of 4 lines at V = 16, of 2 at
// V = 8). A thread holding an element with |q| >= 2^62 (or Inf / NaN) takes ozaki_residues's
// steps for all of its V (residue_planes_wide), its elements loaded again from global memory.
// The guard's sums: one atomic per line and tile. Launch bounds: V = 16 keeps 2 x 16 doubles (a,
// b) live: 2 blocks of 256 (128 registers). Measured against a one-block-a-tile version (loads
// into registers, then shared memory): 1.07 against 1.16 ms at V = 16, 1.17 against 1.21 at V = 8
// (H200, A and B at 8192^2, 16 moduli + guard; bench/results/ozaki_passes_h200_2026-11-28_8f9dd54.json).
template <int COUNT, typename T, int V>
__global__ void __launch_bounds__(256, V == 16 ? 2 : 3)
ozaki_residues_pipe(const T* __restrict__ x, long long lines, long long len, long long row, long long s_line,
                    long long s_k, int k_contig, const int* __restrict__ exps,
                    signed char* __restrict__ out, int shift_hi, int shift_sum,
                    unsigned long long* __restrict__ sums, const int* __restrict__ line_bits) {
    using namespace pyblasgemm::ozaki;
    using Tile = ResidueTile<V>;
    static_assert(V == 8 || V == 16, "V: 8 or 16 positions a thread");
    __shared__ T tile[Tile::kLines * Tile::kStride];
    const int tid = threadIdx.x;
    const int c = tid % Tile::kChunks, r = tid / Tile::kChunks;
    const long long plane = lines * row;       // row >= len: positions from len on read as 0
    const long long tiles_t = (row + Tile::kPositions - 1) / Tile::kPositions;
    const long long tiles = tiles_t * ((lines + Tile::kLines - 1) / Tile::kLines);
    auto issue = [&](long long id) {            // the copies of tile id, committed as one group
        const long long line0 = (id / tiles_t) * Tile::kLines, t0 = (id % tiles_t) * Tile::kPositions;
        if (k_contig) {
            constexpr int kPass = Tile::kThreads / Tile::kPositions;
            const int rr = tid / Tile::kPositions, pp = tid % Tile::kPositions;
            const long long t = t0 + pp;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                const long long line = line0 + rr + kPass * i;
                const bool in = line < lines && t < len;
                copy_element_async(&tile[(rr + kPass * i) * Tile::kStride + Tile::slot(pp)],
                                   in ? x + line * s_line + t : x, in);
            }
        } else {
            constexpr int kPass = Tile::kThreads / Tile::kLines;
            const int rr = tid % Tile::kLines, pp = tid / Tile::kLines;
            const long long line = line0 + rr;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                const long long t = t0 + pp + kPass * i;
                const bool in = line < lines && t < len;
                copy_element_async(&tile[rr * Tile::kStride + Tile::slot(pp + kPass * i)],
                                   in ? x + line * s_line + t * s_k : x, in);
            }
        }
        pyblasgemm::cp_async_commit();
    };
    if ((long long)blockIdx.x < tiles) issue(blockIdx.x);
    for (long long id = blockIdx.x; id < tiles; id += gridDim.x) {
        pyblasgemm::cp_async_wait<0>();
        __syncthreads();                        // tile id is in shared memory
        const long long line = (id / tiles_t) * Tile::kLines + r, t = (id % tiles_t) * Tile::kPositions + (long long)V * c;
        const bool mine = line < lines && t < row;          // row % V == 0: all V positions
        const int e = mine ? exps[line] : 0;
        // the guard's shifts: the line's own ('fast': line_bits) or the call's
        const int lb = (line_bits != nullptr && line < lines) ? line_bits[line] : 0;
        const int sh_hi = line_bits != nullptr ? guard_hi_shift(lb) : shift_hi;
        const int sh_sum = line_bits != nullptr ? guard_sum_shift(lb) : shift_sum;
        const T* src = tile + r * Tile::kStride + Tile::slot(V * c);
        double a[V], b[V];
        unsigned hi[V / 4] = {};
        unsigned long long part = 0;
        const bool wide = split_elements<V>([&](int v) { return to_double(src[v]); }, e, sums != nullptr, sh_hi,
                                            sh_sum, a, b, hi, part);
        __syncthreads();                        // every thread has read its elements
        if (id + gridDim.x < tiles) issue(id + gridDim.x);
        if (sums != nullptr) {
#pragma unroll
            for (int o = Tile::kChunks / 2; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            if (c == 0 && line < lines && part != 0) atomicAdd(sums + line, part);
        }
        if (!mine) continue;
        signed char* dst = out + line * row + t;
        if (sums != nullptr) store_bytes<V>(dst + COUNT * plane, hi);
        if (!wide) residue_planes<COUNT, V>(a, b, dst, plane);
        else residue_planes_wide<COUNT, V>(
            [&](int v) { return t + v < len ? to_double(x[line * s_line + (t + v) * s_k]) : 0.0; }, e, dst, plane);
    }
}

// Scaling and residues in one pass (#34, item 1b): ozaki_line_stats, ozaki_line_scale and
// ozaki_residues_pipe's outputs, bit for bit, from one read of the operand. The two-pass route
// reads each operand twice (three times with the 'fast' scaling's norms) because a line's
// residues need its largest element first. Here L lines (a line contiguous in memory: L = 1;
// strided lines: L = kScaleLines, whose neighbours make 64 contiguous bytes a position) stay on
// chip between the statistics and the residues: CTA q of a cluster of Q holds positions
// [q chunk, (q + 1) chunk) of them in shared memory (as the operand's type), so a cluster holds
// whole lines of up to Q chunk positions (the host's ozaki_kernels.one_pass_shape picks L, Q
// and chunk: one CTA a contiguous line of up to 12,288 doubles at two CTAs an SM). The steps,
// with no early return (every CTA takes every cluster barrier):
//   1. cp.async of the CTA's part, zeros past len and past the lines (coalesced along
//      whichever of line / position is contiguous);
//   2. each line's largest and smallest nonzero |x| over the CTA's part; the cluster's CTAs
//      read each other's through distributed shared memory (mapa + ld.shared::cluster) and
//      combine them in the same order, so all hold the same values;
//   3. 'fast' only: W over the part from the same shared memory (no second read of DRAM),
//      summed across the cluster in 64-bit integers (the order cannot change W);
//   4. line_scale (ozaki_line_scale's rule): CTA 0 of the cluster writes exps, lost, line_bits
//      and counts; every CTA then writes the residue planes of its positions as
//      ozaki_residues_pipe does (V positions a thread, one V-byte store a plane, the guard's
//      plane and the line sums), from shared memory.
// Shared memory: line r at r * stride, position p at p + 2 (p / 16) (two pads per 16, stride =
// chunk 9/8 + 1, odd in doubles): the fills and the group's reads stay at two wavefronts a warp
// (the strided fill spreads a warp's four positions 4 apart in a 16-block for that).
namespace pyblasgemm {
namespace ozaki {

constexpr int kScaleLines = 8;
constexpr int kScaleThreads = 256;

__device__ __forceinline__ int scale_slot(int p) { return p + 2 * (p / 16); }

// the rank of this CTA in its cluster, and the cluster's barriers (all threads of all CTAs);
// arrive.release / wait.acquire order the shared-memory writes before the other CTAs' reads
__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
#else
    return 0;
#endif
}
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// A 64-bit word at the same shared-memory address in CTA `rank` of the cluster
__device__ __forceinline__ unsigned long long cluster_load_u64(const void* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    unsigned long long v;
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
    asm volatile("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %1, %2;\n"
                 "ld.shared::cluster.u64 %0, [remote];\n}\n" : "=l"(v) : "r"(addr), "r"(rank) : "memory");
    return v;
#else
    return *static_cast<const unsigned long long*>(local);
#endif
}

}  // namespace ozaki
}  // namespace pyblasgemm

template <int COUNT, typename T, int V, int L, int Q>
__device__ __forceinline__ void ozaki_scale_residues_body(
        const T* __restrict__ x, long long lines, long long len, long long row, long long s_line, long long s_k,
        int k_contig, int chunk, int bits, int* __restrict__ exps, unsigned char* __restrict__ lost,
        int* __restrict__ counts, const unsigned long long* __restrict__ thresholds, int n_thresholds, int j_low,
        int norm_bits, int* __restrict__ line_bits, signed char* __restrict__ out, int shift_hi, int shift_sum,
        unsigned long long* __restrict__ sums) {
    using namespace pyblasgemm::ozaki;
    static_assert(V == 8 || V == 16, "V: 8 or 16 positions a thread");
    static_assert(L == 1 || L == kScaleLines, "L: one line a CTA, or a group of kScaleLines");
    // lanes of a warp on one line, warps on one line, and a thread's step between its V-groups
    constexpr int kLanes = L == 1 ? 32 : 8;
    constexpr int kLineWarps = L == 1 ? kScaleThreads / 32 : 4;
    constexpr int kStep = kLanes * kLineWarps;
    extern __shared__ __align__(16) unsigned char scale_smem[];
    T* tile = reinterpret_cast<T*>(scale_smem);
    // per line: the warps' partials, then the CTA's (read by the cluster), then the line's scale
    __shared__ double s_big[L][kLineWarps], s_small[L][kLineWarps];
    __shared__ unsigned long long s_norm[L][kLineWarps];
    __shared__ unsigned long long c_big[L], c_small[L], c_norm[L];     // doubles as their bits
    __shared__ int s_shift[L], s_e[L], s_kept[L];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int stride = chunk + chunk / 8 + 1;
    const unsigned rank = Q > 1 ? cluster_rank() : 0u;
    const long long line0 = (long long)(blockIdx.x / Q) * L;
    const long long p0 = (long long)rank * chunk;                        // this CTA's first position

    // 1. the CTA's part of the group into shared memory
    if (k_contig) {                         // a warp: 32 consecutive positions of one line
        for (int i = tid; i < L * chunk; i += kScaleThreads) {
            const int r = i / chunk, p = i % chunk;
            const long long line = line0 + r, t = p0 + p;
            const bool in = line < lines && t < len;
            copy_element_async(&tile[r * stride + scale_slot(p)], in ? x + line * s_line + t : x, in);
        }
    } else {                                // a warp: 8 lines x 4 positions, 4 apart in a 16-block
        for (int i = tid; i < L * chunk; i += kScaleThreads) {
            const int r = i % L, q = i / L;                      // q: 4 consecutive per warp
            const int p = (q & ~15) | (((q >> 2) & 3) + 4 * (q & 3));
            const long long line = line0 + r, t = p0 + p;
            const bool in = line < lines && t < len;
            copy_element_async(&tile[r * stride + scale_slot(p)], in ? x + line * s_line + t * s_k : x, in);
        }
    }
    pyblasgemm::cp_async_commit();
    pyblasgemm::cp_async_wait<0>();
    __syncthreads();

    // a thread's line and its V-position groups. A group of 8: warp w takes lines 4 (w % 2) ..
    // + 3, 8 lanes a line, the groups (w / 2) 8 + lane % 8 + 32 i (a warp's stores: 4 runs of 8
    // V bytes). One line: thread t the groups t + 256 i (a warp's stores: 32 V bytes in a run).
    const int r = L == 1 ? 0 : (warp % 2) * 4 + lane / 8;
    const int c0 = L == 1 ? tid : (warp / 2) * 8 + lane % 8;
    const int slot_of_warp = L == 1 ? warp : warp / 2;
    const int groups = chunk / V;
    const T* my = tile + r * stride;

    // 2. the largest and the smallest nonzero |x| of each line
    double big = 0.0, small = __longlong_as_double(0x7ff0000000000000ULL);
    for (int c = c0; c < groups; c += kStep) {
#pragma unroll
        for (int v = 0; v < V; ++v) line_stat_add(fabs(to_double(my[scale_slot(V * c + v)])), big, small);
    }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) {
        big = fmax(big, __shfl_xor_sync(0xffffffffu, big, o));
        small = fmin(small, __shfl_xor_sync(0xffffffffu, small, o));
    }
    if (lane % kLanes == 0) {
        s_big[r][slot_of_warp] = big;
        s_small[r][slot_of_warp] = small;
    }
    __syncthreads();
    if (tid < L) {
        double b = s_big[tid][0], s = s_small[tid][0];
#pragma unroll
        for (int i = 1; i < kLineWarps; ++i) {
            b = fmax(b, s_big[tid][i]);
            s = fmin(s, s_small[tid][i]);
        }
        c_big[tid] = __double_as_longlong(b);
        c_small[tid] = __double_as_longlong(s);
    }
    if (Q > 1) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
    // CTA q's word at the same address (Q = 1: this CTA's own)
    auto shared_of = [](const unsigned long long* word, int q) { return Q > 1 ? cluster_load_u64(word, q) : *word; };
    double line_big = 0.0, line_small = 0.0;
    if (tid < L) {                          // every CTA combines the cluster's in rank order
        line_big = __longlong_as_double(shared_of(&c_big[tid], 0));
        line_small = __longlong_as_double(shared_of(&c_small[tid], 0));
        for (int q = 1; q < Q; ++q) {
            line_big = fmax(line_big, __longlong_as_double(shared_of(&c_big[tid], q)));
            line_small = fmin(line_small, __longlong_as_double(shared_of(&c_small[tid], q)));
        }
        s_shift[tid] = norm_shift(line_big, norm_bits);
    }

    // 3. 'fast': the line's W from the same shared memory
    unsigned long long w = 0;
    if (thresholds != nullptr) {
        __syncthreads();
        const int shift = s_shift[r];
        unsigned long long part = 0;
        if (shift != kNoNorm) {
            for (int c = c0; c < groups; c += kStep) {
#pragma unroll
                for (int v = 0; v < V; ++v) part += norm_square(fabs(to_double(my[scale_slot(V * c + v)])), shift);
            }
        }
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
        if (lane % kLanes == 0) s_norm[r][slot_of_warp] = part;
        __syncthreads();
        if (tid < L) {
            unsigned long long total = 0;
#pragma unroll
            for (int i = 0; i < kLineWarps; ++i) total += s_norm[tid][i];
            c_norm[tid] = total;
        }
        if (Q > 1) {
            cluster_arrive();
            cluster_wait();
        } else {
            __syncthreads();
        }
        if (tid < L) {
            for (int q = 0; q < Q; ++q) w += shared_of(&c_norm[tid], q);
        }
    }
    // the other CTAs may leave (or nothing more is read remotely) once every CTA is past here
    if (Q > 1) cluster_arrive();

    // 4. the line's scale, then the residues of this CTA's positions
    if (tid < L) {
        const LineScale sc = line_scale(line_big, line_small, w, bits, thresholds, n_thresholds, j_low, norm_bits);
        s_e[tid] = sc.e;
        s_kept[tid] = sc.kept;
        const long long line = line0 + tid;
        if (rank == 0 && line < lines) {
            exps[line] = sc.e;
            lost[line] = (unsigned char)sc.lost;
            if (line_bits != nullptr) line_bits[line] = sc.kept;
            if (sc.non_finite) atomicAdd(counts, 1);
            if (sc.lost) atomicAdd(counts + 1, 1);
        }
    }
    __syncthreads();
    const long long line = line0 + r;
    const long long plane = lines * row;
    const long long end = p0 + chunk < row ? p0 + chunk : row;        // row % V == 0: whole groups
    const int e = s_e[r];
    const int sh_hi = line_bits != nullptr ? guard_hi_shift(s_kept[r]) : shift_hi;
    const int sh_sum = line_bits != nullptr ? guard_sum_shift(s_kept[r]) : shift_sum;
    for (int c = c0; c < groups; c += kStep) {
        const long long t = p0 + (long long)V * c;
        const T* src = my + scale_slot(V * c);        // V consecutive positions: one 16-block
        double a[V], b[V];
        unsigned hi[V / 4] = {};
        unsigned long long part = 0;
        const bool wide = split_elements<V>([&](int v) { return to_double(src[v]); }, e, sums != nullptr, sh_hi,
                                            sh_sum, a, b, hi, part);
        if (sums != nullptr) {
#pragma unroll
            for (int o = kLanes / 2; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            if (lane % kLanes == 0 && line < lines && part != 0) atomicAdd(sums + line, part);
        }
        if (line >= lines || t >= end) continue;
        signed char* dst = out + line * row + t;
        if (sums != nullptr) store_bytes<V>(dst + COUNT * plane, hi);
        if (!wide) residue_planes<COUNT, V>(a, b, dst, plane);
        else residue_planes_wide<COUNT, V>([&](int v) { return to_double(src[v]); }, e, dst, plane);
    }
    if (Q > 1) cluster_wait();
}

// One CTA a line group of L lines (Q = 1: lines of up to chunk positions), on any architecture
template <int COUNT, typename T, int V, int L>
__global__ void __launch_bounds__(pyblasgemm::ozaki::kScaleThreads, 2)
ozaki_scale_residues(const T* __restrict__ x, long long lines, long long len, long long row, long long s_line,
                     long long s_k, int k_contig, int chunk, int bits, int* __restrict__ exps,
                     unsigned char* __restrict__ lost, int* __restrict__ counts,
                     const unsigned long long* __restrict__ thresholds, int n_thresholds, int j_low, int norm_bits,
                     int* __restrict__ line_bits, signed char* __restrict__ out, int shift_hi, int shift_sum,
                     unsigned long long* __restrict__ sums) {
    ozaki_scale_residues_body<COUNT, T, V, L, 1>(x, lines, len, row, s_line, s_k, k_contig, chunk, bits, exps, lost,
                                              counts, thresholds, n_thresholds, j_low, norm_bits, line_bits, out,
                                              shift_hi, shift_sum, sums);
}

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
// Clusters of Q CTAs a line group (Hopper): lines of up to Q chunk positions
template <int COUNT, typename T, int V, int L, int Q>
__global__ void __cluster_dims__(Q, 1, 1) __launch_bounds__(pyblasgemm::ozaki::kScaleThreads, 2)
ozaki_scale_residues_cluster(const T* __restrict__ x, long long lines, long long len, long long row,
                             long long s_line, long long s_k, int k_contig, int chunk, int bits,
                             int* __restrict__ exps, unsigned char* __restrict__ lost, int* __restrict__ counts,
                             const unsigned long long* __restrict__ thresholds, int n_thresholds, int j_low,
                             int norm_bits, int* __restrict__ line_bits, signed char* __restrict__ out,
                             int shift_hi, int shift_sum, unsigned long long* __restrict__ sums) {
    ozaki_scale_residues_body<COUNT, T, V, L, Q>(x, lines, len, row, s_line, s_k, k_contig, chunk, bits, exps, lost,
                                              counts, thresholds, n_thresholds, j_low, norm_bits, line_bits, out,
                                              shift_hi, shift_sum, sums);
}
#endif

// One element of the exact product from its COUNT residue products (int32, any sign): the
// integer X in (-P/2, P/2) as float64 (pyblasgemm.ozaki.reconstruct's steps, in its order):
// S_j = sum_l u_l * M_j[l] with u_l = (r_l * y_l) mod p_l (39-bit chunks keep every product and
// sum exact), q = rint(S_1 / P), X = D_1 + D_2 + ... with D_j = S_j - q P_j (exact).
// The floating-point steps are crt_add and crt_finish, which both reconstruction kernels call:
// their bits cannot differ.
namespace pyblasgemm {
namespace ozaki {

// s_j += u_l M_j[l]: one fused multiply-add; the product and the sum are both exact (see
// CRT_CHUNK_BITS), so it gives the host's separately rounded multiply and add bit for bit
__device__ __forceinline__ void crt_add(double (&s)[kOzChunks], double u, int l) {
#pragma unroll
    for (int j = 0; j < kOzChunks; ++j) s[j] = __fma_rn(u, kOzCrtM[l][j], s[j]);
}

// X from the chunk sums S_j: q = rint(S / P) from S to 53 bits (the quotient needs no more),
// then the chunks' differences D_j = S_j - q P_j summed in order
__device__ __forceinline__ double crt_finish(const double (&s)[kOzChunks]) {
    double whole = s[0];
#pragma unroll
    for (int j = 1; j < kOzChunks; ++j) whole = __dadd_rn(whole, s[j]);
    const double q = rint(__dmul_rn(whole, kOzCrtInvP));
    double x = __dsub_rn(s[0], __dmul_rn(q, kOzCrtP[0]));
#pragma unroll
    for (int j = 1; j < kOzChunks; ++j) x = __dadd_rn(x, __dsub_rn(s[j], __dmul_rn(q, kOzCrtP[j])));
    return x;
}

// u_l = (x y_l) mod p_l for any int32 x in ONE Barrett step (ozaki_value takes two and a sign
// fix-up; both give the one integer in [0, p_l), so the doubles built from it are the same):
// x = (h - 2^15) 2^16 + lo with h = (x >> 16) + 2^15 and lo = x & 0xffff, both in [0, 2^16),
// so x y = h (2^16 y) + lo y - 2^31 y, and with the tables' (2^16 y) mod p and (-2^31 y) mod p
// the sum stays below 2 * 65535 * 255 + 255 < 2^25, inside mod_wide's 2^30.
__device__ __forceinline__ unsigned crt_digit(unsigned h, unsigned lo, int l) {
    return mod_wide(h * kOzCrtY16[l] + lo * kOzCrtY[l] + kOzCrtYNeg31[l], l);
}

// An integer below 2^32 as a double, exactly: 2^52 + u holds u in its low mantissa bits, and
// one subtraction of 2^52 leaves it. One DADD instead of I2F.F64, a conversion that runs on a
// slower pipe than the FP64 adds (the programming guide's throughput table, sm_80 / sm_90).
__device__ __forceinline__ double u32_to_double(unsigned u) {
    return __dsub_rn(__hiloint2double(0x43300000, (int)u), 4503599627370496.0);
}

}  // namespace ozaki
}  // namespace pyblasgemm

template <int COUNT>
__device__ __forceinline__ double ozaki_value(const int* __restrict__ prod, long long plane) {
    using namespace pyblasgemm::ozaki;
    double s[kOzChunks];
#pragma unroll
    for (int j = 0; j < kOzChunks; ++j) s[j] = 0.0;
#pragma unroll
    for (int l = 0; l < COUNT; ++l) {
        const int x = prod[l * plane];
        int r = (int)mod_u32(x < 0 ? 0u - (unsigned)x : (unsigned)x, l);
        if (x < 0 && r != 0) r = kOzMod[l] - r;                       // x mod p in [0, p)
        const double u = (double)mod_wide((unsigned)r * kOzCrtY[l], l);
        crt_add(s, u, l);
    }
    return crt_finish(s);
}

// The same X from the digit planes of the Hopper int8 kernel's digit store (kEpiResidue: each
// plane already holds u_l = (x y_l) mod p_l, one byte): the CRT sum takes them as they are, so
// both give the same bits.
template <int COUNT>
__device__ __forceinline__ double ozaki_value(const unsigned char* __restrict__ digits, long long plane) {
    using namespace pyblasgemm::ozaki;
    double s[kOzChunks];
#pragma unroll
    for (int j = 0; j < kOzChunks; ++j) s[j] = 0.0;
#pragma unroll
    for (int l = 0; l < COUNT; ++l) crt_add(s, u32_to_double(digits[l * plane]), l);
    return crt_finish(s);
}

// Planes read together by ozaki_values4: all up to 16, else even batches of at most 16
// (17: 9 + 8; 34: 12 + 12 + 10), as 34 planes' int4 alone would take 136 registers.
template <int COUNT>
struct OzakiBatch {
    static constexpr int kBatches = (COUNT + 15) / 16;
    static constexpr int kPlanes = (COUNT + kBatches - 1) / kBatches;
};

// X of 4 consecutive rows of one column (ozaki_value's integers, ozaki_value's floating-point
// steps) from one 16-byte load per plane: col is the group's int4 in plane 0, plane4 a plane's
// length in int4. A batch's loads are all issued before its arithmetic (16 x 16 B in flight
// per thread: the pass is a stream of 4 bytes per plane and element, its latency hidden by
// bytes in flight). STAGE: through shared memory with cp.async (stage: this thread's column
// of the block's [kPlanes][128] int4), which no scheduling can sink below the arithmetic; else
// straight into registers (__ldg), where ptxas placed the 16 loads among the arithmetic
// (sm_90a: ~100 instructions apart), not all first. Each thread reads back only the slots it
// copied, after its own cp.async.wait_group: no barrier.
template <int COUNT, bool STAGE>
__device__ __forceinline__ void ozaki_values4(const int4* __restrict__ col, long long plane4, double (&x)[4],
                                              int4* stage) {
    using namespace pyblasgemm::ozaki;
    constexpr int kBatch = OzakiBatch<COUNT>::kPlanes;
    double s[4][kOzChunks];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int j = 0; j < kOzChunks; ++j) s[e][j] = 0.0;
    }
#pragma unroll
    for (int l0 = 0; l0 < COUNT; l0 += kBatch) {
        int4 v[kBatch];
        if (STAGE) {
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                if (l0 + b < COUNT) pyblasgemm::SM80_CP_ASYNC_CG_16B_ZFILL::copy(stage + b * 128, col + (l0 + b) * plane4, 16);
            }
            pyblasgemm::cp_async_commit();
            pyblasgemm::cp_async_wait<0>();
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                if (l0 + b < COUNT) v[b] = stage[b * 128];
            }
        } else {
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                if (l0 + b < COUNT) v[b] = __ldg(col + (l0 + b) * plane4);
            }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int l = l0 + b;
            if (l >= COUNT) break;
            const int w[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const unsigned h = ((unsigned)w[e] >> 16) ^ 0x8000u;   // (x >> 16) + 2^15
                crt_add(s[e], u32_to_double(crt_digit(h, (unsigned)w[e] & 0xffffu, l)), l);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = crt_finish(s[e]);
}

// The same 4 rows from digit planes: one 4-byte load per plane (the 4 rows' digits), all of
// them issued first; the planes are a quarter of the int32 planes' bytes, no staging.
template <int COUNT, bool STAGE>
__device__ __forceinline__ void ozaki_values4(const unsigned* __restrict__ col, long long plane4, double (&x)[4],
                                              int4*) {
    using namespace pyblasgemm::ozaki;
    static_assert(!STAGE, "digit planes are read straight into registers");
    double s[4][kOzChunks];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int j = 0; j < kOzChunks; ++j) s[e][j] = 0.0;
    }
    unsigned v[COUNT];
#pragma unroll
    for (int l = 0; l < COUNT; ++l) v[l] = __ldg(col + l * plane4);
#pragma unroll
    for (int l = 0; l < COUNT; ++l) {
#pragma unroll
        for (int e = 0; e < 4; ++e) crt_add(s[e], u32_to_double((v[l] >> (8 * e)) & 0xffu), l);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = crt_finish(s[e]);
}

// C = alpha * 2^-(e_i + f_j) X_ij + beta * C (beta == 0: C not read) for the m x n result, the
// products column-major per plane (element (i, j) at i + j * m, plane = m * n_prod). CPLX: C
// is complex (interleaved), X's column j its real part and column n + j its imaginary part.
// TC: C's (real) type; the arithmetic is float64's either way (float: C read exactly, the
// result rounded once by store_c, as the host's float64 alpha and beta and one cast).
// Lines lost to the scaling (lost_a[i], lost_b[j]) are skipped: they are computed natively.
// flags: bit 0 = alpha is not 1, bit 1 = beta is not 0.
// The guard (sum_a != nullptr): plane COUNT holds L = sum hi(A') hi(B'); where sum_a[i] and
// sum_b[j] are nonzero and (sum_a[i] + sum_b[j]) * c_sum > L * c_hi (for either part of a
// complex element) the element is left alone and counted in *failed. bits_a / bits_b (the
// 'fast' scaling: each row's and column's bits, else nullptr): the per-line test instead
// (ozaki_guard_fails_lines, c_hi its unit).
__device__ __forceinline__ bool ozaki_guard_fails(unsigned long long sa, unsigned long long sb, int low,
                                                  double c_sum, double c_hi) {
    if (sa == 0 || sb == 0) return false;       // a zero line: no truncation error at all
    return __dmul_rn((double)(sa + sb), c_sum) > __dmul_rn((double)low, c_hi);
}

// The same test with each line's own bits (the 'fast' scaling: pyblasgemm.ozaki.guard_failures
// with bits_a / bits_b, its order of operations): sa 2^(ba - 16) + sb 2^(bb - 16) against
// low * unit * 2^((ba - 7) + (bb - 7)), unit = guard_unit (c_hi at shift 0). The sums are below
// 2^53 (GUARD_SUM_BITS), so their conversions are exact, as are the ldexp's (powers of two).
__device__ __forceinline__ bool ozaki_guard_fails_lines(unsigned long long sa, unsigned long long sb, int low,
                                                        int ba, int bb, double unit) {
    using namespace pyblasgemm::ozaki;
    if (sa == 0 || sb == 0) return false;
    const double lhs = __dadd_rn(ldexp((double)sa, guard_sum_shift(ba)), ldexp((double)sb, guard_sum_shift(bb)));
    return lhs > ldexp(__dmul_rn((double)low, unit), guard_hi_shift(ba) + guard_hi_shift(bb));
}

// Either test: per line (lines: the 'fast' scaling, ba / bb the two lines' bits, c_hi the
// unit) or with the call's constants
__device__ __forceinline__ bool ozaki_guard_verdict(unsigned long long sa, unsigned long long sb, int low,
                                                    double c_sum, double c_hi, bool lines, int ba, int bb) {
    return lines ? ozaki_guard_fails_lines(sa, sb, low, ba, bb, c_hi) : ozaki_guard_fails(sa, sb, low, c_sum, c_hi);
}

// The guard's test of element (i, j) (column jb of B's lines): per line where bits_a is given,
// else with the call's constants
__device__ __forceinline__ bool ozaki_guard_test(const unsigned long long* sum_a, const unsigned long long* sum_b,
                                                 long long i, long long jb, int low, double c_sum, double c_hi,
                                                 const int* bits_a, const int* bits_b) {
    const bool lines = bits_a != nullptr;
    return ozaki_guard_verdict(sum_a[i], sum_b[jb], low, c_sum, c_hi, lines, lines ? bits_a[i] : 0,
                               lines ? bits_b[jb] : 0);
}

// The guard's verdict before the moduli's GEMMs run: how many elements of C outside the lost
// lines fail (low: the guard plane's product, column-major m x n_prod; CPLX: both parts of
// element (i, j) at columns j and n + j). One atomic per warp. The host runs the whole
// product natively when most fail, instead of paying for the emulation first.
extern "C" __global__ void __launch_bounds__(256)
ozaki_guard_count(const int* __restrict__ low, long long m, long long n, int cplx,
                  const unsigned char* __restrict__ lost_a, const unsigned char* __restrict__ lost_b,
                  const unsigned long long* __restrict__ sum_a, const unsigned long long* __restrict__ sum_b,
                  double c_sum, double c_hi, int* __restrict__ failed, const int* __restrict__ bits_a,
                  const int* __restrict__ bits_b) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int fails = 0;
    if (i < m && !lost_a[i]) {
        for (long long j = blockIdx.y; j < n; j += gridDim.y) {
            if (lost_b[j]) continue;
            bool f = ozaki_guard_test(sum_a, sum_b, i, j, low[i + j * m], c_sum, c_hi, bits_a, bits_b);
            if (cplx) f = f || ozaki_guard_test(sum_a, sum_b, i, n + j, low[i + (n + j) * m], c_sum, c_hi, bits_a, bits_b);
            fails += f;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) fails += __shfl_xor_sync(0xffffffffu, fails, o);
    if ((threadIdx.x & 31) == 0 && fails) atomicAdd(failed, fails);
}

// C's element (i, j) at dst from X's parts (already scaled by 2^-(e_i + f_j)): alpha, beta
// and the one rounding to TC; both reconstruction kernels end in it.
template <bool CPLX, typename TC>
__device__ __forceinline__ void ozaki_store(TC* dst, double x_re, double x_im, double alpha_re, double alpha_im,
                                            double beta_re, double beta_im, int flags) {
    if (!CPLX) {
        double v = (flags & 1) ? __dmul_rn(x_re, alpha_re) : x_re;
        if (flags & 2) v = __dadd_rn(v, __dmul_rn(pyblasgemm::ozaki::to_double(dst[0]), beta_re));
        pyblasgemm::ozaki::store_c(dst, v);
    } else {
        double re = x_re, im = x_im;
        if (flags & 1) {        // NumPy's complex product: (ac - bd) + (ad + bc) i
            re = __dsub_rn(__dmul_rn(x_re, alpha_re), __dmul_rn(x_im, alpha_im));
            im = __dadd_rn(__dmul_rn(x_re, alpha_im), __dmul_rn(x_im, alpha_re));
        }
        if (flags & 2) {
            const double c_re = pyblasgemm::ozaki::to_double(dst[0]), c_im = pyblasgemm::ozaki::to_double(dst[1]);
            re = __dadd_rn(re, __dsub_rn(__dmul_rn(c_re, beta_re), __dmul_rn(c_im, beta_im)));
            im = __dadd_rn(im, __dadd_rn(__dmul_rn(c_re, beta_im), __dmul_rn(c_im, beta_re)));
        }
        pyblasgemm::ozaki::store_c(dst, re);
        pyblasgemm::ozaki::store_c(dst + 1, im);
    }
}

// The element kernel: one thread per row i (block 256 along the rows), one element per column
// it walks; any m and any alignment of prod (the fallback of ozaki_reconstruct_rows). TP: the
// planes' type, int (the int32 products) or unsigned char (the digit store's digits); low: the
// guard's int32 plane (m x n_prod; the int32 products' plane COUNT), read when sum_a is given.
template <int COUNT, bool CPLX, typename TC, typename TP>
__global__ void __launch_bounds__(256)
ozaki_reconstruct(const TP* __restrict__ prod, const int* __restrict__ low, long long m, long long n,
                  const int* __restrict__ ea,
                  const int* __restrict__ eb, const unsigned char* __restrict__ lost_a,
                  const unsigned char* __restrict__ lost_b, TC* __restrict__ c, long long cs_i,
                  long long cs_j, double alpha_re, double alpha_im, double beta_re, double beta_im,
                  int flags, const unsigned long long* __restrict__ sum_a,
                  const unsigned long long* __restrict__ sum_b, double c_sum, double c_hi,
                  int* __restrict__ failed, const int* __restrict__ bits_a, const int* __restrict__ bits_b) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m || lost_a[i]) return;
    for (long long j = blockIdx.y; j < n; j += gridDim.y) {
    if (lost_b[j]) continue;
    const long long n_prod = CPLX ? 2 * n : n, plane = m * n_prod;
    if (sum_a != nullptr) {
        bool fails = ozaki_guard_test(sum_a, sum_b, i, j, low[i + j * m], c_sum, c_hi, bits_a, bits_b);
        if (CPLX) fails = fails || ozaki_guard_test(sum_a, sum_b, i, n + j, low[i + (n + j) * m], c_sum, c_hi, bits_a,
                                                    bits_b);
        if (fails) {
            atomicAdd(failed, 1);
            continue;
        }
    }
    const int shift = -(ea[i] + eb[j]);
    double x_re = 0.0, x_im = 0.0;
    // the parts one after the other, not unrolled: unrolled, ptxas hoisted the imaginary part's
    // loads over the real part's arithmetic and spilled (sm_90a: 20 and 24 bytes at 29 and 30
    // moduli, capped at 128 registers; 226-240 registers at 31-34)
#pragma unroll 1
    for (int part = 0; part < (CPLX ? 2 : 1); ++part) {
        const double x = ldexp(ozaki_value<COUNT>(prod + i + (part ? j + n : j) * m, plane), shift);
        if (part) x_im = x;                     // constant indices: the parts stay in registers
        else x_re = x;
    }
    ozaki_store<CPLX>(c + i * cs_i + j * cs_j, x_re, x_im, alpha_re, alpha_im, beta_re, beta_im, flags);
    }
}

// The row kernel: ozaki_reconstruct's result, bit for bit (the same crt_add / crt_finish /
// ldexp / ozaki_store per element), with each thread taking rows 4t .. 4t + 3 of one column
// at a time and reading each plane's 4 int32 as one int4 (ozaki_values4). Needs m % 4 == 0 and
// prod 16-byte aligned, so that every column (at j m) and plane (at l m n_prod) starts on a
// 16-byte boundary: the host's one predicate (ozaki_kernels.rows_kernel_applies) checks both
// and otherwise launches ozaki_reconstruct. C is written element by element (any stride, any
// alignment: C's bytes are 1/8 (float64) of the planes' at 16 moduli). Block 128 (512 rows);
// grid.y walks the columns. Guard and lost lines as ozaki_reconstruct's, per element; a
// thread adds its failures to *failed in one atomic (a count: the total is the same).
// CPLX reads the real part's planes, then the imaginary part's, in a loop that is not
// unrolled: unrolled, ptxas hoisted the second part's loads over the first's arithmetic and
// spilled (255 registers and 16 bytes at 17 moduli, 1408 at 34). Launch bounds: 3 blocks of
// 128 per SM (170 registers; sm_90a used up to 152; at 4 blocks' 128 both spilled: the real
// kernel at 11 and 12 moduli, the complex one from 15 on).
// What one thread reads of a plane's 4 rows: an int4 of int32 products, a word of 4 digits.
template <typename TP> struct OzakiRows4 { typedef int4 type; };
template <> struct OzakiRows4<unsigned char> { typedef unsigned type; };

// TP and low as ozaki_reconstruct's: digit planes are read one 4-byte word (4 rows) a plane.
template <int COUNT, bool CPLX, typename TC, bool STAGE, typename TP>
__global__ void __launch_bounds__(128, 3)
ozaki_reconstruct_rows(const TP* __restrict__ prod, const int* __restrict__ low, long long m, long long n,
                       const int* __restrict__ ea,
                       const int* __restrict__ eb, const unsigned char* __restrict__ lost_a,
                       const unsigned char* __restrict__ lost_b, TC* __restrict__ c, long long cs_i,
                       long long cs_j, double alpha_re, double alpha_im, double beta_re, double beta_im,
                       int flags, const unsigned long long* __restrict__ sum_a,
                       const unsigned long long* __restrict__ sum_b, double c_sum, double c_hi,
                       int* __restrict__ failed, const int* __restrict__ bits_a, const int* __restrict__ bits_b) {
    // STAGE: 128 x kPlanes x 16 B (32 KB at 16 moduli; 3 blocks take 96 KB of an SM's 164-228)
    __shared__ int4 stage[STAGE ? OzakiBatch<COUNT>::kPlanes : 1][128];
    const long long i0 = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i0 >= m) return;                        // m % 4 == 0: rows i0 .. i0 + 3 all exist
    bool live[4];
    int e_row[4];
    bool any = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        live[e] = !lost_a[i0 + e];
        e_row[e] = ea[i0 + e];
        any = any || live[e];
    }
    if (!any) return;
    const long long m4 = m / 4, n_prod = CPLX ? 2 * n : n, plane4 = m4 * n_prod;
    // 4 rows of a plane: an int4 of int32 products, or a word of 4 digits
    typedef typename OzakiRows4<TP>::type Rows4;
    const Rows4* rows = reinterpret_cast<const Rows4*>(prod + i0);
    const int4* low4 = reinterpret_cast<const int4*>(low + i0);
    int fails = 0;
    for (long long j = blockIdx.y; j < n; j += gridDim.y) {
        if (lost_b[j]) continue;
        bool ok[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) ok[e] = live[e];
        if (sum_a != nullptr) {
            const int4 g = __ldg(low4 + j * m4);
            const int g_re[4] = {g.x, g.y, g.z, g.w};
            int g_im[4] = {0, 0, 0, 0};
            if (CPLX) {
                const int4 gi = __ldg(low4 + (n + j) * m4);
                g_im[0] = gi.x, g_im[1] = gi.y, g_im[2] = gi.z, g_im[3] = gi.w;
            }
            // the sums and ('fast') the lines' bits read where tested: held across the rows or
            // columns, the bits spilled the complex kernels (16 bytes, staged, at 14 moduli;
            // 12, digit planes, at 18)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (!ok[e]) continue;
                bool f = ozaki_guard_test(sum_a, sum_b, i0 + e, j, g_re[e], c_sum, c_hi, bits_a, bits_b);
                if (CPLX) f = f || ozaki_guard_test(sum_a, sum_b, i0 + e, n + j, g_im[e], c_sum, c_hi, bits_a, bits_b);
                if (f) {
                    ++fails;
                    ok[e] = false;
                }
            }
            if (!(ok[0] || ok[1] || ok[2] || ok[3])) continue;
        }
        double x_re[4], x_im[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll 1
        for (int part = 0; part < (CPLX ? 2 : 1); ++part) {
            double x[4];
            ozaki_values4<COUNT, STAGE>(rows + (part ? n + j : j) * m4, plane4, x, &stage[0][threadIdx.x]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {       // constant indices: the parts stay in registers
                if (part) x_im[e] = x[e];
                else x_re[e] = x[e];
            }
        }
        const int f_col = eb[j];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (!ok[e]) continue;
            const int shift = -(e_row[e] + f_col);
            ozaki_store<CPLX>(c + (i0 + e) * cs_i + j * cs_j, ldexp(x_re[e], shift),
                              CPLX ? ldexp(x_im[e], shift) : 0.0, alpha_re, alpha_im, beta_re, beta_im, flags);
        }
    }
    if (fails) atomicAdd(failed, fails);
}

// The digit planes' staged row kernel: ozaki_reconstruct's result, bit for bit, from the digit
// store's planes. A warp takes 512 rows of a column: lane t copies rows 16t .. 16t + 15 of
// every plane (16 digits, one 16-byte cp.async a plane) into shared memory (stage: [COUNT][64]
// uint4, 16 KB at 16 moduli, 34 KB at 34: blocks of 64 keep it and xs within the 48 KB of
// static shared memory), all issued before any arithmetic: 16 x 16 bytes in flight a thread,
// as the int32 planes' staged kernel keeps. The register row kernel (4 rows, one word a plane:
// 64 bytes a thread, 142 registers) moved 0.81 TB/s, the element kernel 1.09, the int32
// staged kernel 3.2 (H200, 8192^2, 16 moduli:
// bench/results/ozaki_passes_digits_h200_2026-11-29_f0ce588.json). Then lane t computes rows
// 32q + t (q = 0 .. 15), one at a time, from the warp's stage: the lanes' stage reads are 32
// consecutive bytes (no bank conflict; a lane's own 16 rows would be 4-way), and their guard
// reads and C stores consecutive rows. CPLX: the real part's X waits in shared memory (xs)
// while the imaginary part's planes are staged in the same slots. Needs m % 16 == 0 and
// 16-byte aligned planes (the host's rows_kernel_applies).
constexpr int kOzDigitsBlock = 64;

template <int COUNT, bool CPLX, typename TC>
__global__ void __launch_bounds__(kOzDigitsBlock, 6)
ozaki_reconstruct_digits16(const unsigned char* __restrict__ prod, const int* __restrict__ low, long long m,
                           long long n, const int* __restrict__ ea, const int* __restrict__ eb,
                           const unsigned char* __restrict__ lost_a, const unsigned char* __restrict__ lost_b,
                           TC* __restrict__ c, long long cs_i, long long cs_j, double alpha_re, double alpha_im,
                           double beta_re, double beta_im, int flags, const unsigned long long* __restrict__ sum_a,
                           const unsigned long long* __restrict__ sum_b, double c_sum, double c_hi,
                           int* __restrict__ failed, const int* __restrict__ bits_a,
                           const int* __restrict__ bits_b) {
    using namespace pyblasgemm::ozaki;
    __shared__ uint4 stage[COUNT][kOzDigitsBlock];
    __shared__ double xs[CPLX ? 16 : 1][kOzDigitsBlock];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long base = 512 * ((long long)blockIdx.x * (kOzDigitsBlock / 32) + warp);
    if (base >= m) return;                      // the whole warp: no lane takes part below
    const long long i_copy = base + 16 * lane;  // m % 16 == 0: rows i_copy .. + 15 all exist
    const bool copies = i_copy < m;
    unsigned live = 0;                          // bit q: row base + 32q + lane exists, not lost
#pragma unroll
    for (int q = 0; q < 16; ++q) {
        const long long i = base + 32 * q + lane;
        live |= (i < m && !lost_a[i]) ? 1u << q : 0u;
    }
    if (!__any_sync(0xffffffffu, live)) return;
    const long long m16 = m / 16, n_prod = CPLX ? 2 * n : n, plane16 = m16 * n_prod;
    const uint4* rows = reinterpret_cast<const uint4*>(prod + (copies ? i_copy : 0));
    // the warp's stage as bytes: plane l's digit of row base + r at l * 1024 + r
    const unsigned char* warp_stage = reinterpret_cast<const unsigned char*>(&stage[0][warp * 32]);
    int fails = 0;
    for (long long j = blockIdx.y; j < n; j += gridDim.y) {
        if (lost_b[j]) continue;                // the same for every thread
        unsigned ok = live;
        if (sum_a != nullptr) {
#pragma unroll 4
            for (int q = 0; q < 16; ++q) {
                if (!((ok >> q) & 1u)) continue;
                const long long i = base + 32 * q + lane;
                bool f = ozaki_guard_test(sum_a, sum_b, i, j, __ldg(low + i + j * m), c_sum, c_hi, bits_a, bits_b);
                if (CPLX) f = f || ozaki_guard_test(sum_a, sum_b, i, n + j, __ldg(low + i + (n + j) * m), c_sum, c_hi,
                                                    bits_a, bits_b);
                if (f) {
                    ++fails;
                    ok &= ~(1u << q);
                }
            }
        }
        if (!__any_sync(0xffffffffu, ok)) continue;     // the warp's lanes copy for each other
        const int f_col = eb[j];
#pragma unroll 1
        for (int part = 0; part < (CPLX ? 2 : 1); ++part) {
            if (copies) {
                const uint4* col = rows + (part ? n + j : j) * m16;
#pragma unroll
                for (int l = 0; l < COUNT; ++l)
                    pyblasgemm::SM80_CP_ASYNC_CG_16B_ZFILL::copy(&stage[l][threadIdx.x], col + l * plane16, 16);
            }
            pyblasgemm::cp_async_commit();
            pyblasgemm::cp_async_wait<0>();
            __syncwarp();                       // every lane's copies landed
#pragma unroll 1
            for (int q = 0; q < 16; ++q) {
                if (!((ok >> q) & 1u)) continue;
                const long long i = base + 32 * q + lane;
                double s[kOzChunks];
#pragma unroll
                for (int k = 0; k < kOzChunks; ++k) s[k] = 0.0;
#pragma unroll
                for (int l = 0; l < COUNT; ++l)
                    crt_add(s, u32_to_double(warp_stage[l * kOzDigitsBlock * 16 + 32 * q + lane]), l);
                const double x = ldexp(crt_finish(s), -(ea[i] + f_col));
                if (CPLX && part == 0) {
                    xs[q][threadIdx.x] = x;     // the real part, until the imaginary one is known
                } else {
                    ozaki_store<CPLX>(c + i * cs_i + j * cs_j, CPLX ? xs[q][threadIdx.x] : x, CPLX ? x : 0.0,
                                      alpha_re, alpha_im, beta_re, beta_im, flags);
                }
            }
            __syncwarp();                       // every lane read the stage before the next copies
        }
    }
    if (fails) atomicAdd(failed, fails);
}
