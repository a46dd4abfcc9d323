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
  half(float x) : bits(gpu_on_cpu::float_to_half(x)) {}
  operator float() const { return gpu_on_cpu::half_to_float(bits); }
};
typedef half float16_t;
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float x) : bits(gpu_on_cpu::float_to_bf16(x)) {}
  operator float() const { return gpu_on_cpu::bf16_to_float(bits); }
};

template <typename To, typename From>
inline To as_type(From from) {
  return gpu_on_cpu::bit_cast<To>(from);
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
