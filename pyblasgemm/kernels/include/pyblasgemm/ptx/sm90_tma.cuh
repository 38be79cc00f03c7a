// Hopper (sm_90a) PTX wrappers, each named after its instruction: mbarrier, the TMA bulk
// tensor copy (cp.async.bulk.tensor), setmaxnreg, wgmma fences and shared-memory matrix
// descriptors. Everything here is warp- or thread-level; the kernel decides who calls what.
#pragma once
#include "../arch.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "pyblasgemm's Hopper kernels need the sm_90a target (--gpu-architecture=sm_90a)"
#endif

namespace pyblasgemm {

// A CUtensorMap (128 bytes, 64-byte aligned) built on the host by cuTensorMapEncodeTiled and
// passed by value as a __grid_constant__ kernel parameter; the TMA unit reads it from there.
struct alignas(64) TmaDesc {
  u64 raw[16];
};

PBG_DEVICE u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// ---- mbarrier (shared::cta) -------------------------------------------------------------
PBG_DEVICE void mbarrier_init(u32 bar, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Make the initialized barriers visible to the async proxy (TMA) before anyone uses them.
PBG_DEVICE void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
PBG_DEVICE void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
PBG_DEVICE void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
PBG_DEVICE bool mbarrier_try_wait_parity(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Wait until the barrier's phase with this parity has completed (try_wait suspends in hardware
// for a while before returning false, so the loop does not hammer shared memory).
PBG_DEVICE void mbarrier_wait(u32 bar, u32 parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// ---- TMA ----------------------------------------------------------------------------------
PBG_DEVICE void prefetch_tma_desc(const TmaDesc* d) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(d)) : "memory");
}
// 3-D tiled load of one box into shared memory; completion (bytes) is signalled on `bar`.
// Out-of-range elements of the box are filled with zeros (the tensor map's OOB fill).
PBG_DEVICE void cp_async_bulk_tensor_3d(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// ---- register reallocation between warpgroups (needs a register cap at kernel entry) ------
template <u32 N>
PBG_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <u32 N>
PBG_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- wgmma ordering ---------------------------------------------------------------------
PBG_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
PBG_DEVICE void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
PBG_DEVICE void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pin a register across the asynchronous MMA: the compiler may not move its reads/writes over
// the fence / wait that surround it.
PBG_DEVICE void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
PBG_DEVICE void reg_fence(int& r) { asm volatile("" : "+r"(r)::"memory"); }

// Named barrier among `threads` threads (the consumer warpgroups), id 1.. (0 = __syncthreads).
PBG_DEVICE void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- shared-memory matrix descriptor (wgmma), 128-byte swizzle ----------------------------
// Bits: [0,14) start address >> 4, [16,30) leading-dimension byte offset >> 4, [32,46) stride
// byte offset >> 4, [49,52) base offset (0: every tile starts 1024-byte aligned), [62,64)
// layout 1 = 128-byte swizzle.
//  K-major tile (rows of 128 bytes of K, 8-row swizzle atoms): SBO = 1024 (next 8 rows),
//    LBO unused; the k-th 32-byte slice of K starts 32*k bytes in.
//  MN-major tile (rows of 128 bytes = 64 MN elements, one row per k): SBO = 1024 (next 8 k),
//    LBO = byte distance between 64-element MN blocks; the k16 slice k starts 2048*k bytes in.
PBG_DEVICE u64 smem_desc_sw128(u32 addr, u32 lbo, u32 sbo) {
  u64 d = static_cast<u64>((addr & 0x3FFFF) >> 4);
  d |= static_cast<u64>((lbo & 0x3FFFF) >> 4) << 16;
  d |= static_cast<u64>((sbo & 0x3FFFF) >> 4) << 32;
  d |= static_cast<u64>(1) << 62;
  return d;
}

}  // namespace pyblasgemm

namespace pyblasgemm {

// ---- clusters (thread block clusters of CTAs on neighbouring SMs) -----------------------
PBG_DEVICE u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA in the cluster: release our shared-memory writes (barrier
// inits) to the cluster, then wait for all the others.
PBG_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrive on the mbarrier at the same shared-memory offset in CTA `cta` of the cluster.
// Default (.release.cta) semantics on purpose: the arrival only says "my wgmma reads of this
// stage are complete" (wgmma.wait_group already guarantees that), it publishes no data. The
// explicit .release.cluster form measured 2x to 8x slower on an H100 (each arrive waits on
// cluster-scope ordering): NOTES_SM90.md, step 4.
PBG_DEVICE void mbarrier_arrive_cluster(u32 bar, u32 cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
// A TMA load whose box lands at the same offset in every CTA of `mask` (and completes bytes
// on each one's mbarrier at `bar`'s offset): one L2 read feeds several SMs.
PBG_DEVICE void cp_async_bulk_tensor_3d_multicast(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1, int c2,
                                                  unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
      : "memory");
}

}  // namespace pyblasgemm

namespace pyblasgemm {

// ---- TMA store (shared -> global), bulk async-groups ---------------------------------------
// Writes one box from shared memory; elements outside the tensor are skipped (edges clip).
PBG_DEVICE void cp_async_bulk_tensor_3d_store(const TmaDesc* desc, u32 src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<u64>(desc)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
PBG_DEVICE void cp_async_bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's bulk groups still read their shared-memory source.
template <int N>
PBG_DEVICE void cp_async_bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
PBG_DEVICE void cp_async_bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Order this thread's ordinary shared-memory writes before later async-proxy (TMA) reads.
PBG_DEVICE void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
PBG_DEVICE void st_shared_u16(u32 addr, u32 v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}
PBG_DEVICE void st_shared_u32(u32 addr, u32 v) { asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }
PBG_DEVICE void st_shared_v2_u32(u32 addr, u32 x, u32 y) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(addr), "r"(x), "r"(y) : "memory");
}

}  // namespace pyblasgemm
