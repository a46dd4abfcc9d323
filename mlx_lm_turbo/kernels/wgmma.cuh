// Hopper's warpgroup MMA (wgmma, sm_90a), for prefill_attention.cu's WGMMA variant.
// Included after common.cuh through the kernel's header, inside no namespace;
// prefill_attention.wgmma_overloads adds the instructions themselves (an operand per
// accumulator register). tests/cuda_on_cpu.h defines TURBO_PTX_EMULATED and its own
// versions of these, to run the kernel on a CPU.
//
// Operands in shared memory are described by descriptors of the core-matrix layout
// without swizzle: a core matrix is 8 rows of 16 bytes, stored as 128 contiguous bytes;
// `lbo` is the byte distance between core matrices adjacent along the reduction (K)
// dimension, `sbo` between those adjacent along M or N. A K-major operand's rows are
// its M or N index; an MN-major one's (transposed, `trans_b`) rows are its K index.

namespace turbo {
#ifndef TURBO_PTX_EMULATED

__device__ __forceinline__ uint64_t smem_desc(uint32_t address, uint32_t lbo, uint32_t sbo) {
  return uint64_t((address & 0x3FFFF) >> 4) | uint64_t(lbo >> 4) << 16 | uint64_t(sbo >> 4) << 32;
}
// Shared memory written through the generic proxy (cp.async, stores) before wgmma
// reads it through the async proxy.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Registers an asynchronous wgmma reads or writes: the compiler keeps their other
// reads and writes on the same side of this point (before wgmma_fence, after
// wgmma_wait).
__device__ __forceinline__ void fence_register(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_register(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <typename R, int NB>
__device__ __forceinline__ void fence_registers(R (&r)[NB][4]) {
#pragma unroll
  for (int i = 0; i < NB; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) fence_register(r[i][c]);
  }
}

#endif
}  // namespace turbo
