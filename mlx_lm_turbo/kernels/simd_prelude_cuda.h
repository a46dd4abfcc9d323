// The CUDA side of the shared SIMD kernels (decode_attention_simd.py): after
// common.cuh, whose helpers it names. A simd-group is a warp of 32 lanes.
#define TG_SHARED __shared__
#define TG
#define INLINE __device__ __forceinline__
#define BARRIER() __syncthreads()
#define SIMD_BARRIER() __syncwarp()
#define SIMD_SUM(x) turbo::warp_sum(x)
#define SIMD_MAX(x) turbo::warp_max(x)
#define FMAX(a, b) fmaxf(a, b)
#define EXP2(x) turbo::exp2_or_zero(x)
#define TO_FLOAT(x) turbo::to_float(x)
#define FROM_FLOAT(T, x) turbo::from_float<T>(x)
#define UNROLL _Pragma("unroll")
// Half `which` (0 low, 1 high) of a word of two fp16 values, as float.
INLINE float half_at(uint32_t word, int which) {
  return __half2float(__ushort_as_half((unsigned short)(word >> (16 * which))));
}
