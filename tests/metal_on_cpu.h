// The Metal Shading Language names our Metal kernels use, over gpu_on_cpu.h's runtime:
// their Metal build, built by g++, runs on a CPU (gpu_on_cpu.py). Address spaces mean
// nothing here: device, constant and thread are empty, and threadgroup memory is
// static (one threadgroup runs at a time; gpu_on_cpu.py declares TG_SHARED so after
// the prelude's threadgroup, which also qualifies pointers).
#pragma once
#include <algorithm>

#include "gpu_on_cpu.h"

#define threadgroup
#define device
#define constant
#define thread
#define kernel

using uint = unsigned int;
using ushort = unsigned short;
struct uint3 {
  uint x, y, z;
};

// fp16 and bf16 as their bits; arithmetic goes through float, as the kernels' does.
struct half {
  uint16_t bits;
  half() = default;
  half(float x) {
    const _Float16 f = _Float16(x);  // round to nearest even
    std::memcpy(&bits, &f, 2);
  }
  operator float() const {
    _Float16 f;
    std::memcpy(&f, &bits, 2);
    return float(f);
  }
};
typedef half float16_t;
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = std::isnan(x) ? 0x7fc00000u : u + 0x7fffu + ((u >> 16) & 1u);  // nearest even
    bits = uint16_t(u >> 16);
  }
  operator float() const {
    const uint32_t u = uint32_t(bits) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  }
};

template <typename To, typename From>
inline To as_type(From from) {
  static_assert(sizeof(To) == sizeof(From), "as_type keeps the size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

enum class mem_flags { mem_none, mem_device, mem_threadgroup };
inline void threadgroup_barrier(mem_flags) { gpu_on_cpu::arrive(gpu_on_cpu::block_group); }
inline void simdgroup_barrier(mem_flags) { gpu_on_cpu::arrive(gpu_on_cpu::my_warp().group); }
inline float simd_sum(float x) {
  return gpu_on_cpu::warp_reduce(x, [](float a, float b) { return a + b; });
}
inline float simd_max(float x) {
  return gpu_on_cpu::warp_reduce(x, [](float a, float b) { return std::fmax(a, b); });
}

namespace metal {
inline float exp2(float x) { return std::exp2(x); }
}  // namespace metal
using namespace metal;
using std::fmax;
using std::max;
using std::min;
