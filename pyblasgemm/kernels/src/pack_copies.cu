// pyblasgemm: the packing copies (kernels/pack.py). First the transposing pack of a 1-byte
// (int8) operand, for the Hopper int8 kernel, whose wgmma reads K-major operands only (no
// transpose bit for 8-bit types); then the pitched copy of 1-, 2- and 4-byte elements.
//
// in:  rows x cols, column-major, pitch ldi bytes (any), batch entries stride_in apart
// out: cols x rows, column-major, pitch ldo bytes (a multiple of 16: TMA's rule)
//
// One 64 x 64 byte tile per CTA of 16 x 16 threads, staged through shared memory so that both
// the reads (along in's columns) and the writes (along out's columns) touch consecutive bytes:
// 16 threads x 4 bytes = 64 contiguous bytes per row of the tile. The tile's rows are 68 bytes
// (17 words) apart, so reading a tile column costs at most 2-way bank conflicts (64: 16-way).

#define PYB_T_TILE 64
#define PYB_T_PITCH 68

extern "C" __global__ void __launch_bounds__(256)
pyb_transpose_b8(const unsigned char* __restrict__ in, long long ldi, long long stride_in,
                 unsigned char* __restrict__ out, long long ldo, long long stride_out,
                 int rows, int cols)
{
    __shared__ unsigned char tile[PYB_T_TILE * PYB_T_PITCH];
    in += (long long)blockIdx.z * stride_in;
    out += (long long)blockIdx.z * stride_out;
    const int r0 = blockIdx.x * PYB_T_TILE, c0 = blockIdx.y * PYB_T_TILE;
    const int tx = threadIdx.x, ty = threadIdx.y;         // 16 x 16
    // read: tile[j][i] = in[r0 + i, c0 + j], i = 4 tx .. 4 tx + 3
    for (int j = ty; j < PYB_T_TILE; j += 16) {
        const int c = c0 + j;
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = 4 * tx + q, r = r0 + i;
            tile[j * PYB_T_PITCH + i] = (c < cols && r < rows) ? in[r + (long long)c * ldi] : 0;
        }
    }
    __syncthreads();
    // write: out[c0 + i, r0 + j] = tile[i][j]  (out's column r0 + j is in's row r0 + j)
    for (int j = ty; j < PYB_T_TILE; j += 16) {
        const int r = r0 + j;
        if (r >= rows) continue;
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = 4 * tx + q, c = c0 + i;
            if (c < cols) out[c + (long long)r * ldo] = tile[i * PYB_T_PITCH + j];
        }
    }
}


// The pitched copy: in (rows x cols, column-major, pitch ldi elements, any) to out (pitch ldo,
// a multiple of 16 bytes). Blocks walk columns (grid y, strided); each thread loads UNROLL
// elements of a column, blockDim.x apart, before it stores them, so that four loads per thread
// are in flight and both sides coalesce whatever the pitches. (cudaMemcpy2DAsync with an odd
// source pitch reached 24-42 % of the H100's DRAM bandwidth, 10 % on 126-byte rows; this one
// 50-64 % from 32 MB: bench/results/pack_probe_h100_2026-11-24*.json.) Short columns leave
// most of its threads idle (12 % at 63 rows): those take the flat copy below.
#define PYB_COPY_UNROLL 4

template <typename T>
__device__ __forceinline__ void pyb_pitch_copy(const T* __restrict__ in, long long ldi,
                                               T* __restrict__ out, long long ldo, int rows,
                                               long long cols)
{
    const int step = gridDim.x * blockDim.x * PYB_COPY_UNROLL;
    for (long long c = blockIdx.y; c < cols; c += gridDim.y) {
        const T* src = in + c * ldi;
        T* dst = out + c * ldo;
        for (int r0 = blockIdx.x * blockDim.x * PYB_COPY_UNROLL + threadIdx.x; r0 < rows; r0 += step) {
            T v[PYB_COPY_UNROLL];
            #pragma unroll
            for (int u = 0; u < PYB_COPY_UNROLL; ++u) {
                const int r = r0 + u * blockDim.x;
                if (r < rows) v[u] = src[r];
            }
            #pragma unroll
            for (int u = 0; u < PYB_COPY_UNROLL; ++u) {
                const int r = r0 + u * blockDim.x;
                if (r < rows) dst[r] = v[u];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
pyb_pitch_copy_b1(const unsigned char* in, long long ldi, unsigned char* out, long long ldo,
                  int rows, long long cols)
{ pyb_pitch_copy(in, ldi, out, ldo, rows, cols); }

extern "C" __global__ void __launch_bounds__(256)
pyb_pitch_copy_b2(const unsigned short* in, long long ldi, unsigned short* out, long long ldo,
                  int rows, long long cols)
{ pyb_pitch_copy(in, ldi, out, ldo, rows, cols); }

extern "C" __global__ void __launch_bounds__(256)
pyb_pitch_copy_b4(const unsigned int* in, long long ldi, unsigned int* out, long long ldo,
                  int rows, long long cols)
{ pyb_pitch_copy(in, ldi, out, ldo, rows, cols); }


// The flat pitched copy, for short columns: element i of the flattened rows x cols range per
// thread, in a grid-stride loop (32 % of the H100's bandwidth at 63 rows, where the column
// copy above reached 12 %).
template <typename T>
__device__ __forceinline__ void pyb_pitch_copy_flat(const T* __restrict__ in, long long ldi,
                                                    T* __restrict__ out, long long ldo, int rows,
                                                    long long cols)
{
    const long long total = cols * rows, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long c = i / rows, r = i - c * rows;
        out[r + c * ldo] = in[r + c * ldi];
    }
}

extern "C" __global__ void __launch_bounds__(256)
pyb_pitch_copy_flat_b1(const unsigned char* in, long long ldi, unsigned char* out,
                       long long ldo, int rows, long long cols)
{ pyb_pitch_copy_flat(in, ldi, out, ldo, rows, cols); }

extern "C" __global__ void __launch_bounds__(256)
pyb_pitch_copy_flat_b2(const unsigned short* in, long long ldi, unsigned short* out,
                       long long ldo, int rows, long long cols)
{ pyb_pitch_copy_flat(in, ldi, out, ldo, rows, cols); }

extern "C" __global__ void __launch_bounds__(256)
pyb_pitch_copy_flat_b4(const unsigned int* in, long long ldi, unsigned int* out,
                       long long ldo, int rows, long long cols)
{ pyb_pitch_copy_flat(in, ldi, out, ldo, rows, cols); }
