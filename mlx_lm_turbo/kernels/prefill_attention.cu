// Flash attention of a prefill chunk over keys and values in the attention domain,
// on the tensor cores, with TurboKV's rule built in (no mask array).
// One block: BM = 16 * MT * WARPS queries of one query head of one sequence, copied
// once into shared memory; each warp holds MT m-tiles of 16 query rows and their
// running (max, sum, output) in registers, and the block's warps share each tile of
// BN keys and values in shared memory (two m-tiles a warp read each key and value
// fragment twice for one load).
// Keys come from two sources, read tile by tile at absolute positions (tiles start at
// multiples of BN, so a query's sums run in the same order however the prompt was
// chunked):
//  - A (`ka`, `va`, NA rows from position A0, of A_ROWS a head): the compressed history,
//    dequantized (prefill_attention.py), sink tokens written exactly at their
//    positions. A query at p reads key t here where t < E0 (before the exact tail) or
//    t <= p - WINDOW.
//  - B (`kb`, `vb`, NB rows from position E0): the exact tail. A query at p reads key
//    t here where t > p - WINDOW.
// Either way only t <= p where CAUSAL, and t >= the row's left padding where HAS_PADS
// (`pads`: a batch row's padding before its first token). The chunk's L queries sit at positions
// N - L .. N - 1. `params`: N, L, WINDOW (a huge value for none), E0, A0, NA, NB,
// CAUSAL, query heads, KV heads, A_ROWS; `scale`: the softmax scale.
// STATE_IN: start from `state_o` (unnormalised output, float32) and `state_ml` (max in
// log2 units, sum) of an earlier launch over other positions; FINAL: write `out`
// (normalised, T), else the state (`o_out`, `ml_out`) for the next launch.
// WGMMA (Hopper, sm_90a; wgmma.cuh): each warpgroup of four warps runs its 64 query
// rows' products as warpgroup MMAs straight from shared memory (queries and keys) and
// from registers (softmax weights), tiles held in the core-matrix layout (a 16-byte
// chunk's place is its copy's index); otherwise each warp runs mma.sync from
// ldmatrix fragments of XOR-swizzled rows. Both hold a warp's scores and running
// output in the same fragment layout, so the softmax is one code.
// The header's constants: T (query dtype), IS_BF16, WGMMA, D, BN, MT, WARPS, HAS_A,
// HAS_B, STATE_IN, HAS_PADS, FINAL.
using namespace turbo;
constexpr int ROWS = 16 * MT;  // query rows a warp
constexpr int BM = ROWS * WARPS;
constexpr int CH = D / 8;  // 16-byte chunks a row
static_assert(!WGMMA || (MT == 1 && WARPS % 4 == 0), "a warpgroup's warps hold 16 rows each");
// Dynamic shared memory (prefill_attention.Tiling.shared_bytes): two key tiles, two value
// tiles (tile j + 1 is copied in while tile j is read), then the block's queries.
constexpr uint32_t TILE_BYTES = BN * D * 2;
DYNAMIC_SHARED_ARRAY(tiles);
T* const k_tile = reinterpret_cast<T*>(tiles);
T* const v_tile = k_tile + 2 * BN * D;
T* const q_tile = v_tile + 2 * BN * D;

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
const int warp_q = block_q + ROWS * warp;
const int warp_pmin = first_pos + warp_q, warp_pmax = first_pos + min(warp_q + ROWS - 1, L - 1);
const int block_pmin = first_pos + block_q, block_pmax = first_pos + min(block_q + BM - 1, L - 1);

const size_t q_head = (size_t(b) * Hq + h) * L;
const size_t kv_head = size_t(b) * Hkv + kvh;

// This lane's rows: m-tile i holds rows warp_q + 16 i + g (lo) and + 8 (hi).
float o[MT][D / 8][4];
float m_lo[MT], m_hi[MT], l_lo[MT], l_hi[MT];
#pragma unroll
for (int i = 0; i < MT; ++i) {
  const size_t r_lo = q_head + min(warp_q + 16 * i + g, L - 1);
  const size_t r_hi = q_head + min(warp_q + 16 * i + g + 8, L - 1);
  if constexpr (STATE_IN) {
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const float2 lo = *reinterpret_cast<const float2*>(state_o + r_lo * D + nd * 8 + 2 * t);
      const float2 hi = *reinterpret_cast<const float2*>(state_o + r_hi * D + nd * 8 + 2 * t);
      o[i][nd][0] = lo.x, o[i][nd][1] = lo.y, o[i][nd][2] = hi.x, o[i][nd][3] = hi.y;
    }
    m_lo[i] = state_ml[2 * r_lo], m_hi[i] = state_ml[2 * r_hi];
    // The sum is the row's: one lane of the four holding the row carries it.
    l_lo[i] = t == 0 ? state_ml[2 * r_lo + 1] : 0.0f;
    l_hi[i] = t == 0 ? state_ml[2 * r_hi + 1] : 0.0f;
  } else {
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) o[i][nd][0] = o[i][nd][1] = o[i][nd][2] = o[i][nd][3] = 0.0f;
    m_lo[i] = m_hi[i] = -INFINITY;
    l_lo[i] = l_hi[i] = 0.0f;
  }
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
const uint32_t q_base = static_cast<uint32_t>(__cvta_generic_to_shared(q_tile));
// A row's chunks sit XOR-swizzled by its low 3 bits: ldmatrix's eight rows of one
// chunk column then fall in eight different bank groups.
auto smem_offset = [](int row, int chunk) { return (row * D + ((chunk ^ (row & 7)) * 8)) * 2; };

// Each lane's ldmatrix addresses, as far as they vary with the lane: a fragment's
// address is one of four of these plus a compile-time offset. Lanes 8i .. 8i + 7 give
// matrix i's rows, whose low 3 bits are the lane's (the swizzle's); queries: matrices
// 0, 1 rows 0-7, 8-15 (dims +0), 2, 3 dims +8; keys: 0, 1 the first 8 keys (dims +0,
// +8), 2, 3 the next 8; values: 0, 1 the first 8 keys (dims +0), 2, 3 dims +8.
uint32_t q_lane[4], k_lane[4], v_lane[4];
{
  const int r7 = lane & 7, hi8 = ((lane >> 3) & 1) * 8, hi16 = ((lane >> 4) & 1) * 8;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    q_lane[c] = q_base + (ROWS * warp + hi8 + r7) * D * 2 + ((2 * c + (lane >> 4)) ^ r7) * 16;
    k_lane[c] = k_base + (hi16 + r7) * D * 2 + ((2 * c + ((lane >> 3) & 1)) ^ r7) * 16;
    v_lane[c] = v_base + (hi8 + r7) * D * 2 + ((2 * c + ((lane >> 4) & 1)) ^ r7) * 16;
  }
}

auto tile_start = [&](int j) { return j < a_tiles ? a_from + j * BN : b_from + (j - a_tiles) * BN; };
// A tile's copy: each thread copies the same chunk column of every RPP-th row.
constexpr int THREADS = 32 * WARPS, RPP = THREADS / CH;
static_assert(BN % RPP == 0 && BM % RPP == 0 && BN * CH % THREADS == 0 && BM * CH % THREADS == 0,
              "a tile is whole passes of the block's threads");
const int my_ch = threadIdx.x % CH, my_row = threadIdx.x / CH;
auto load = [&](uint32_t base, const T* src, int n_rows, int rows, int first_row) {
  if constexpr (WGMMA) {
    // Chunk `at` of the tile: row (at / 8CH) * 8 + at % 8, chunk (at / 8) % CH, so
    // each core matrix (8 rows of a chunk column) is 128 contiguous bytes.
#pragma unroll
    for (int i = 0; i < n_rows * CH / THREADS; ++i) {
      const int at = threadIdx.x + i * THREADS;
      const int row = at / (8 * CH) * 8 + at % 8, ch = at / 8 % CH;
      const int sr = min(max(first_row + row, 0), rows - 1);  // outside: masked below
      cp_async16_at(base + at * 16, src + size_t(sr) * D + ch * 8);
    }
    return;
  }
  const T* from = src + my_ch * 8;
#pragma unroll
  for (int i = 0; i < n_rows / RPP; ++i) {
    const int row = my_row + i * RPP;
    const int sr = min(max(first_row + row, 0), rows - 1);  // outside: masked below
    // With RPP a multiple of 8 the swizzle is the same for each of a thread's rows.
    const uint32_t at = RPP % 8 == 0 ? smem_offset(my_row, my_ch) + i * RPP * D * 2
                                     : smem_offset(row, my_ch);
    cp_async16_at(base + at, from + size_t(sr) * D);
  }
};
// Tile j's keys and values into buffer j % 2.
auto load_tile = [&](int j) {
  const int start = tile_start(j);
  const uint32_t buffer = (j & 1) * TILE_BYTES;
  if (HAS_A && j < a_tiles) {
    load(k_base + buffer, ka + kv_head * a_rows * D, BN, na, start - a0);
    load(v_base + buffer, va + kv_head * a_rows * D, BN, na, start - a0);
  } else {
    load(k_base + buffer, kb + kv_head * nb * D, BN, nb, start - e0);
    load(v_base + buffer, vb + kv_head * nb * D, BN, nb, start - e0);
  }
};
// Whether the query at `pos` reads the key at `key` from this tile's source.
auto reads = [&](bool from_a, int key, int pos) {
  if ((causal && key > pos) || key < pad) return false;
  if (from_a) return key >= a0 && key < a0 + na && (key < e0 || key <= pos - window);
  return key >= e0 && key < e0 + nb && key > pos - window;
};

// The block's queries (rows past L repeat the last), with the first tile.
load(q_base, q + q_head * D, BM, L, block_q);
if (n_tiles > 0) load_tile(0);
cp_async_commit();
for (int j = 0; j < n_tiles; ++j) {
  // The next tile's copy runs while this one is read: its buffer's last reader was
  // tile j - 1, which every warp has finished (the barrier ending each tile).
  if (j + 1 < n_tiles) {
    load_tile(j + 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  if constexpr (WGMMA) fence_async_shared();
  __syncthreads();
  const uint32_t buffer = (j & 1) * TILE_BYTES;

  // Scores of the warp's rows against the tile's BN keys.
  float s[MT][BN / 8][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.0f;
  }
  if constexpr (WGMMA) {
    // K-major queries and keys: a k-step is two chunk columns (256 bytes on), a
    // row group (8 rows) is CH core matrices (D * 16 bytes).
    const uint32_t q_rows = q_base + warp / 4 * 64 * D * 2;
    fence_registers(s[0]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      wgmma_ss<IS_BF16>(s[0], smem_desc(q_rows + ks * 256, 128, D * 16),
                        smem_desc(k_base + buffer + ks * 256, 128, D * 16), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s[0]);
  }
#pragma unroll
  for (int ks = 0; !WGMMA && ks < D / 16; ++ks) {
    uint32_t qf[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) ldmatrix_x4(qf[i], q_lane[ks & 3] + i * 16 * D * 2 + (ks >> 2) * 128);
#pragma unroll
    for (int np = 0; np < BN / 16; ++np) {
      uint32_t kf[4];
      ldmatrix_x4(kf, k_lane[ks & 3] + buffer + np * 16 * D * 2 + (ks >> 2) * 128);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if constexpr (IS_BF16) {
          mma_16816_bf16(s[i][2 * np], qf[i], kf[0], kf[1]);
          mma_16816_bf16(s[i][2 * np + 1], qf[i], kf[2], kf[3]);
        } else {
          mma_16816(s[i][2 * np], qf[i], kf[0], kf[1]);
          mma_16816(s[i][2 * np + 1], qf[i], kf[2], kf[3]);
        }
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
  uint32_t pf[MT][BN / 16][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int pos_lo = first_pos + warp_q + 16 * i + g, pos_hi = pos_lo + 8;
    float tile_max_lo = -INFINITY, tile_max_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = start + n * 8 + 2 * t + (c & 1);
        if (!whole && !reads(from_a, key, c < 2 ? pos_lo : pos_hi)) s[i][n][c] = -INFINITY;
      }
      tile_max_lo = fmaxf(tile_max_lo, fmaxf(s[i][n][0], s[i][n][1]));
      tile_max_hi = fmaxf(tile_max_hi, fmaxf(s[i][n][2], s[i][n][3]));
    }
    // Scores stay unscaled; the scale (positive) joins the exponent's FMA.
    float row_max_lo = fmaxf(m_lo[i], tile_max_lo * scale_log2);
    float row_max_hi = fmaxf(m_hi[i], tile_max_hi * scale_log2);
    row_max_lo = fmaxf(row_max_lo, __shfl_xor_sync(FULL_MASK, row_max_lo, 1));
    row_max_lo = fmaxf(row_max_lo, __shfl_xor_sync(FULL_MASK, row_max_lo, 2));
    row_max_hi = fmaxf(row_max_hi, __shfl_xor_sync(FULL_MASK, row_max_hi, 1));
    row_max_hi = fmaxf(row_max_hi, __shfl_xor_sync(FULL_MASK, row_max_hi, 2));
    // A row with nothing visible yet keeps weight 0 everywhere (no inf - inf).
    const float base_lo = row_max_lo == -INFINITY ? 0.0f : row_max_lo;
    const float base_hi = row_max_hi == -INFINITY ? 0.0f : row_max_hi;
    const float correct_lo = exp2_or_zero(m_lo[i] - base_lo);
    const float correct_hi = exp2_or_zero(m_hi[i] - base_hi);
    m_lo[i] = row_max_lo, m_hi[i] = row_max_hi;
    l_lo[i] *= correct_lo, l_hi[i] *= correct_hi;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      o[i][nd][0] *= correct_lo, o[i][nd][1] *= correct_lo;
      o[i][nd][2] *= correct_hi, o[i][nd][3] *= correct_hi;
    }
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      const float p0 = exp2_or_zero(fmaf(s[i][n][0], scale_log2, -base_lo));
      const float p1 = exp2_or_zero(fmaf(s[i][n][1], scale_log2, -base_lo));
      const float p2 = exp2_or_zero(fmaf(s[i][n][2], scale_log2, -base_hi));
      const float p3 = exp2_or_zero(fmaf(s[i][n][3], scale_log2, -base_hi));
      l_lo[i] += p0 + p1, l_hi[i] += p2 + p3;
      // The C fragment of keys 8n .. 8n + 7 is half of the A fragment of keys 16(n/2) ..
      pf[i][n / 2][(n & 1) * 2] = IS_BF16 ? pack_bf162(p0, p1) : pack_half2(p0, p1);
      pf[i][n / 2][(n & 1) * 2 + 1] = IS_BF16 ? pack_bf162(p2, p3) : pack_half2(p2, p3);
    }
  }


  if constexpr (WGMMA) {
    // The values as an MN-major operand: a k-step is 16 keys (two row groups on),
    // the next 8 dims the next core matrix (128 bytes on).
    fence_registers(o[0]);
    fence_registers(pf[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      wgmma_rs_trans_b<IS_BF16>(o[0], pf[0][kk], smem_desc(v_base + buffer + kk * 32 * D, D * 16, 128), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o[0]);
  }
#pragma unroll
  for (int kk = 0; !WGMMA && kk < BN / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t vf[4];
      ldmatrix_x4_trans(vf, v_lane[dp & 3] + buffer + kk * 16 * D * 2 + (dp >> 2) * 128);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if constexpr (IS_BF16) {
          mma_16816_bf16(o[i][2 * dp], pf[i][kk], vf[0], vf[1]);
          mma_16816_bf16(o[i][2 * dp + 1], pf[i][kk], vf[2], vf[3]);
        } else {
          mma_16816(o[i][2 * dp], pf[i][kk], vf[0], vf[1]);
          mma_16816(o[i][2 * dp + 1], pf[i][kk], vf[2], vf[3]);
        }
      }
    }
  }
  __syncthreads();  // every warp is done with this tile's buffers
}
cp_async_wait<0>();  // the queries' copy, where no tile ran

#pragma unroll
for (int i = 0; i < MT; ++i) {
  float sum_lo = l_lo[i], sum_hi = l_hi[i];
  sum_lo += __shfl_xor_sync(FULL_MASK, sum_lo, 1);
  sum_lo += __shfl_xor_sync(FULL_MASK, sum_lo, 2);
  sum_hi += __shfl_xor_sync(FULL_MASK, sum_hi, 1);
  sum_hi += __shfl_xor_sync(FULL_MASK, sum_hi, 2);
  const int r_lo = warp_q + 16 * i + g, r_hi = r_lo + 8;
  if constexpr (FINAL) {
    const float inv_lo = sum_lo > 0.0f ? 1.0f / sum_lo : 0.0f;
    const float inv_hi = sum_hi > 0.0f ? 1.0f / sum_hi : 0.0f;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int col = nd * 8 + 2 * t;
      if (r_lo < L) {
        out[(q_head + r_lo) * D + col] = from_float<T>(o[i][nd][0] * inv_lo);
        out[(q_head + r_lo) * D + col + 1] = from_float<T>(o[i][nd][1] * inv_lo);
      }
      if (r_hi < L) {
        out[(q_head + r_hi) * D + col] = from_float<T>(o[i][nd][2] * inv_hi);
        out[(q_head + r_hi) * D + col + 1] = from_float<T>(o[i][nd][3] * inv_hi);
      }
    }
  } else {
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int col = nd * 8 + 2 * t;
      if (r_lo < L) {
        *reinterpret_cast<float2*>(o_out + (q_head + r_lo) * D + col) = make_float2(o[i][nd][0], o[i][nd][1]);
      }
      if (r_hi < L) {
        *reinterpret_cast<float2*>(o_out + (q_head + r_hi) * D + col) = make_float2(o[i][nd][2], o[i][nd][3]);
      }
    }
    if (t == 0 && r_lo < L) {
      ml_out[2 * (q_head + r_lo)] = m_lo[i], ml_out[2 * (q_head + r_lo) + 1] = sum_lo;
    }
    if (t == 0 && r_hi < L) {
      ml_out[2 * (q_head + r_hi)] = m_hi[i], ml_out[2 * (q_head + r_hi) + 1] = sum_hi;
    }
  }
}
