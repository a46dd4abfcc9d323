// CUDA's device vocabulary over gpu_on_cpu.h's runtime: this project's CUDA kernels,
// built by g++, run on a CPU (gpu_on_cpu.py).
#pragma once
#include <chrono>

#include "gpu_on_cpu.h"

#define __device__
#define __forceinline__ inline
#define __location__(x)
#define __launch_bounds__(...)
#define __global__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

struct __attribute__((aligned(16))) uint4 {
  unsigned x, y, z, w;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
struct __attribute__((aligned(8))) uint2 {
  unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

// fp16 and bf16 as their bits; arithmetic goes through float, as the kernels' does.
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half2 {
  __half x, y;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline float __half2float(__half h) { return gpu_on_cpu::half_to_float(h.bits); }
inline __half __float2half(float x) { return __half{gpu_on_cpu::float_to_half(x)}; }
inline __half2 __floats2half2_rn(float lo, float hi) { return {__float2half(lo), __float2half(hi)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__nv_bfloat16{gpu_on_cpu::float_to_bf16(lo)}, __nv_bfloat16{gpu_on_cpu::float_to_bf16(hi)}};
}
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __bfloat162float(__nv_bfloat16 h) { return gpu_on_cpu::bf16_to_float(h.bits); }
inline __nv_bfloat16 __float2bfloat16(float x) { return __nv_bfloat16{gpu_on_cpu::float_to_bf16(x)}; }
inline int __float_as_int(float x) { return gpu_on_cpu::bit_cast<int>(x); }
inline float __int_as_float(int i) { return gpu_on_cpu::bit_cast<float>(i); }
#define GPU_ON_CPU_MIN_MAX(T)                     \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
GPU_ON_CPU_MIN_MAX(int)
GPU_ON_CPU_MIN_MAX(unsigned)
GPU_ON_CPU_MIN_MAX(long long)
GPU_ON_CPU_MIN_MAX(unsigned long long)
#undef GPU_ON_CPU_MIN_MAX
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return unsigned(((uint64_t(hi) << 32) | lo) >> (shift & 31));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t bytes = (uint64_t(y) << 32) | x;
  unsigned out = 0;
  for (int i = 0; i < 4; ++i) out |= unsigned((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return out;
}
template <typename V>
inline V __ldcg(const V* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(V)) {
    gpu_on_cpu::fail("a load misaligned for its type (a GPU faults)");
  }
  return *p;
}
// One OS thread runs every fiber and switches only at barriers: plain updates are atomic.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old | v;
  return old;
}
inline void __threadfence() {}


#define threadIdx (gpu_on_cpu::current->index)
#define blockIdx (gpu_on_cpu::block_idx)
#define gridDim (gpu_on_cpu::grid_dim)
#define blockDim (gpu_on_cpu::block_dim)

inline void __syncthreads() { gpu_on_cpu::arrive(gpu_on_cpu::block_group); }
inline void __syncwarp(unsigned = 0xffffffffu) { gpu_on_cpu::arrive(gpu_on_cpu::my_warp().group); }
template <typename V>
inline V __shfl_sync(unsigned, V v, int source) {
  return gpu_on_cpu::exchange(v, source);
}
template <typename V>
inline V __shfl_xor_sync(unsigned, V v, int mask) {
  return gpu_on_cpu::exchange(v, gpu_on_cpu::current->lane ^ mask);
}
// A shared-window address, as a GPU's: the window's first KiB is reserved (sm_80+), so
// static shared memory starts at 0x400 and an array's alignment above 1 KiB does not
// carry over to its address; host memory's does, so the window here is the host
// address plus 0x400 (load_shared takes it off).
constexpr uint32_t SHARED_RESERVED = 0x400;
inline size_t __cvta_generic_to_shared(const void* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if ((gpu_on_cpu::shared_high_set && (at >> 32) != gpu_on_cpu::shared_high) ||
      uint32_t(at) > ~SHARED_RESERVED) {
    gpu_on_cpu::fail("shared memory spans a 4 GiB boundary");
  }
  gpu_on_cpu::shared_high = at >> 32;
  gpu_on_cpu::shared_high_set = true;
  return uint32_t(at) + SHARED_RESERVED;
}
// The host memory behind a shared-window address (what __cvta_generic_to_shared gave).
inline void* shared_host(uint32_t address) {
  return reinterpret_cast<void*>((gpu_on_cpu::shared_high << 32) | (address - SHARED_RESERVED));
}

// common.cuh's PTX helpers, by what each instruction does (common.cuh leaves its own
// out where TURBO_PTX_EMULATED is defined).
#define TURBO_PTX_EMULATED
namespace turbo {

inline float warp_max(float x) {  // redux.sync.max
  return gpu_on_cpu::warp_reduce(x, [](float a, float b) { return fmaxf(a, b); });
}

inline float exp2_or_zero(float x) { return exp2f(x); }

inline uint32_t load_shared(uint32_t address) {
  uint32_t v;
  std::memcpy(&v, shared_host(address), 4);
  return v;
}

// mma.sync.m16n8k16.row.col.f32.f16.f16.f32, by PTX's fragment layout: lane 4g + t
// holds A's rows g and g + 8 at columns 2t, 2t + 1 (and + 8), B's column g at rows
// 2t, 2t + 1 (and + 8), D's rows g and g + 8 at columns 2t, 2t + 1.
template <bool BF16 = false>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using namespace gpu_on_cpu;
  Warp& w = my_warp();
  const int lane = current->lane;
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  for (int i = 0; i < 12; ++i) {
    const uint16_t bits = uint16_t(mine[i / 2] >> (16 * (i & 1)));
    w.mma[lane][i] = BF16 ? bf16_to_float(bits) : half_to_float(bits);
  }
  arrive(w.group);
  // register reg's half k & 1 of lane `from`
  auto A = [&](int row, int k) { return w.mma[4 * (row % 8) + (k % 8) / 2][2 * ((row >= 8) + 2 * (k >= 8)) + (k & 1)]; };
  auto B = [&](int k, int col) { return w.mma[4 * col + (k % 8) / 2][2 * (4 + (k >= 8)) + (k & 1)]; };
  const int g = lane >> 2, t = lane & 3;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  for (int i = 0; i < 4; ++i) {
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += A(rows[i], k) * B(k, cols[i]);
    d[i] = sum;
  }
  arrive(w.group);
}

inline void mma_16816_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_16816<true>(d, a, b0, b1);
}

// ldmatrix: every lane's row address, exchanged as the warp's shuffles are.
template <bool TRANS>
inline void ldmatrix_rows(uint32_t (&r)[4], uint32_t address) {
  using namespace gpu_on_cpu;
  const int lane = current->lane, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    if (!TRANS) {
      const uint32_t row = exchange(address, 8 * i + g);
      r[i] = load_shared(row + 4 * t);
    } else {
      const uint32_t lo_row = exchange(address, 8 * i + 2 * t);
      const uint32_t hi_row = exchange(address, 8 * i + 2 * t + 1);
      uint16_t lo, hi;
      std::memcpy(&lo, shared_host(lo_row + 2 * g), 2);
      std::memcpy(&hi, shared_host(hi_row + 2 * g), 2);
      r[i] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) { ldmatrix_rows<false>(r, address); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) { ldmatrix_rows<true>(r, address); }

inline void cp_async16_at(uint32_t address, const void* global) {
  std::memcpy(shared_host(address), global, 16);
}
inline void cp_async16(void* shared, const void* global) {
  cp_async16_at(uint32_t(__cvta_generic_to_shared(shared)), global);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

// wgmma.cuh's warpgroup MMA. A descriptor keeps the whole shared-window address here
// (the GPU's keeps 18 bits, which name no host address), then lbo / 16 and sbo / 16.
inline uint64_t smem_desc(uint32_t address, uint32_t lbo, uint32_t sbo) {
  return uint64_t(address) | uint64_t(lbo >> 4) << 32 | uint64_t(sbo >> 4) << 48;
}
inline void fence_async_shared() {}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N>
inline void wgmma_wait() {}
template <typename R, int NB>
inline void fence_registers(R (&)[NB][4]) {}

// Element (mn, k) of an operand in the core-matrix layout (wgmma.cuh): a K-major one's
// core-matrix rows are its M or N index, an MN-major one's its K index.
template <bool BF16>
inline float desc_element(uint64_t desc, int mn, int k, bool mn_major) {
  using namespace gpu_on_cpu;
  const uint32_t lbo = uint32_t(desc >> 32 & 0xffff) << 4, sbo = uint32_t(desc >> 48) << 4;
  const uint32_t at = uint32_t(desc) + (mn / 8) * sbo + (k / 8) * lbo +
                      (mn_major ? (k % 8) * 16 + (mn % 8) * 2 : (mn % 8) * 16 + (k % 8) * 2);
  uint16_t bits;
  std::memcpy(&bits, shared_host(at), 2);
  return BF16 ? bf16_to_float(bits) : half_to_float(bits);
}

// D (64 x N) += A (64 x 16) x B (16 x N) for a warpgroup; this thread's part of D as
// mma.sync's C fragments of its warp's 16 rows, n-tile by n-tile. A and B in shared
// memory, both K-major.
template <bool BF16, int NB>
inline void wgmma_ss(float (&d)[NB][4], uint64_t a, uint64_t b, int accumulate) {
  using namespace gpu_on_cpu;
  const int w = current->warp % 4, g = current->lane >> 2, t = current->lane & 3;
  for (int n = 0; n < NB; ++n) {
    for (int c = 0; c < 4; ++c) {
      const int row = 16 * w + g + 8 * (c >> 1), col = 8 * n + 2 * t + (c & 1);
      float sum = accumulate ? d[n][c] : 0.0f;
      for (int k = 0; k < 16; ++k) {
        sum += desc_element<BF16>(a, row, k, false) * desc_element<BF16>(b, col, k, false);
      }
      d[n][c] = sum;
    }
  }
}

// The same with A in registers (mma.sync's m16n8k16 A fragments of the warp's rows,
// exchanged as mma_16816's are) and B MN-major.
template <bool BF16, int NB>
inline void wgmma_rs_trans_b(float (&d)[NB][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  using namespace gpu_on_cpu;
  Warp& w = my_warp();
  const int lane = current->lane, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 8; ++i) {
    const uint16_t bits = uint16_t(a[i / 2] >> (16 * (i & 1)));
    w.mma[lane][i] = BF16 ? bf16_to_float(bits) : half_to_float(bits);
  }
  arrive(w.group);
  auto A = [&](int row, int k) { return w.mma[4 * (row % 8) + (k % 8) / 2][2 * ((row >= 8) + 2 * (k >= 8)) + (k & 1)]; };
  for (int n = 0; n < NB; ++n) {
    for (int c = 0; c < 4; ++c) {
      const int row = g + 8 * (c >> 1), col = 8 * n + 2 * t + (c & 1);
      float sum = accumulate ? d[n][c] : 0.0f;
      for (int k = 0; k < 16; ++k) sum += A(row, k) * desc_element<BF16>(b, col, k, true);
      d[n][c] = sum;
    }
  }
  arrive(w.group);
}

inline uint32_t sm_index() { return 0; }
inline uint64_t global_time_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace turbo
