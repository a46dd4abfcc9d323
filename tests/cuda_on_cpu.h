// CUDA's device vocabulary on a CPU, so tests run this project's CUDA kernels where
// there is no GPU (cuda_on_cpu.py builds each kernel as MLX-CUDA would, with this
// header before it). Each thread of a block is a fiber of one OS thread; a fiber
// runs until it meets a barrier or a warp-wide operation (shuffle, reduction, mma),
// where it waits for the rest of its warp or block. The lanes of a warp run in an
// order drawn from a seed at every barrier, so a missing __syncwarp shows up as a
// read of another lane's stale shared memory.
#pragma once
#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __location__(x)
#define __launch_bounds__(...)
#define __global__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned x, y, z, w;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

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
inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, 2);
  return float(f);
}
inline __half __float2half(float x) {
  const _Float16 f = _Float16(x);  // round to nearest even
  __half h;
  std::memcpy(&h.bits, &f, 2);
  return h;
}
inline __half2 __floats2half2_rn(float lo, float hi) { return {__float2half(lo), __float2half(hi)}; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t bits = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return __nv_bfloat16{0x7fc0};
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return __nv_bfloat16{uint16_t(bits >> 16)};
}
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, 4);
  return i;
}
inline float __int_as_float(int i) {
  float x;
  std::memcpy(&x, &i, 4);
  return x;
}
#define CUDA_ON_CPU_MIN_MAX(T)                     \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
CUDA_ON_CPU_MIN_MAX(int)
CUDA_ON_CPU_MIN_MAX(unsigned)
CUDA_ON_CPU_MIN_MAX(long long)
CUDA_ON_CPU_MIN_MAX(unsigned long long)
#undef CUDA_ON_CPU_MIN_MAX
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

namespace cuda_on_cpu {

struct Fiber {
  ucontext_t start;
  jmp_buf at;
  dim3 thread;
  int warp = 0, lane = 0;
  bool started = false, done = false;
};

struct Group {  // a warp or the block: who has arrived at its barrier
  int live = 0, arrived = 0;
  unsigned generation = 0;
};

struct Warp {
  Group group;
  uint64_t slot[32];
  float mma[32][12];  // each lane's A and B fragments as floats
};

inline Fiber* current = nullptr;
inline dim3 block_idx, grid_dim, block_dim;
inline std::vector<Fiber>* fibers = nullptr;
inline std::vector<Warp>* warps = nullptr;
inline Group block_group;
inline jmp_buf scheduler;
inline uint64_t progress = 0, rng = 0;
inline uintptr_t shared_high = 0;
inline bool shared_high_set = false;
inline void (*thread_body)(void*) = nullptr;
inline void* thread_args = nullptr;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_on_cpu: %s\n", what);
  std::abort();
}

inline void yield() {
  if (!_setjmp(current->at)) _longjmp(scheduler, 1);
}

// Arrive at a group's barrier and wait until all its live fibers have.
inline void arrive(Group& g) {
  ++progress;
  const unsigned generation = g.generation;
  if (++g.arrived == g.live) {
    g.arrived = 0;
    ++g.generation;
    return;
  }
  while (g.generation == generation) yield();
}

inline void leave(Group& g) {  // a fiber that returned no longer counts
  if (--g.live > 0 && g.arrived == g.live) {
    g.arrived = 0;
    ++g.generation;
  }
}

inline Warp& my_warp() { return (*warps)[current->warp]; }

inline void trampoline() {
  thread_body(thread_args);
  current->done = true;
  leave(my_warp().group);
  leave(block_group);
  ++progress;
  _longjmp(scheduler, 1);
}

// Runs every block of the grid (blocks in a seeded order: a kernel must not depend
// on it), each block's threads as fibers.
inline void launch(void (*body)(void*), void* args, dim3 grid, dim3 block, unsigned seed) {
  thread_body = body;
  thread_args = args;
  grid_dim = grid;
  block_dim = block;
  rng = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next_random = [] {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
  };
  std::vector<dim3> blocks;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back({x, y, z});
  for (size_t i = blocks.size(); i > 1; --i) std::swap(blocks[i - 1], blocks[next_random() % i]);
  const int n = int(block.x * block.y * block.z);
  constexpr size_t STACK = 1 << 18;
  static std::vector<std::unique_ptr<char[]>> stacks;  // kept for the next launch
  while (stacks.size() < size_t(n)) stacks.emplace_back(new char[STACK]);
  for (const dim3& b : blocks) {
    block_idx = b;
    std::vector<Fiber> all(n);
    std::vector<Warp> ws((n + 31) / 32);
    fibers = &all;
    warps = &ws;
    block_group = Group{n, 0, 0};
    for (int i = 0; i < n; ++i) {
      Fiber& f = all[i];
      f.thread = {unsigned(i % block.x), unsigned(i / block.x % block.y), unsigned(i / (block.x * block.y))};
      f.warp = i / 32;
      f.lane = i % 32;
      ws[f.warp].group.live++;
      getcontext(&f.start);
      f.start.uc_stack.ss_sp = stacks[i].get();
      f.start.uc_stack.ss_size = STACK;
      f.start.uc_link = nullptr;
      makecontext(&f.start, trampoline, 0);
    }
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    int remaining = n;
    while (remaining > 0) {
      const uint64_t before = progress;
      for (int i = n - 1; i > 0; --i) std::swap(order[i], order[next_random() % (i + 1)]);
      for (int i : order) {
        Fiber& f = all[i];
        if (f.done) continue;
        current = &f;
        if (!_setjmp(scheduler)) {
          if (f.started) {
            _longjmp(f.at, 1);
          }
          f.started = true;
          ucontext_t here;
          swapcontext(&here, &f.start);
        }
        if (f.done) --remaining;
      }
      if (remaining > 0 && progress == before) fail("deadlock: a barrier some threads never reach");
    }
  }
}

template <typename V>
inline V exchange(V v, int source) {  // a warp's shuffle: every lane's v, read at `source`
  Warp& w = my_warp();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(V));
  w.slot[current->lane] = bits;
  arrive(w.group);
  std::memcpy(&v, &w.slot[source & 31], sizeof(V));
  arrive(w.group);
  return v;
}

}  // namespace cuda_on_cpu

#define threadIdx (cuda_on_cpu::current->thread)
#define blockIdx (cuda_on_cpu::block_idx)
#define gridDim (cuda_on_cpu::grid_dim)
#define blockDim (cuda_on_cpu::block_dim)

inline void __syncthreads() { cuda_on_cpu::arrive(cuda_on_cpu::block_group); }
inline void __syncwarp(unsigned = 0xffffffffu) { cuda_on_cpu::arrive(cuda_on_cpu::my_warp().group); }
template <typename V>
inline V __shfl_sync(unsigned, V v, int source) {
  return cuda_on_cpu::exchange(v, source);
}
template <typename V>
inline V __shfl_xor_sync(unsigned, V v, int mask) {
  return cuda_on_cpu::exchange(v, cuda_on_cpu::current->lane ^ mask);
}
inline size_t __cvta_generic_to_shared(const void* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if (cuda_on_cpu::shared_high_set && (at >> 32) != cuda_on_cpu::shared_high) {
    cuda_on_cpu::fail("shared memory spans a 4 GiB boundary");
  }
  cuda_on_cpu::shared_high = at >> 32;
  cuda_on_cpu::shared_high_set = true;
  return uint32_t(at);
}

// common.cuh's PTX helpers, by what each instruction does (common.cuh leaves its own
// out where TURBO_PTX_EMULATED is defined).
#define TURBO_PTX_EMULATED
namespace turbo {

inline float warp_max(float x) {  // redux.sync.max
  using namespace cuda_on_cpu;
  Warp& w = my_warp();
  std::memcpy(&w.slot[current->lane], &x, sizeof(x));
  arrive(w.group);
  float m = x;
  for (int lane = 0; lane < 32; ++lane) {
    float other;
    std::memcpy(&other, &w.slot[lane], sizeof(other));
    m = fmaxf(m, other);
  }
  arrive(w.group);
  return m;
}

inline float exp2_or_zero(float x) { return exp2f(x); }

inline uint32_t load_shared(uint32_t address) {
  uint32_t v;
  std::memcpy(&v, reinterpret_cast<const void*>((cuda_on_cpu::shared_high << 32) | address), 4);
  return v;
}

// mma.sync.m16n8k16.row.col.f32.f16.f16.f32, by PTX's fragment layout: lane 4g + t
// holds A's rows g and g + 8 at columns 2t, 2t + 1 (and + 8), B's column g at rows
// 2t, 2t + 1 (and + 8), D's rows g and g + 8 at columns 2t, 2t + 1.
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using namespace cuda_on_cpu;
  Warp& w = my_warp();
  const int lane = current->lane;
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  for (int i = 0; i < 12; ++i) w.mma[lane][i] = __half2float(__half{uint16_t(mine[i / 2] >> (16 * (i & 1)))});
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

inline void cp_async16(void* shared, const void* global) { std::memcpy(shared, global, 16); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

}  // namespace turbo
