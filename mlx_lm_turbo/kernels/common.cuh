// Helpers shared by the kernels (decode_attention.cu, encode.cu).
// Included through mx.fast.cuda_kernel's `header`, inside no namespace.

namespace turbo {

constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f;

// A compile-time value as an argument, to pick a generic lambda's variant.
template <int N>
struct Int {
  static constexpr int value = N;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(bool x) { return x ? 1.0f : 0.0f; }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
// Saturating, as codec.in_dtype (NaN stays NaN): a rotated coordinate of a vector finite
// in fp16 may not be.
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half(fabsf(x) > 65504.0f ? copysignf(65504.0f, x) : x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// -- The PTX instructions the kernels use, each wrapped once. tests/cuda_on_cpu.h
// defines TURBO_PTX_EMULATED and its own versions of these, to run the kernels on a CPU.
#ifndef TURBO_PTX_EMULATED

// One redux instruction (sm_80+) on an order-preserving integer image of the float
// (negative floats' magnitude bits flipped), instead of five shuffles and maxes.
__device__ __forceinline__ float warp_max(float x) {
  const int i = __float_as_int(x);
  int m;
  asm("redux.sync.max.s32 %0, %1, 0xffffffff;\n" : "=r"(m) : "r"(i >= 0 ? i : i ^ 0x7fffffff));
  return __int_as_float(m >= 0 ? m : m ^ 0x7fffffff);
}

// exp2 as one MUFU instruction (exp2f is a dozen without fast math: its denormal
// path); -inf (a masked score, or an empty running max) gives 0. Relative error
// about 2^-22, far inside the kernels' 2e-3 tolerance.
__device__ __forceinline__ float exp2_or_zero(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A word of shared memory at a 32-bit shared address (the compiler would add a generic
// pointer's base instead of taking an address built by OR).
__device__ __forceinline__ uint32_t load_shared(uint32_t address) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(address));
  return v;
}

// D (16 x 8, f32) += A (16 x 16, f16, row-major fragments) x B (16 x 8, f16): one warp,
// the tensor cores (sm_80+). PTX's fragment layout: lane = 4 * group + t holds A's
// rows group and group + 8 at columns 2t, 2t + 1 (and + 8), B's column group at rows
// 2t, 2t + 1 (and + 8), D's rows group and group + 8 at columns 2t, 2t + 1.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with bf16 A and B (bf16 queries, keys and values: no range lost to fp16).
__device__ __forceinline__ void mma_16816_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 matrices of 16-bit values from shared memory, one warp: lanes 8i .. 8i + 7
// give the addresses of matrix i's rows (16 bytes each); lane 4g + t gets in r[i] matrix
// i's row g, columns 2t and 2t + 1 (an MMA's B fragment where the rows are B's columns).
// _trans: lane 4g + t gets matrix i's rows 2t and 2t + 1 at column g instead.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}

// A 16-byte copy from global to shared memory that runs while the warp goes on
// (sm_80+, like mma.sync); cp_async_commit closes a group of them, cp_async_wait<N>
// waits until at most N groups are still in flight.
// cp_async16_at takes the shared-window address itself, so that an add to it folds into
// the instruction.
__device__ __forceinline__ void cp_async16_at(uint32_t shared_address, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address), "l"(global));
}
__device__ __forceinline__ void cp_async16(void* shared, const void* global) {
  cp_async16_at(static_cast<uint32_t>(__cvta_generic_to_shared(shared)), global);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// This block's SM and the GPU's nanosecond clock, one for all SMs (PHASE_TIMES).
__device__ __forceinline__ uint32_t sm_index() {
  uint32_t i;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(i));
  return i;
}
__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// The block's dynamic shared memory as words (mx.fast.cuda_kernel's shared_memory),
// aligned to 128 bytes as the static staging memory is (decode_attention.cu's scratch).
#define DYNAMIC_SHARED_ARRAY(name) extern __shared__ __align__(128) uint32_t name[]

#endif  // TURBO_PTX_EMULATED

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL_MASK, x, o);
  return x;
}

// Code j of a run of codes held in registers: bits [j * BITS, (j + 1) * BITS) of w.
// j is a compile-time constant after unrolling, so this is one or two shifts and a mask.
template <int BITS, int N>
__device__ __forceinline__ uint32_t code_at(const uint32_t (&w)[N], int j) {
  if constexpr (BITS == 8) {
    return __byte_perm(w[j >> 2], 0u, 0x4440 | (j & 3));  // one permute: byte j & 3
  }
  const int bit = j * BITS, word = bit >> 5, shift = bit & 31;
  uint32_t v = w[word] >> shift;
  if (shift + BITS > 32 && word + 1 < N) v |= w[word + 1] << (32 - shift);
  return v & ((1u << BITS) - 1u);
}

// Code j of a BITS-bit code stream at bit 0, the bits above it whatever follows in the
// stream (for a shuffle's source lane, of which only bits 0-4 count): one shift, or one
// funnel shift where the code straddles two words.
template <int BITS, int N>
__device__ __forceinline__ uint32_t code_low(const uint32_t (&w)[N], int j) {
  const int bit = j * BITS, word = bit >> 5, shift = bit & 31;
  if (shift + BITS > 32 && word + 1 < N) return __funnelshift_r(w[word], w[word + 1], shift);
  return w[word] >> shift;
}

// Code j of a run of BITS-bit codes times 4: a word's byte offset in a table indexed by
// the code. One shift (or funnel shift) and a mask, which the caller's OR joins.
// code_at and this are written out, not through code_low: nvcc does not fold the shifts
// (both through code_low cost turbo3's key loop 138 -> 142 SASS instructions per 16
// tokens, and 237 -> 245 at head dim 256 in bf16; compile_kernels.py --loops).
template <int BITS, int N>
__device__ __forceinline__ uint32_t code_bytes(const uint32_t (&w)[N], int j) {
  const int bit = j * BITS, word = bit >> 5, shift = bit & 31;
  constexpr uint32_t MASK = ((1u << BITS) - 1u) << 2;
  if (shift + BITS > 32 && word + 1 < N) return __funnelshift_r(w[word], w[word + 1], shift - 2) & MASK;
  return (shift >= 2 ? w[word] >> (shift - 2) : w[word] << (2 - shift)) & MASK;
}

// The pair of codes for dims 2p and 2p + 1 of a BITS-bit code stream: 2 * BITS bits
// from bit 2p * BITS (a pair of 3-bit codes may straddle two words; the stream is
// followed by more of the row, so reading the next word stays inside it).
template <int BITS>
__device__ __forceinline__ uint32_t pair_code(const uint32_t* stream, int p) {
  const int bit = p * 2 * BITS, word = bit >> 5, shift = bit & 31;
  uint32_t v = stream[word] >> shift;
  if ((32 % (2 * BITS)) != 0 && shift + 2 * BITS > 32) v |= stream[word + 1] << (32 - shift);
  return v & ((1u << (2 * BITS)) - 1u);
}

// Two floats as one f16x2 register, the first in the low half.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The same as a bf16x2 register.
__device__ __forceinline__ uint32_t pack_bf162(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// A codebook held one level a lane for warp shuffles: lane i's level i mod 2^BITS in both
// halves. A shuffle reads only bits 0-4 of its source lane, so a code shifted to bit 0
// indexes its level with no mask (the bits above it pick a copy of the same level).
template <int BITS>
__device__ __forceinline__ uint32_t lane_level(const float* levels, int lane) {
  const float level = levels[lane & ((1 << BITS) - 1)];
  return pack_half2(level, level);
}

// Two codes' levels as one f16x2 register (lo_code's in the low half), from lane_level's
// register: two shuffles and a permute.
__device__ __forceinline__ uint32_t shuffled_levels(uint32_t lane_level, uint32_t lo_code,
                                                    uint32_t hi_code) {
  const uint32_t lo = __shfl_sync(FULL_MASK, lane_level, lo_code);
  const uint32_t hi = __shfl_sync(FULL_MASK, lane_level, hi_code);
  return __byte_perm(lo, hi, 0x5410);  // lo's low half, hi's high half
}

// A table of every pair of BITS-bit codes' levels (pair = lo | hi << BITS, lo's level in
// the low half), each entry held COPIES times side by side (entry e's copies at
// COPIES * e ..), filled by a block's threads from the levels their lanes hold: shuffles,
// where a global load of both levels an entry made the 4-bit table's fill a quarter of a
// short launch's instructions, each waiting on its loads. Every lane of a warp takes each
// pass, as the shuffles need.
template <int BITS, int COPIES>
__device__ __forceinline__ void fill_level_pairs(uint32_t* table, const float* levels) {
  static_assert(BITS <= 5, "a warp's lanes hold at most 32 levels");
  constexpr int ENTRIES = COPIES << (2 * BITS);
  const uint32_t level = lane_level<BITS>(levels, threadIdx.x % 32);
#pragma unroll 4
  for (int first = 0; first < ENTRIES; first += blockDim.x) {
    const int j = first + threadIdx.x;
    const int pair = (j / COPIES) & ((1 << (2 * BITS)) - 1);
    const uint32_t entry = shuffled_levels(level, pair & ((1 << BITS) - 1), pair >> BITS);
    if (j < ENTRIES) table[j] = entry;
  }
}

// N consecutive floats of shared memory in as few loads as their alignment allows
// (the compiler does not merge them by itself).
template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&out)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + i);
      out[i] = v.x; out[i + 1] = v.y; out[i + 2] = v.z; out[i + 3] = v.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float2 v = *reinterpret_cast<const float2*>(p + i);
      out[i] = v.x; out[i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = p[i];
  }
}

// The unnormalised Walsh-Hadamard transform (Sylvester order, as
// mx.hadamard_transform) of one vector spread over a warp, lane j holding dims
// [j * D / 32, (j + 1) * D / 32): butterflies inside the lane, then across lanes (no
// block barriers; a row in shared memory took one a stride).
template <int D>
__device__ __forceinline__ void hadamard_warp(float (&x)[D / 32], int lane) {
  constexpr int DPL = D / 32;
#pragma unroll
  for (int s = 1; s < DPL; s <<= 1) {
#pragma unroll
    for (int k = 0; k < DPL; ++k) {
      if (!(k & s)) {
        const float a = x[k], c = x[k + s];
        x[k] = a + c;
        x[k + s] = a - c;
      }
    }
  }
#pragma unroll
  for (int s = 1; s < 32; s <<= 1) {
#pragma unroll
    for (int k = 0; k < DPL; ++k) {
      const float other = __shfl_xor_sync(FULL_MASK, x[k], s);
      x[k] = (lane & s) ? other - x[k] : x[k] + other;
    }
  }
}

// One vector spread over a warp, as hadamard_warp: x <- H (signs * x) / sqrt(D).
// Shared by encode.cu and the decode kernel's own encoding of a new token, so both give
// the same bits.
template <int D>
__device__ __forceinline__ void rotate_warp(float (&x)[D / 32], const float* signs, int lane) {
  constexpr int DPL = D / 32;
#pragma unroll
  for (int k = 0; k < DPL; ++k) x[k] *= signs[lane * DPL + k];
  hadamard_warp<D>(x, lane);
#pragma unroll
  for (int k = 0; k < DPL; ++k) x[k] *= rsqrtf(float(D));
}

// Codes of y / |y| (the number of boundaries below each coordinate, as
// mx.searchsorted), packed into words[0 .. D * BITS / 32) (shared memory of this warp);
// returns the corrected norm (codec.TurboCodec.encode's).
template <int D, int BITS>
__device__ __forceinline__ float quantize_warp(const float (&y)[D / 32], const float* bounds,
                                               const float* levels, uint32_t* words, int lane) {
  constexpr int DPL = D / 32;
  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < DPL; ++k) sq += y[k] * y[k];
  const float norm = sqrtf(warp_sum(sq)), safe_norm = fmaxf(norm, 1e-30f);
  for (int w = lane; w < D * BITS / 32; w += 32) words[w] = 0u;
  __syncwarp();
  float recon_sq = 0.0f;
#pragma unroll
  for (int k = 0; k < DPL; ++k) {
    const float unit = y[k] / safe_norm;
    int code = 0;
#pragma unroll
    for (int step = 1 << (BITS - 1); step > 0; step >>= 1) {
      if (unit > bounds[code + step - 1]) code += step;
    }
    recon_sq += levels[code] * levels[code];
    const int bit = (lane * DPL + k) * BITS, word = bit >> 5, shift = bit & 31;
    atomicOr(words + word, uint32_t(code) << shift);
    if (shift + BITS > 32) atomicOr(words + word + 1, uint32_t(code) >> (32 - shift));
  }
  const float recon_norm = sqrtf(warp_sum(recon_sq));
  __syncwarp();
  return fminf(norm / fmaxf(recon_norm, 1e-30f), 65504.0f);
}

// A norms word: the key norm (fp16) in the low half, the value norm in the high half.
__device__ __forceinline__ uint32_t norms_word(float k_norm, float v_norm) {
  return uint32_t(__half_as_ushort(__float2half(k_norm))) |
         (uint32_t(__half_as_ushort(__float2half(v_norm))) << 16);
}

}  // namespace turbo
