// Flash attention of a prefill chunk over keys and values in the attention domain,
// on the tensor cores, with TurboKV's rule built in (no mask array).
// One block: BM = 16 * WARPS queries of one query head of one sequence; each warp
// holds 16 query rows and their running (max, sum, output) in registers, and the
// block's warps share each tile of BN keys and values in shared memory.
// Keys come from two sources, read tile by tile at absolute positions (tiles start at
// multiples of BN, so a query's sums run in the same order however the prompt was
// chunked):
//  - A (`ka`, `va`, NA rows from position A0, of A_ROWS a head): the compressed history,
//    dequantized
//    (prefill_attention.py), sink tokens written exactly at their positions. A query at
//    p reads key t here where t < E0 (before the exact tail) or t <= p - WINDOW.
//  - B (`kb`, `vb`, NB rows from position E0): the exact tail. A query at p reads key
//    t here where t > p - WINDOW.
// Either way only t <= p where CAUSAL, and t >= the row's left padding where HAS_PADS
// (`pads`: a batch row's padding before its first token). The chunk's L queries sit at positions
// N - L .. N - 1. `params`: N, L, WINDOW (a huge value for none), E0, A0, NA, NB,
// CAUSAL, query heads, KV heads, A_ROWS; `scale`: the softmax scale.
// STATE_IN: start from `state_o` (unnormalised output, float32) and `state_ml` (max in
// log2 units, sum) of an earlier launch over other positions; FINAL: write `out`
// (normalised, T), else the state (`o_out`, `ml_out`) for the next launch.
// The header's constants: T (query dtype), IS_BF16, D, BN, WARPS, HAS_A, HAS_B,
// STATE_IN, HAS_PADS, FINAL.
using namespace turbo;
constexpr int BM = 16 * WARPS;
constexpr int CH = D / 8;  // 16-byte chunks a row
__shared__ __align__(128) T k_tile[BN * D];
__shared__ __align__(128) T v_tile[BN * D];

const int n_tokens = params[0], L = params[1], window = params[2], e0 = params[3];
const int a0 = params[4], na = params[5], nb = params[6];
const bool causal = params[7] != 0;
const int Hq = params[8], Hkv = params[9], a_rows = params[10];
const float scale_log2 = scale[0] * LOG2E;

// Heads innermost: a GQA group's query heads run side by side and share its tiles
// in L2.
const int h = blockIdx.x, b = blockIdx.z;
const int kvh = h / (Hq / Hkv);
const int pad = HAS_PADS ? pads[b] : 0;
const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
const int g = lane >> 2, t = lane & 3;
const int first_pos = n_tokens - L;  // the chunk's first query's position
const int block_q = blockIdx.y * BM;
const int warp_q = block_q + 16 * warp;
const int pos_lo = first_pos + warp_q + g, pos_hi = pos_lo + 8;  // this lane's two rows
const int warp_pmin = first_pos + warp_q, warp_pmax = first_pos + min(warp_q + 15, L - 1);
const int block_pmin = first_pos + block_q, block_pmax = first_pos + min(block_q + BM - 1, L - 1);

const size_t q_head = (size_t(b) * Hq + h) * L;
const size_t kv_head = size_t(b) * Hkv + kvh;

// The query rows as A fragments, kept in registers (rows past L repeat the last).
uint32_t qf[D / 16][4];
{
  const int r_lo = min(warp_q + g, L - 1), r_hi = min(warp_q + g + 8, L - 1);
  const uint32_t* q_lo = reinterpret_cast<const uint32_t*>(q + (q_head + r_lo) * D);
  const uint32_t* q_hi = reinterpret_cast<const uint32_t*>(q + (q_head + r_hi) * D);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    qf[ks][0] = q_lo[ks * 8 + t];
    qf[ks][1] = q_hi[ks * 8 + t];
    qf[ks][2] = q_lo[ks * 8 + 4 + t];
    qf[ks][3] = q_hi[ks * 8 + 4 + t];
  }
}

float o[D / 8][4];
float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
if constexpr (STATE_IN) {
  const size_t r_lo = q_head + min(warp_q + g, L - 1), r_hi = q_head + min(warp_q + g + 8, L - 1);
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    const float2 lo = *reinterpret_cast<const float2*>(state_o + r_lo * D + nd * 8 + 2 * t);
    const float2 hi = *reinterpret_cast<const float2*>(state_o + r_hi * D + nd * 8 + 2 * t);
    o[nd][0] = lo.x, o[nd][1] = lo.y, o[nd][2] = hi.x, o[nd][3] = hi.y;
  }
  m_lo = state_ml[2 * r_lo], m_hi = state_ml[2 * r_hi];
  // The sum is the row's: one lane of the four holding the row carries it.
  l_lo = t == 0 ? state_ml[2 * r_lo + 1] : 0.0f;
  l_hi = t == 0 ? state_ml[2 * r_hi + 1] : 0.0f;
} else {
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
}

// The tiles each source holds for this block, as absolute positions [from, to).
int a_from = 0, a_to = 0, b_from = 0, b_to = 0;
if constexpr (HAS_A) {
  int last = max(e0 - 1, block_pmax - window);
  if (causal) last = min(last, block_pmax);
  last = min(last, a0 + na - 1);
  a_from = (a0 / BN) * BN;
  a_to = last >= a0 ? last + 1 : a_from;
}
if constexpr (HAS_B) {
  const int first = max(e0, block_pmin - window + 1);
  const int last = causal ? min(block_pmax, e0 + nb - 1) : e0 + nb - 1;
  b_from = (first / BN) * BN;
  b_to = last >= first ? last + 1 : b_from;
}
const int a_tiles = (a_to - a_from + BN - 1) / BN;
const int n_tiles = a_tiles + (b_to - b_from + BN - 1) / BN;

const uint32_t k_base = static_cast<uint32_t>(__cvta_generic_to_shared(k_tile));
const uint32_t v_base = static_cast<uint32_t>(__cvta_generic_to_shared(v_tile));
// A row's chunks sit XOR-swizzled by its low 3 bits: ldmatrix's eight rows of one
// chunk column then fall in eight different bank groups.
auto smem_offset = [](int row, int chunk) { return (row * D + ((chunk ^ (row & 7)) * 8)) * 2; };

// Each lane's ldmatrix addresses, as far as they vary with the lane: a fragment's
// address is one of four of these plus a compile-time offset. Lanes 8i .. 8i + 7 give
// matrix i's rows, whose low 3 bits are the lane's (the swizzle's); keys: matrices 0, 1
// the first 8 keys (dims +0, +8), 2, 3 the next 8; values: 0, 1 the first 8 keys (dims
// +0), 2, 3 dims +8.
uint32_t k_lane[4], v_lane[4];
{
  const int r7 = lane & 7, k_row = ((lane >> 4) & 1) * 8 + r7, v_row = ((lane >> 3) & 1) * 8 + r7;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    k_lane[c] = k_base + k_row * D * 2 + ((2 * c + ((lane >> 3) & 1)) ^ r7) * 16;
    v_lane[c] = v_base + v_row * D * 2 + ((2 * c + ((lane >> 4) & 1)) ^ r7) * 16;
  }
}

auto tile_start = [&](int j) { return j < a_tiles ? a_from + j * BN : b_from + (j - a_tiles) * BN; };
// A tile's copy: each thread copies the same chunk column of every RPP-th row.
constexpr int THREADS = 32 * WARPS, RPP = THREADS / CH;
static_assert(BN % RPP == 0, "a tile is whole passes of the block's threads");
const int my_ch = threadIdx.x % CH, my_row = threadIdx.x / CH;
auto load = [&](uint32_t base, const T* src, int rows, int first_row) {
  const T* from = src + my_ch * 8;
#pragma unroll
  for (int i = 0; i < BN / RPP; ++i) {
    const int row = my_row + i * RPP;
    const int sr = min(max(first_row + row, 0), rows - 1);  // outside: masked below
    // With RPP a multiple of 8 the swizzle is the same for each of a thread's rows.
    const uint32_t at = RPP % 8 == 0 ? smem_offset(my_row, my_ch) + i * RPP * D * 2
                                     : smem_offset(row, my_ch);
    cp_async16_at(base + at, from + size_t(sr) * D);
  }
};
auto load_keys = [&](int j) {
  const int start = tile_start(j);
  if (HAS_A && j < a_tiles) load(k_base, ka + kv_head * a_rows * D, na, start - a0);
  else load(k_base, kb + kv_head * nb * D, nb, start - e0);
};
auto load_values = [&](int j) {
  const int start = tile_start(j);
  if (HAS_A && j < a_tiles) load(v_base, va + kv_head * a_rows * D, na, start - a0);
  else load(v_base, vb + kv_head * nb * D, nb, start - e0);
};
// Whether the query at `pos` reads the key at `key` from this tile's source.
auto reads = [&](bool from_a, int key, int pos) {
  if ((causal && key > pos) || key < pad) return false;
  if (from_a) return key >= a0 && key < a0 + na && (key < e0 || key <= pos - window);
  return key >= e0 && key < e0 + nb && key > pos - window;
};

if (n_tiles > 0) {
  load_keys(0);
  cp_async_commit();
}
for (int j = 0; j < n_tiles; ++j) {
  load_values(j);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // Scores of the warp's 16 rows against the tile's BN keys.
  float s[BN / 8][4];
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < BN / 16; ++np) {
      uint32_t kf[4];
      ldmatrix_x4(kf, k_lane[ks & 3] + np * 16 * D * 2 + (ks >> 2) * 128);
      if constexpr (IS_BF16) {
        mma_16816_bf16(s[2 * np], qf[ks], kf[0], kf[1]);
        mma_16816_bf16(s[2 * np + 1], qf[ks], kf[2], kf[3]);
      } else {
        mma_16816(s[2 * np], qf[ks], kf[0], kf[1]);
        mma_16816(s[2 * np + 1], qf[ks], kf[2], kf[3]);
      }
    }
  }

  const int start = tile_start(j);
  const bool from_a = HAS_A && j < a_tiles;
  const int end = start + BN - 1;
  // The warp's rows all read every key of the tile: no per-score test.
  const bool whole = start < pad ? false
                     : from_a    ? (start >= a0 && end < a0 + na && (!causal || end <= warp_pmin) &&
                               (end < e0 || end <= warp_pmin - window))
                            : (start >= e0 && end < e0 + nb && (!causal || end <= warp_pmin) &&
                               start > warp_pmax - window);
  float tile_max_lo = -INFINITY, tile_max_hi = -INFINITY;
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = start + n * 8 + 2 * t + (i & 1);
      if (!whole && !reads(from_a, key, i < 2 ? pos_lo : pos_hi)) s[n][i] = -INFINITY;
    }
    tile_max_lo = fmaxf(tile_max_lo, fmaxf(s[n][0], s[n][1]));
    tile_max_hi = fmaxf(tile_max_hi, fmaxf(s[n][2], s[n][3]));
  }
  // Scores stay unscaled; the scale (positive) joins the exponent's FMA.
  float row_max_lo = fmaxf(m_lo, tile_max_lo * scale_log2);
  float row_max_hi = fmaxf(m_hi, tile_max_hi * scale_log2);
  row_max_lo = fmaxf(row_max_lo, __shfl_xor_sync(FULL_MASK, row_max_lo, 1));
  row_max_lo = fmaxf(row_max_lo, __shfl_xor_sync(FULL_MASK, row_max_lo, 2));
  row_max_hi = fmaxf(row_max_hi, __shfl_xor_sync(FULL_MASK, row_max_hi, 1));
  row_max_hi = fmaxf(row_max_hi, __shfl_xor_sync(FULL_MASK, row_max_hi, 2));
  // A row with nothing visible yet keeps weight 0 everywhere (no inf - inf).
  const float base_lo = row_max_lo == -INFINITY ? 0.0f : row_max_lo;
  const float base_hi = row_max_hi == -INFINITY ? 0.0f : row_max_hi;
  const float correct_lo = exp2_or_zero(m_lo - base_lo);
  const float correct_hi = exp2_or_zero(m_hi - base_hi);
  m_lo = row_max_lo, m_hi = row_max_hi;
  l_lo *= correct_lo, l_hi *= correct_hi;
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    o[nd][0] *= correct_lo, o[nd][1] *= correct_lo;
    o[nd][2] *= correct_hi, o[nd][3] *= correct_hi;
  }
  uint32_t pf[BN / 16][4];
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
    const float p0 = exp2_or_zero(fmaf(s[n][0], scale_log2, -base_lo));
    const float p1 = exp2_or_zero(fmaf(s[n][1], scale_log2, -base_lo));
    const float p2 = exp2_or_zero(fmaf(s[n][2], scale_log2, -base_hi));
    const float p3 = exp2_or_zero(fmaf(s[n][3], scale_log2, -base_hi));
    l_lo += p0 + p1, l_hi += p2 + p3;
    // The C fragment of keys 8n .. 8n + 7 is half of the A fragment of keys 16(n/2) ..
    pf[n / 2][(n & 1) * 2] = IS_BF16 ? pack_bf162(p0, p1) : pack_half2(p0, p1);
    pf[n / 2][(n & 1) * 2 + 1] = IS_BF16 ? pack_bf162(p2, p3) : pack_half2(p2, p3);
  }

  __syncthreads();  // every warp is done with the key tile
  if (j + 1 < n_tiles) {
    load_keys(j + 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();

#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t vf[4];
      ldmatrix_x4_trans(vf, v_lane[dp & 3] + kk * 16 * D * 2 + (dp >> 2) * 128);
      if constexpr (IS_BF16) {
        mma_16816_bf16(o[2 * dp], pf[kk], vf[0], vf[1]);
        mma_16816_bf16(o[2 * dp + 1], pf[kk], vf[2], vf[3]);
      } else {
        mma_16816(o[2 * dp], pf[kk], vf[0], vf[1]);
        mma_16816(o[2 * dp + 1], pf[kk], vf[2], vf[3]);
      }
    }
  }
  __syncthreads();  // every warp is done with the value tile
}

l_lo += __shfl_xor_sync(FULL_MASK, l_lo, 1);
l_lo += __shfl_xor_sync(FULL_MASK, l_lo, 2);
l_hi += __shfl_xor_sync(FULL_MASK, l_hi, 1);
l_hi += __shfl_xor_sync(FULL_MASK, l_hi, 2);
const int r_lo = warp_q + g, r_hi = warp_q + g + 8;
if constexpr (FINAL) {
  const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f;
  const float inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    const int col = nd * 8 + 2 * t;
    if (r_lo < L) {
      out[(q_head + r_lo) * D + col] = from_float<T>(o[nd][0] * inv_lo);
      out[(q_head + r_lo) * D + col + 1] = from_float<T>(o[nd][1] * inv_lo);
    }
    if (r_hi < L) {
      out[(q_head + r_hi) * D + col] = from_float<T>(o[nd][2] * inv_hi);
      out[(q_head + r_hi) * D + col + 1] = from_float<T>(o[nd][3] * inv_hi);
    }
  }
} else {
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    const int col = nd * 8 + 2 * t;
    if (r_lo < L) {
      *reinterpret_cast<float2*>(o_out + (q_head + r_lo) * D + col) = make_float2(o[nd][0], o[nd][1]);
    }
    if (r_hi < L) {
      *reinterpret_cast<float2*>(o_out + (q_head + r_hi) * D + col) = make_float2(o[nd][2], o[nd][3]);
    }
  }
  if (t == 0 && r_lo < L) {
    ml_out[2 * (q_head + r_lo)] = m_lo, ml_out[2 * (q_head + r_lo) + 1] = l_lo;
  }
  if (t == 0 && r_hi < L) {
    ml_out[2 * (q_head + r_hi)] = m_hi, ml_out[2 * (q_head + r_hi) + 1] = l_hi;
  }
}
