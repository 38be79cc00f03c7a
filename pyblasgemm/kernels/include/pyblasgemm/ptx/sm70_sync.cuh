// Inter-CTA flags for split-k and stream-k fixups: release/acquire at GPU scope (sm_70+).
#pragma once
#include "../arch.cuh"

namespace pyblasgemm {

// Acquire load: later reads by this thread see everything the releasing CTA wrote before it.
PBG_DEVICE int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Release store: the CTA's earlier workspace writes (made visible by the preceding barrier +
// this thread's release) are ordered before the flag becomes visible.
PBG_DEVICE void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// One thread spins; the caller follows with __syncthreads() so the whole CTA is ordered.
PBG_DEVICE void spin_wait_geq(const int* p, int v) {
  while (ld_acquire_gpu(p) < v) {
    __nanosleep(64);  // back off: the producer CTA needs the memory system, not our polling
  }
}

}  // namespace pyblasgemm
