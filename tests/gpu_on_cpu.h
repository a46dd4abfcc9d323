// A GPU's threads on a CPU, for running this project's kernels in tests (gpu_on_cpu.py
// builds each kernel as MLX would, over cuda_on_cpu.h or metal_on_cpu.h, which give
// this runtime the backend's names). Each thread of a block is a fiber of one OS
// thread; a fiber runs until it meets a barrier or a warp-wide operation (shuffle,
// reduction, mma), where it waits for the rest of its warp or block. Blocks, and the
// lanes between barriers, run in an order drawn from a seed, so a missing barrier
// shows up as a read of another lane's stale shared memory.
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

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace gpu_on_cpu {
// The same bits as another type, and fp16 / bf16 bits to and from float (rounding to
// nearest even), for both backends' names.
template <typename To, typename From>
inline To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}
inline float half_to_float(uint16_t bits) { return float(bit_cast<_Float16>(bits)); }
inline uint16_t float_to_half(float x) { return bit_cast<uint16_t>(_Float16(x)); }
inline float bf16_to_float(uint16_t bits) { return bit_cast<float>(uint32_t(bits) << 16); }
inline uint16_t float_to_bf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const uint32_t bits = bit_cast<uint32_t>(x);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Internal to each kernel's library: ld.so would make one copy of a plain inline
// variable (a GNU unique symbol) for every library loaded, and a shared-memory address
// is rebuilt from its library's own high bits (shared_high).
namespace {

struct Fiber {
  ucontext_t start;
  jmp_buf at;
  dim3 index;  // in its block
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
  std::fprintf(stderr, "gpu_on_cpu: %s\n", what);
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
      f.index = {unsigned(i % block.x), unsigned(i / block.x % block.y), unsigned(i / (block.x * block.y))};
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

// A warp's reduction (op over its 32 lanes' x), as one collective step.
template <typename Op>
inline float warp_reduce(float x, Op op) {
  Warp& w = my_warp();
  std::memcpy(&w.slot[current->lane], &x, sizeof(x));
  arrive(w.group);
  float r;
  std::memcpy(&r, &w.slot[0], sizeof(r));
  for (int lane = 1; lane < 32; ++lane) {
    float other;
    std::memcpy(&other, &w.slot[lane], sizeof(other));
    r = op(r, other);
  }
  arrive(w.group);
  return r;
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

}  // namespace
}  // namespace gpu_on_cpu
