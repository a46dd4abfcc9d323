// The Metal side of the shared SIMD kernels (decode_attention_simd.py): after MLX's
// own preamble (metal_stdlib, bfloat16_t). Apple GPUs' simd-groups are 32 lanes wide.
#define TG_SHARED threadgroup
#define TG threadgroup
#define INLINE inline
#define BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define SIMD_BARRIER() simdgroup_barrier(mem_flags::mem_threadgroup)
#define SIMD_SUM(x) simd_sum(x)
#define SIMD_MAX(x) simd_max(x)
#define FMAX(a, b) fmax(a, b)
#define EXP2(x) metal::exp2(x)
#define TO_FLOAT(x) static_cast<float>(x)
#define FROM_FLOAT(T, x) static_cast<T>(x)
#define UNROLL _Pragma("clang loop unroll(full)")
// Half `which` (0 low, 1 high) of a word of two fp16 values, as float.
INLINE float half_at(uint32_t word, int which) {
  return float(as_type<half>(ushort(word >> (16 * which))));
}
