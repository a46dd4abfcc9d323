// One block: one slice of one sequence's tokens (or its exact tokens), one KV head,
// R query rows of its GQA group. It writes the slice's unnormalised output rows and
// their (max, sum) in log2 units; the group's last block to finish merges every
// slice (log-sum-exp), adds the attention-sink logit, rotates the rows back out of
// the value rotation and writes them: one launch a layer. Each token's codes and
// norms come in one row (codec.join_rows): KW words of key codes (none where the
// keys come as they are, in `keys`), VW of value codes, one of both fp16 norms.
// The header's constants: T (query dtype), MT (mask dtype), SHAPE (D, G, L, R), CODE
// (KB, VB, NW, FLAGS: decode_attention.py's flags()) and WINDOW (TurboKV.window, 0 for
// none), a variant's template values; MAX_SINKS, STAGE_BUFFERS, MERGE_CHUNK and
// VALUE_MMA_MAX_DIM.
// `consts` holds the key signs (D), value
// signs (D), key levels (2^KB where KB > 0), value levels (2^VB), the softmax scale,
// key boundaries (2^KB - 1) and value boundaries (2^VB - 1). A raw tail (RAW_TAIL: one
// decode token, its key and value as the model gave them) is encoded here as encode.cu
// encodes it (same code, common.cuh): the exact blocks read it rotated from shared
// memory, the head's first exact block writes its packed row to `new_rows`, which the
// cache stores after the call (one launch a decode layer instead of two), and with
// ROW_IN_PLACE into the token's reserved slot of `rows` as well (the cache owns that
// buffer alone; it then needs no update op, and no copy of its layer). `workspace`,
// which every launch shares: its first row holds a counter per group, zero on entry and
// left zero on exit, so nothing needs filling per call (a fill is one more launch); the
// rows after it the slices' rows and their (max, sum). `previous` (unread) is the last
// launch's output, so MLX runs the launches sharing the workspace in order. RECENT (a
// raw tail with a window of exact recent tokens): `recent` holds, per head, TAIL_FROM
// words (the last launch's packed row, unread here), then the W - 1 tokens before the
// raw one, each as one row of 4D values of T (key and value in the attention domain,
// then key and value as the model gave them); the exact tail is those and the raw
// token. The head's first exact block writes `next_recent` alike, one token on: the raw
// token's packed row first (instead of into `new_rows`: one output fewer), its 4D values
// last; the cache keeps it for the next step.
using namespace turbo;
constexpr int D = SHAPE & 1023, G = (SHAPE >> 10) & 255, L = (SHAPE >> 18) & 15;
constexpr int R = SHAPE >> 22;
constexpr int KB = CODE & 15, VB = (CODE >> 4) & 15, NW = (CODE >> 8) & 31;
constexpr int FLAGS = CODE >> 13;
constexpr int MASK_KIND = FLAGS & 3;  // 0 none, 1 causal, 2 an array
constexpr bool MASK_BOOL = FLAGS & 4, HAS_KSCALE = FLAGS & 8, HAS_TAIL = FLAGS & 16;
constexpr bool HAS_SINK_TOKENS = FLAGS & 32, HAS_SINKS = FLAGS & 64;  // HAS_SINKS: logits
constexpr bool RAW_TAIL = FLAGS & 128, HAS_KMEAN = FLAGS & 256, ROW_IN_PLACE = FLAGS & 512;
constexpr bool RECENT = FLAGS & 1024;
const float* k_signs = consts;
const float* v_signs = consts + D;
const float* k_levels_in = consts + 2 * D;
const float* v_levels_in = k_levels_in + (KB > 0 ? 1 << KB : 0);
const float* scale = v_levels_in + (1 << VB);
const float* k_bounds = scale + 1;
const float* v_bounds = k_bounds + (KB > 0 ? (1 << KB) - 1 : 0);
constexpr int DPL = D / 32;  // dims per lane when accumulating values
constexpr int THREADS = NW * 32;
constexpr int ROWS = G * L;  // query rows per KV head
constexpr int NRG = (ROWS + R - 1) / R;
constexpr int KBW = KB > 0 ? KB : 1;  // words per 32-key-code group (KB = 0: unused)
constexpr int KW = KB > 0 ? D * KB / 32 : 0, VW = D * VB / 32, NORMS = KW + VW;
// Key scores on the tensor cores where a pair of key codes indexes a small table of
// level pairs or two shuffles read its levels (2-5 bits: 6-bit pairs would be 4096
// words) and a tile's whole rows fit the staging memory: each warp multiplies 16
// tokens' decoded keys at a time (A: every row of the MMA is a token) by its query
// rows (B: fp16 fragments of 8 rows, kept in registers) instead of reading every
// query value from shared memory per dim.
// fp16 tensor-core math only for fp16/bf16 models: a float32 model keeps float32 scores.
constexpr bool HALF_MATH = sizeof(T) == 2;
constexpr int RW = NORMS + 1;  // words per row
constexpr int TAIL_FROM = (RW + 3) / 4 * 4;  // RECENT: where the rows start (16-byte aligned)
constexpr int KEY_PAIR_BYTES = KB >= 2 && KB <= 5 ? 4 << (2 * KB) : 0;
// Where a quarter of a token's key codes is whole words, or is read as if it were
// (KEY_WORD_PAIRS, below), 4- and 5-bit keys read no k_pairs table (lane pairs, counted
// where chosen, or shuffles).
constexpr bool KEY_QUARTER_WORDS = (D * KBW) % 128 == 0;
constexpr bool KEY_QUARTER_SHIFTED = !KEY_QUARTER_WORDS && KB >= 2 && KB <= 5;
constexpr int KEY_TABLE_BYTES =
    KB >= 4 && (KEY_QUARTER_WORDS || KEY_QUARTER_SHIFTED) ? 0 : KEY_PAIR_BYTES;
constexpr bool KEY_MMA = HALF_MATH && KEY_PAIR_BYTES > 0 && D % 16 == 0 &&
                         NW * 32 * RW * 4 + KEY_TABLE_BYTES <= 36 * 1024;
// The value sum on the tensor cores too (O^T += V^T P^T per 16 tokens): lane group g
// (lane / 4) holds dims GD * g .. GD * (g + 1) - 1 of each token, so its value codes are
// one run of bits; its accumulators are rows 2t, 2t + 1 (t = lane % 4) of those dims.
// Up to head dim VALUE_MMA_MAX_DIM (the header's: decode_attention.py says why).
constexpr bool VALUE_MMA =
    HALF_MATH && VB >= 2 && VB <= 4 && D % 16 == 0 && D <= VALUE_MMA_MAX_DIM && R <= 8;
constexpr int GD = D / 8, GB = GD * VB, GW = (GB + 31) / 32;  // dims, bits, words per group
// A register of A holds one dim's levels for two tokens (v_pairs or shuffles, below).
// Where each group's bits are whole words (VGW > 0), the k slots' tokens are permuted
// so that a warp's reads of value words and of packed weights hit distinct banks (rows
// of an odd word count); pairs of slots are tokens PAIR_DELTA apart.
constexpr int VGW = GB % 32 == 0 ? GB / 32 : 0;
constexpr int PAIR_DELTA = VGW == 2 ? 2 : 1;
// Key pairs: where a quarter of a token's key codes is whole words (D * KB a multiple of
// 128: every width at head dim 128 and 256, 3 bits included), lane t of a token's four
// reads that quarter, KEY_LANE_WORDS words, and feeds every pair in it to the tensor
// cores (a pair of 3-bit codes may straddle two of those words; the query's fragments
// follow the same order of dims). Keys whose quarter is not whole words (3 and 5 bits
// at head dim 64: 48 and 80 bits) alike, the words funnel-shifted to start at the quarter
// (the bits past it, the next quarter's or the row's values, go unread): that cut the
// 3-bit key loop at head dim 64 from 179 to 88 SASS instructions per 16 tokens (turbo4's
// 83). Else PTX's order of dims, each pair read on its own.
constexpr bool KEY_WORD_PAIRS = KEY_MMA && (KEY_QUARTER_WORDS || KEY_QUARTER_SHIFTED);
constexpr int KEY_LANE_WORDS = KEY_WORD_PAIRS ? (D * KBW / 4 + 31) / 32 : 1;
// What a warp stages per tile: whole rows (KEY_MMA) or the value codes alone; where a
// row's staging starts in the row, and where its value codes sit in the stage. Two
// buffers where they fit, so the next tile's copy runs while this one is read.
constexpr int STAGE_STRIDE = KEY_MMA ? RW : VW, STAGE_FROM = KEY_MMA ? 0 : KW;
constexpr int STAGE_VALUES = KEY_MMA ? KW : 0;
constexpr int STAGE_TILE = 32 * STAGE_STRIDE;  // words of one tile's stage
// Whether `buffers` staging buffers and `table_bytes` of pair tables fit the 48 KiB of
// static shared memory beside the arrays that grow with R (the query rows and their
// transpose, a tile's weights, its key dots and its fp16 weight pairs); 46 KiB leave the
// fixed arrays room. The one test of both choices below.
constexpr int ROWS_BYTES = 4 * R * (2 * D + 2 * 32 * NW) + (VALUE_MMA ? 4 * NW * R * 17 : 0);
constexpr auto fits_shared = [](int buffers, int table_bytes) {
  return buffers * NW * STAGE_TILE * 4 + ROWS_BYTES + table_bytes <= 46 * 1024;
};
// 4-bit keys (word pairs) and 4-bit values on the tensor cores: one read of a table of
// the 256 level pairs makes an A register, the table held PAIR_COPIES times side by side
// (lane l reads copy l mod 16: at most two lanes a bank; fewer instructions than
// shuffles). A plain 256-pair table's reads collide in the banks (2.6-way for 4-bit
// keys). In the static 48 KiB it
// fits beside one staging buffer only. DYNAMIC_SHARED (the header's bytes,
// decode_attention.dynamic_shared()): the table and two staging buffers in dynamic
// shared memory instead, so the next tile's copy runs while this one is read (about 1%
// faster; 32 copies, one a bank, with one buffer were no faster).
constexpr bool DYNAMIC = DYNAMIC_SHARED > 0;
constexpr int LANE_PAIRS_BYTES = 4 * 256 * PAIR_COPIES;  // PAIR_COPIES: decode_attention.py
constexpr bool KEY_PAIRS_4BIT = KEY_WORD_PAIRS && KB == 4;
constexpr bool VALUE_PAIRS_4BIT = VALUE_MMA && VB == 4;
constexpr bool LANE_PAIRS = (KEY_PAIRS_4BIT || VALUE_PAIRS_4BIT) &&
                            (DYNAMIC || fits_shared(STAGE_BUFFERS == 2 ? 2 : 1, LANE_PAIRS_BYTES));
constexpr bool KEY_LANE_PAIRS = LANE_PAIRS && KEY_PAIRS_4BIT;
constexpr bool VALUE_LANE_PAIRS = LANE_PAIRS && VALUE_PAIRS_4BIT;
constexpr int LANE_PAIRS_TABLE_BYTES = LANE_PAIRS ? LANE_PAIRS_BYTES : 0;
// 3-bit values alike: the 64 level pairs held PAIR_COPIES times (4 KiB), at a shared
// address aligned to its size, so that an entry's address is this lane's copy OR a 6-bit
// pair field in place: a shift and a LOP3 a register (lane_pair3, below), where two
// shifts, two shuffles and a permute were. The alignment is found at run time in room
// 4 KiB larger: __align__ above 1 KiB does not hold in the shared window (its first KiB
// is reserved), and adding the table's address cost an instruction a register.
constexpr int LANE_PAIRS3_BYTES = 4 * 64 * PAIR_COPIES, LANE_PAIRS3_ROOM = 2 * LANE_PAIRS3_BYTES;
constexpr bool VALUE_LANE_PAIRS3 =
    VALUE_MMA && VB == 3 &&
    fits_shared(STAGE_BUFFERS == 2 ? 2 : 1, LANE_PAIRS_TABLE_BYTES + LANE_PAIRS3_ROOM);
// 5-bit word pairs (and 4-bit ones where the lane pairs do not fit): lane i holds key
// level i mod 2^KB in both halves and a code reads it by a warp shuffle, as 3-bit
// values are read (k_lane, below); the 5-bit pair table would be 4 KiB, and its reads
// collide.
constexpr bool KEY_SHUFFLES = KEY_WORD_PAIRS && (KB == 5 || (KB == 4 && !KEY_LANE_PAIRS));
// Keys' level pairs in one plain table (k_pairs, below) where neither of those serves:
// the rule KEY_MMA's fit counted (KEY_TABLE_BYTES).
constexpr bool KEY_PAIR_TABLE = KEY_MMA && KEY_TABLE_BYTES > 0;
static_assert(!(KEY_PAIR_TABLE && (KEY_SHUFFLES || KEY_LANE_PAIRS)));
// The second buffer where it fits beside the pair tables (always with DYNAMIC).
// STAGE_BUFFERS (the header's; 0: this choice) forces one or two, for launch-bound
// sweeps (the host asks for no dynamic memory where it forces one).
constexpr int NBUF = STAGE_BUFFERS > 0 ? STAGE_BUFFERS
                     : DYNAMIC ? 2
                     : fits_shared(2, (KEY_PAIR_TABLE ? KEY_PAIR_BYTES : 0) +
                                          LANE_PAIRS_TABLE_BYTES +
                                          (VALUE_LANE_PAIRS3 ? LANE_PAIRS3_ROOM : 0))
                         ? 2
                         : 1;

// Sizes come with the arrays, so no per-call scalars need uploading.
constexpr bool HAS_EXACT = HAS_TAIL || HAS_SINK_TOKENS;
const int n_tokens = rows_shape[2];
const int n_splits = gridDim.x - (HAS_EXACT ? 1 : 0);
const int split_len = ((n_tokens + n_splits - 1) / n_splits + 31) / 32 * 32;
const int n_recent = RECENT ? int((recent_shape[3] - TAIL_FROM) / (D * sizeof(T))) : 0;
const int n_exact = HAS_TAIL ? tail_keys_shape[2] + n_recent : 0;
const int n_sinks = HAS_SINK_TOKENS ? sink_pos_shape[2] : 0;
const int n_kv_heads = rows_shape[1];
const int rg = blockIdx.y % NRG, h = (blockIdx.y / NRG) % n_kv_heads;
const int b = blockIdx.y / (NRG * n_kv_heads);
const int split = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
// PHASE_TIMES (benchmarks/block_phases.py): each block's record of PHASE_WORDS words at
// the workspace's end, in block order: its start on the GPU's clock (ns, low and high
// word), its SM, its role (1: the exact block; 2: a chunk's merger; 4: the group's),
// then the ns from its start to the end of its prologue, of its tokens, of writing its
// part, of merging its chunk, and to its end, as thread 0 reaches them (0: no such
// phase).
uint32_t* const phase_record =
    const_cast<uint32_t*>(workspace) + int64_t(workspace_shape[0]) * workspace_shape[1] -
    (int64_t(gridDim.y - blockIdx.y) * gridDim.x - blockIdx.x) * PHASE_WORDS;
const uint64_t phase_start = PHASE_TIMES ? global_time_ns() : 0;
auto phase = [&](int slot, uint32_t role) {
  if (PHASE_TIMES && threadIdx.x == 0) {
    phase_record[slot] = uint32_t(global_time_ns() - phase_start);
    phase_record[3] |= role;
  }
};
if (PHASE_TIMES && threadIdx.x == 0) {
  phase_record[0] = uint32_t(phase_start), phase_record[1] = uint32_t(phase_start >> 32);
  phase_record[2] = sm_index(), phase_record[3] = HAS_EXACT && split == n_splits;
  for (int i = 4; i < PHASE_WORDS; ++i) phase_record[i] = 0u;
}
const int first_query = n_tokens - L;  // position of query row i is first_query + i
// This head's recent rows.
const T* recent_rows =
    reinterpret_cast<const T*>(recent + b * recent_strides[0] + h * recent_strides[1] + TAIL_FROM);
const int64_t tail_words = TAIL_FROM + int64_t(n_recent) * D * sizeof(T);

// [r][d]: the merged rows; the query fragments past D 128. With DYNAMIC at the staging
// memory's end (16-byte aligned), past the warps' accumulators and the parts' weights
// (at most 64 parts, as MERGE_CHUNK and MAX_SLICES allow) that the final merge reads.
__shared__ __align__(16) float q_rows_static[DYNAMIC ? 1 : R * D];
__shared__ __align__(16) float q_t[D * R];  // [d][r]: a dim's rows in one broadcast read
__shared__ float k_levels[KB > 0 ? (1 << KB) : 1];
// The value levels: float, or fp16 for the tensor cores (VALUE_MMA): for VB = 2 a table
// of the 16 level pairs of two codes (one read per A register); for VB = 4 and 3 the lane
// pairs (above); where those do not fit, each lane holds one level and a code reads it
// by a warp shuffle (v_lane, below).
constexpr bool VALUE_PAIR_TABLE = VB == 2;
__shared__ float v_levels[VALUE_MMA ? 1 : 1 << VB];
__shared__ uint32_t lane_pairs_static[LANE_PAIRS && !DYNAMIC ? LANE_PAIRS_BYTES / 4 : 1];
DYNAMIC_SHARED_ARRAY(dynamic_shared);
uint32_t* const lane_pairs = DYNAMIC ? dynamic_shared : lane_pairs_static;
__shared__ uint32_t lane_pairs3_room[VALUE_LANE_PAIRS3 ? LANE_PAIRS3_ROOM / 4 : 1];
// Aligned to its 64 bytes, as the 2- and 3-bit key pairs are (KEY_PAIR_OR, below): an
// entry's address is the table's OR the pair's byte offset, one LOP3 where adding it
// cost another instruction (turbo2's value loop 166 -> 134 per 16 tokens).
__shared__ __align__(64) uint32_t v_pairs[VALUE_MMA && VALUE_PAIR_TABLE ? 1 << (2 * VB) : 1];
const uint32_t v_pairs_at = static_cast<uint32_t>(__cvta_generic_to_shared(v_pairs));
// A compressed tile's softmax weights x value norms as the tensor cores' B fragments
// read them: fp16 pairs of tokens, rows 17 words apart (distinct banks).
__shared__ uint32_t weight_pairs[VALUE_MMA ? NW : 1][R][17];
__shared__ float warp_m[NW][R], warp_l[NW][R];
// Each warp stages a tile's rows (or value codes) here (one global round trip per tile,
// not per token); once every tile is done the same memory merges the warps' outputs.
// One word to spare past them: value_bits may read a word past a token's value codes.
// Aligned to 128 bytes (a tile's stage is 128 x RW bytes): a tile copy's 16-byte pieces
// then fill whole 128-byte lines, where 16-byte alignment left turbo3's at 64 bytes past
// one and doubled its shared-memory wavefronts.
constexpr int STAGE_WORDS = NW * NBUF * STAGE_TILE, ACC_FLOATS = NW * R * D;
constexpr int SCRATCH_WORDS = (STAGE_WORDS > ACC_FLOATS ? STAGE_WORDS : ACC_FLOATS) + 1;
__shared__ __align__(128) uint32_t scratch_static[DYNAMIC ? 1 : SCRATCH_WORDS];
uint32_t* const scratch = DYNAMIC ? dynamic_shared + LANE_PAIRS_BYTES / 4 : scratch_static;
// What decode_attention.dynamic_shared() counts (at least: it asks for 48,004 bytes
// where the layout takes less), and what DYNAMIC's layout needs: the 4-bit lane pairs,
// keys on the tensor cores (tile_dots, which the exact tiles' weights share), two
// staging buffers, and the head dim whose query fragments stay in registers (the merged
// rows then go to the staging memory's end, below).
static_assert(!DYNAMIC || (DYNAMIC_SHARED >= LANE_PAIRS_BYTES + 4 * SCRATCH_WORDS &&
                           LANE_PAIRS && KEY_MMA && NBUF == 2 && D <= 128 &&
                           VALUE_MMA && ACC_FLOATS + R * D < SCRATCH_WORDS));
float* const q_rows = DYNAMIC ? reinterpret_cast<float*>(scratch) + (SCRATCH_WORDS - 1 - R * D) / 4 * 4
                              : q_rows_static;
auto stage_buffer = [&](int k) { return scratch + (warp * NBUF + k % NBUF) * STAGE_TILE; };
// KEY_PAIR_TABLE: a pair of key codes -> its two levels as f16x2; KEY_MMA: a tile's raw
// key dots. For 2- and 3-bit keys (KEY_PAIR_OR) the table is aligned to its size, so an
// entry's shared address is the table's OR the code's byte offset: one LOP3 with the
// mask, where adding it cost another instruction (5-bit keys' 4 KiB table would cost
// padding instead).
constexpr bool KEY_PAIR_OR = KEY_MMA && KB <= 3;
__shared__ __align__(KEY_PAIR_OR ? KEY_PAIR_BYTES : 4) uint32_t
    k_pairs[KEY_PAIR_TABLE ? KEY_PAIR_BYTES / 4 : 1];
const uint32_t k_pairs_at = static_cast<uint32_t>(__cvta_generic_to_shared(k_pairs));
__shared__ __align__(16) float tile_dots[KEY_MMA ? NW : 1][32][R];
// A tile's softmax weights x value norms (exact tiles, and where values are summed lane
// by lane), float per token and row; with DYNAMIC in tile_dots' memory: the compressed
// tiles' dots and the exact tiles' weights are never live together, and a lane reads
// its token's dots before writing its weights.
__shared__ __align__(16) float weights_static[DYNAMIC ? 1 : NW][32][R];
auto weights = DYNAMIC ? tile_dots : weights_static;
auto warp_acc = reinterpret_cast<float (*)[R][D]>(scratch);

// This head's packed rows.
const uint32_t* head_rows = rows + b * rows_strides[0] + h * rows_strides[1];
const int64_t row_stride = rows_strides[2];
// A tile's rows go into `stage` as one contiguous copy where the rows are packed and
// 16-byte aligned (asynchronous, 16 bytes a lane at a time), else word by word.
const bool packed_rows = row_stride == RW && (reinterpret_cast<uintptr_t>(head_rows) & 15) == 0;
// A lane's first 16 bytes in buffer 0, as a shared address: a whole tile's copies are
// then at immediate offsets from it (generic pointers cost each copy its own address).
const uint32_t stage_lane_at =
    static_cast<uint32_t>(__cvta_generic_to_shared(stage_buffer(0))) + 16 * lane;
auto stage_tile = [&](int k, int first, int end) {
  uint32_t* const stage = stage_buffer(k);
  const int n_items = min(32, end - first);
  const uint32_t* src = head_rows + int64_t(first) * row_stride;
  if (STAGE_STRIDE == RW && packed_rows && n_items == 32) {
    // a whole tile: a count known here, so each copy's offsets are immediates (the
    // general loop below cost some 140 instructions a tile)
    constexpr int TILE_COPIES = 32 * RW / 4;  // 16-byte copies
    const uint32_t to = stage_lane_at + (k % NBUF) * STAGE_TILE * 4;
    // (RW, the row stride here, as a constant: src's run-time stride cost instructions)
    const uint32_t* from = head_rows + int64_t(first) * RW + 4 * lane;
#pragma unroll
    for (int i = 0; i < (TILE_COPIES + 31) / 32; ++i) {
      if (TILE_COPIES % 32 == 0 || lane + 32 * i < TILE_COPIES) cp_async16_at(to + 512 * i, from + 128 * i);
    }
  } else if (STAGE_STRIDE == RW && packed_rows) {
    const int n_words = n_items * RW, n_vec = n_words / 4;
    for (int v = lane; v < n_vec; v += 32) cp_async16(stage + 4 * v, src + 4 * v);
    for (int w = 4 * n_vec + lane; w < n_words; w += 32) stage[w] = src[w];
  } else {
    for (int idx = lane; idx < n_items * STAGE_STRIDE; idx += 32) {
      stage[idx] = src[int64_t(idx / STAGE_STRIDE) * row_stride + STAGE_FROM + idx % STAGE_STRIDE];
    }
  }
  cp_async_commit();
};
// A slice's block sends each warp's first tile now, so that its copy runs under the
// prologue's reads and barrier. A raw tail's row is not stored yet: its slot in `rows`
// is read by no one.
const int n_stored = RAW_TAIL ? n_tokens - L : n_tokens;
const int slice_start = split * split_len, slice_end = min(n_stored, slice_start + split_len);
if (!(HAS_EXACT && split == n_splits) && slice_start + warp * 32 < slice_end) {
  stage_tile(0, slice_start + warp * 32, slice_end);
}

// -- the query rows: key calibration scale, rotation, softmax scale, log2(e); a warp
// takes a row whole, so the rotation needs no block barrier
const float q_scale = scale[0] * LOG2E * (KB > 0 ? rsqrtf(float(D)) : 1.0f);
for (int r = warp; r < R; r += NW) {
  const int row = rg * R + r, hq = h * G + row / L, i = row % L;
  float x[DPL];
#pragma unroll
  for (int k = 0; k < DPL; ++k) {
    const int d = lane * DPL + k;
    x[k] = 0.0f;
    if (row < ROWS) {
      x[k] = to_float(q[b * q_strides[0] + hq * q_strides[1] + i * q_strides[2] + d * q_strides[3]]);
      if constexpr (HAS_KSCALE) {
        x[k] *= kscale[b * kscale_strides[0] + h * kscale_strides[1] + d * kscale_strides[2]];
      }
      if constexpr (KB > 0) x[k] *= k_signs[d];
    }
  }
  if constexpr (KB > 0) hadamard_warp<D>(x, lane);
#pragma unroll
  for (int k = 0; k < DPL; ++k) q_t[(lane * DPL + k) * R + r] = x[k] * q_scale;
}
if constexpr (KB > 0) {
  for (int j = threadIdx.x; j < (1 << KB); j += THREADS) k_levels[j] = k_levels_in[j];
}
if constexpr (VALUE_MMA && VALUE_PAIR_TABLE) {
  fill_level_pairs<VB, 1>(v_pairs, v_levels_in);
} else if constexpr (!VALUE_MMA) {
  for (int j = threadIdx.x; j < (1 << VB); j += THREADS) v_levels[j] = v_levels_in[j];
}
// shuffled values and keys: this lane's level (lane_level)
uint32_t v_lane = 0u, k_lane = 0u;
if constexpr (VALUE_MMA && !VALUE_PAIR_TABLE && !VALUE_LANE_PAIRS && !VALUE_LANE_PAIRS3) {
  v_lane = lane_level<VB>(v_levels_in, lane);
}
if constexpr (LANE_PAIRS) {  // 4-bit keys and values share it: both codebook(D, 4)
  fill_level_pairs<4, PAIR_COPIES>(lane_pairs, KEY_LANE_PAIRS ? k_levels_in : v_levels_in);
}
// pair j of a run of 8-bit pair codes: its levels (the low code's in the low half),
// from this lane's copy (a permute, a shift-add and the read)
const uint32_t pair_copy_at =
    static_cast<uint32_t>(__cvta_generic_to_shared(lane_pairs)) + lane % PAIR_COPIES * 4;
auto lane_pair = [&](const auto& w, int j) {
  return load_shared(pair_copy_at + code_at<8>(w, j) * (4 * PAIR_COPIES));
};
const uint32_t room_at = static_cast<uint32_t>(__cvta_generic_to_shared(lane_pairs3_room));
const uint32_t lane_pairs3_at = (room_at + LANE_PAIRS3_BYTES - 1) & ~uint32_t(LANE_PAIRS3_BYTES - 1);
if constexpr (VALUE_LANE_PAIRS3) {
  fill_level_pairs<3, PAIR_COPIES>(lane_pairs3_room + (lane_pairs3_at - room_at) / 4,
                                   v_levels_in);
}
// field k (bits 6k .. 6k + 5) of a word of 6-bit pair codes: its levels, from this
// lane's copy (entries 64 bytes apart: the field moved to bits 6 .. 11, masked, OR'd)
const uint32_t pair3_copy_at = lane_pairs3_at | lane % PAIR_COPIES * 4;
auto lane_pair3 = [&](uint32_t w, int k) {
  const uint32_t field_at_6 = k == 0 ? w << 6 : w >> (6 * k - 6);
  return load_shared(pair3_copy_at | (field_at_6 & 0xFC0u));
};
if constexpr (KEY_SHUFFLES) k_lane = lane_level<KB>(k_levels_in, lane);
if constexpr (KEY_PAIR_TABLE) fill_level_pairs<KB, 1>(k_pairs, k_levels_in);
__syncthreads();
// KEY_MMA: this lane's parts of the query rows as B fragments, one per 16 dims and 8
// rows (QT of them: rows 8 .. 15 only where R > 8, head dim 64).
const int frag_group = lane >> 2, frag_t = lane & 3;
constexpr int QT = (R + 7) / 8;
// The pair of key dims (2p, 2p + 1) in lane t's k slots 2t, 2t + 1 (half 0) or
// 2t + 8, 2t + 9 (half 1) of k step ks; A and B agree on it, so any order sums alike.
auto key_pair = [](int ks, int half, int t) {
  if constexpr (KEY_WORD_PAIRS) {
    return t * (D / 8) + 2 * ks + half;  // lane t's quarter holds pairs t D / 8 ...
  } else {
    return ks * 8 + 4 * half + t;
  }
};
// Past head dim 128, where the values' accumulators take the registers too, the
// fragments go to the query rows' shared memory, free until the final merge (where it
// holds them: R >= 4 QT), read back as one 8-byte load a k step: at head dim 256 that
// cut the tile's spilled local loads and stores from 66 to 23 (compile_kernels --loops).
constexpr bool Q_FRAG_SHARED = KEY_MMA && VALUE_MMA && D > 128 && R >= 4 * QT;
uint2* const q_frag_shared = reinterpret_cast<uint2*>(q_rows);
uint32_t q_frag[KEY_MMA && !Q_FRAG_SHARED ? D / 16 : 1][QT][2];
// This lane's fragment of k step ks and query tile qt, wherever it waits.
auto q_frag_shared_at = [&](int ks, int qt) -> uint2& {
  return q_frag_shared[(ks * QT + qt) * 32 + lane];
};
auto q_frag_of = [&](int ks, int qt) {
  if constexpr (Q_FRAG_SHARED) {
    return q_frag_shared_at(ks, qt);
  } else {
    return make_uint2(q_frag[ks][qt][0], q_frag[ks][qt][1]);
  }
};
if constexpr (KEY_MMA) {
  auto q_at = [&](int row, int d) { return row < R ? q_t[d * R + row] : 0.0f; };
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
      uint32_t f[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int dd = 2 * key_pair(ks, half, frag_t), row = 8 * qt + frag_group;
        f[half] = pack_half2(q_at(row, dd), q_at(row, dd + 1));
      }
      if constexpr (Q_FRAG_SHARED) {
        q_frag_shared_at(ks, qt) = make_uint2(f[0], f[1]);
      } else {
        q_frag[ks][qt][0] = f[0], q_frag[ks][qt][1] = f[1];
      }
    }
  }
}

phase(4, 0);  // the prologue

// The sink positions of this row, once per block: usually one run of consecutive
// positions (a sequence's first tokens), checked by a range instead of a scan.
__shared__ int sink_list[MAX_SINKS];
__shared__ int sink_lo, sink_hi, sink_run;
if constexpr (HAS_SINK_TOKENS) {
  for (int s = threadIdx.x; s < n_sinks; s += THREADS) {
    sink_list[s] = int(sink_pos[b * sink_pos_strides[0] + s * sink_pos_strides[2]]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int lo = sink_list[0], hi = sink_list[0];
    for (int s = 1; s < n_sinks; ++s) {
      lo = min(lo, sink_list[s]);
      hi = max(hi, sink_list[s]);
    }
    unsigned long long seen = 0;
    if (hi - lo < 64) {
      for (int s = 0; s < n_sinks; ++s) seen |= 1ull << (sink_list[s] - lo);
    }
    sink_lo = lo;
    sink_hi = hi;
    sink_run = hi - lo < 64 && __popcll(seen) == hi - lo + 1 && hi - lo + 1 == n_sinks;
  }
  __syncthreads();
}
auto tail_exact = [&](int t, int i) {
  return t >= n_tokens - n_exact && (WINDOW <= 0 || t > first_query + i - WINDOW);
};
auto is_sink = [&](int t) {
  if (!HAS_SINK_TOKENS || t < sink_lo || t > sink_hi) return false;
  if (sink_run) return true;
  for (int s = 0; s < n_sinks; ++s) {
    if (sink_list[s] == t) return true;
  }
  return false;
};
// The mask's additive term for key t and row r, log2 units (-inf: masked).
auto mask_term = [&](int t, int r) -> float {
  const int row = rg * R + r, i = row % L;
  if constexpr (MASK_KIND == 1) {
    return t <= first_query + i ? 0.0f : -INFINITY;
  } else if constexpr (MASK_KIND == 2) {
    const int hq = h * G + row / L;
    const auto m = mask[b * mask_strides[0] + hq * mask_strides[1] + i * mask_strides[2] +
                        int64_t(t) * mask_strides[3]];
    if constexpr (MASK_BOOL) {
      return m ? 0.0f : -INFINITY;
    } else {
      return to_float(m) * LOG2E;
    }
  } else {
    return 0.0f;
  }
};
// Where an exact item (sink slot s < n_sinks, else tail token) sits, and its rows.
auto exact_token = [&](int item) {
  return item < n_sinks ? sink_list[item] : n_tokens - n_exact + (item - n_sinks);
};
// A raw tail's one token: its key (dims 0..D-1) and value (D..2D-1), rotated here.
__shared__ __align__(16) T raw_tail[RAW_TAIL ? 2 * D : 1];
// part: 0 the key, 1 the value (a recent row holds both)
auto exact_row = [&](int item, int part, auto* sink_arr, const auto& sink_strides,
                     auto* tail_arr, const auto& tail_strides) -> const T* {
  if (RAW_TAIL && item == n_sinks + n_exact - 1) return raw_tail + part * D;
  if (RECENT && item >= n_sinks) {
    return recent_rows + (item - n_sinks) * 4 * D + part * D;
  }
  return item < n_sinks
             ? sink_arr + b * sink_strides[0] + h * sink_strides[1] + item * sink_strides[2]
             : tail_arr + b * tail_strides[0] + h * tail_strides[1] +
                   (item - n_sinks) * tail_strides[2];
};

const T* k_exact = keys;  // turbo0vN: keys as the model made them
const int64_t k_base = b * keys_strides[0] + h * keys_strides[1];
// A norms word: the key norm in its low half, the value norm in its high half.
auto norm_of = [](uint32_t word, int half) {
  return __half2float(__ushort_as_half((unsigned short)(word >> (16 * half))));
};

float m[R], l_lane[R];
#pragma unroll
for (int r = 0; r < R; ++r) {
  m[r] = -INFINITY;
  l_lane[r] = 0.0f;
}
// VALUE_MMA: this lane group's value bits of one staged token, from bit 0 of out. Bits
// that start inside a word are read from VALUE_READ_WORDS words, as far as the farthest
// group's offset in its first word plus its bits reach: 3-bit values at head dim 128
// start at bit 0 or 16, so two words, not GW + 1 = 3 (the third read cost 4 shared
// loads a 16 tokens, each 2-way bank conflicted). The last word read may be past
// the codes (the row's norms, the next row's codes, or scratch's spare word), and lands
// only in bits above the group's, which no one reads: unguarded, as a guard cost turbo3's
// value loop 13 instructions of 170 per 16 tokens (compile_kernels.py --loops).
constexpr int VALUE_SHIFT_MAX = [] {
  int most = 0;
  for (int g = 0; g < 8; ++g) most = (g * GB) % 32 > most ? (g * GB) % 32 : most;
  return most;
}();
constexpr int VALUE_READ_WORDS = (VALUE_SHIFT_MAX + GB + 31) / 32;
static_assert(VALUE_READ_WORDS <= GW + 1);
auto value_bits = [&](const uint32_t* values, uint32_t (&out)[GW]) {
  if constexpr (VGW > 0) {
#pragma unroll
    for (int i = 0; i < GW; ++i) out[i] = values[frag_group * GW + i];
  } else {
    const int bit = frag_group * GB, word = bit >> 5, shift = bit & 31;
    uint32_t in[GW + 1];
#pragma unroll
    for (int i = 0; i <= GW; ++i) in[i] = i < VALUE_READ_WORDS ? values[word + i] : 0u;
#pragma unroll
    for (int i = 0; i < GW; ++i) out[i] = __funnelshift_r(in[i], in[i + 1], shift);
  }
};
// The token in lane t's k slot c of a tile's 32 (slots 2t, 2t + 1, 2t + 8, 2t + 9 of
// pass 0 are c = 0..3, of pass 1 c = 4..7), and the word of its pair in weight_pairs.
auto value_token = [](int t, int c) {
  return VGW == 2 ? (t & 1) + 16 * (t >> 1) + 2 * c : 8 * t + c;
};
auto pair_word = [](int token) {
  return ((token >> 1) & ~(PAIR_DELTA - 1)) | (token & (PAIR_DELTA - 1));
};
// 2- and 4-bit values: two tokens' codes of dims 2i and 2i + 1 side by side (a field of
// 2 VB bits per pair, in `even` and `odd`), so a pair's table index is one field.
constexpr uint32_t LOW_CODES = VB == 2 ? 0x33333333u : 0x0F0F0F0Fu;
auto interleave = [&](const uint32_t (&lo)[GW], const uint32_t (&hi)[GW], uint32_t (&even)[GW],
                      uint32_t (&odd)[GW]) {
#pragma unroll
  for (int i = 0; i < GW; ++i) {
    even[i] = (lo[i] & LOW_CODES) | ((hi[i] << VB) & ~LOW_CODES);
    odd[i] = ((lo[i] >> VB) & LOW_CODES) | (hi[i] & ~LOW_CODES);
  }
};
// 3-bit values alike, by chunks of 8 dims (24 bits): field k of even[c] (bits 6k ..
// 6k + 5) holds dim 8c + 2k's pair, of odd[c] dim 8c + 2k + 1's. The bits above a
// chunk's 24 are whatever follows; lane_pair3 reads only the field it names.
constexpr int VCH = (GD + 7) / 8;
constexpr uint32_t EVEN_CODES3 = 0x1C71C7u;  // a chunk's codes 0, 2, 4 and 6
auto interleave3 = [&](const uint32_t (&lo)[GW], const uint32_t (&hi)[GW], uint32_t (&even)[VCH],
                       uint32_t (&odd)[VCH]) {
#pragma unroll
  for (int c = 0; c < VCH; ++c) {
    const uint32_t a = code_low<24>(lo, c), b = code_low<24>(hi, c);
    even[c] = (a & EVEN_CODES3) | ((b << 3) & ~EVEN_CODES3);
    odd[c] = ((a >> 3) & EVEN_CODES3) | (b & ~EVEN_CODES3);
  }
};

// One tile: up to 32 items (tokens, or exact items), one per lane for the scores;
// then the values, 16 tokens a step on the tensor cores (VALUE_MMA, compressed tiles)
// or token by token, each lane holding DPL dims of every row.
auto attend_tile = [&](auto exact_tag, int first, int end, const uint32_t* stage, auto& acc) {
  constexpr bool EXACT = decltype(exact_tag)::value != 0;
  constexpr bool MMA_VALUES = VALUE_MMA && !EXACT;
  float s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = -INFINITY;
  float value_norm = 0.0f;
  const int item = first + lane;
  const int pair_slot = (lane & PAIR_DELTA) == 0 ? pair_word(lane) : 16;
  const int n_items = min(32, end - first);
  if constexpr (!EXACT && KEY_MMA) {
    // Raw key dots of the tile's tokens, 16 at a time: A's rows g and g + 8 are tokens
    // 16 mt + g and 16 mt + g + 8, each register one pair of codes; C's columns are the
    // query rows. Rows past n_items hold stale words; only their own rows of C see them,
    // and nothing reads those.
    for (int mt = 0; mt * 16 < n_items; ++mt) {
      const int token = mt * 16 + frag_group;
      const uint32_t* codes_lo = stage + token * RW;
      const uint32_t* codes_hi = codes_lo + 8 * RW;
      // two accumulators, even and odd k steps: half as long a chain of dependent MMAs
      float c[QT][4] = {}, c_odd[QT][4] = {};
      auto mma_step = [&](int ks, const uint32_t (&a)[4]) {
#pragma unroll
        for (int qt = 0; qt < QT; ++qt) {
          const uint2 b = q_frag_of(ks, qt);
          mma_16816(ks % 2 ? c_odd[qt] : c[qt], a, b.x, b.y);
        }
      };
      if constexpr (KEY_WORD_PAIRS) {
        uint32_t w_lo[KEY_LANE_WORDS], w_hi[KEY_LANE_WORDS];
        if constexpr (KEY_QUARTER_WORDS) {
#pragma unroll
          for (int i = 0; i < KEY_LANE_WORDS; ++i) {
            w_lo[i] = codes_lo[frag_t * KEY_LANE_WORDS + i];
            w_hi[i] = codes_hi[frag_t * KEY_LANE_WORDS + i];
          }
        } else {
          const int bit = frag_t * (D * KBW / 4), word = bit >> 5, shift = bit & 31;
#pragma unroll
          for (int i = 0; i < KEY_LANE_WORDS; ++i) {
            w_lo[i] = __funnelshift_r(codes_lo[word + i], codes_lo[word + i + 1], shift);
            w_hi[i] = __funnelshift_r(codes_hi[word + i], codes_hi[word + i + 1], shift);
          }
        }
        auto level_pair = [&](const uint32_t (&w)[KEY_LANE_WORDS], int j) {
          if constexpr (KEY_PAIR_OR) {
            return load_shared(k_pairs_at | code_bytes<2 * KB>(w, j));
          } else if constexpr (KEY_LANE_PAIRS) {
            return lane_pair(w, j);
          } else {  // KEY_SHUFFLES: every other width of word pairs
            return shuffled_levels(k_lane, code_low<KB>(w, 2 * j), code_low<KB>(w, 2 * j + 1));
          }
        };
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          const uint32_t a[4] = {level_pair(w_lo, 2 * ks), level_pair(w_hi, 2 * ks),
                                 level_pair(w_lo, 2 * ks + 1), level_pair(w_hi, 2 * ks + 1)};
          mma_step(ks, a);
        }
      } else {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          const int p0 = key_pair(ks, 0, frag_t), p1 = key_pair(ks, 1, frag_t);
          const uint32_t a[4] = {k_pairs[pair_code<KB>(codes_lo, p0)],
                                 k_pairs[pair_code<KB>(codes_hi, p0)],
                                 k_pairs[pair_code<KB>(codes_lo, p1)],
                                 k_pairs[pair_code<KB>(codes_hi, p1)]};
          mma_step(ks, a);
        }
      }
#pragma unroll
      for (int qt = 0; qt < QT; ++qt) {
        const int r = 8 * qt + 2 * frag_t;
        if (r < R) {
          tile_dots[warp][token][r] = c[qt][0] + c_odd[qt][0];
          tile_dots[warp][token + 8][r] = c[qt][2] + c_odd[qt][2];
        }
        if (r + 1 < R) {
          tile_dots[warp][token][r + 1] = c[qt][1] + c_odd[qt][1];
          tile_dots[warp][token + 8][r + 1] = c[qt][3] + c_odd[qt][3];
        }
      }
    }
    __syncwarp();
  }
  if (item < end) {
    float dot[R];
#pragma unroll
    for (int r = 0; r < R; ++r) dot[r] = 0.0f;
    int t = item;
    if constexpr (EXACT || KB == 0) {
      const T* row;
      if constexpr (EXACT) {
        t = exact_token(item);
        row = exact_row(item, 0, sink_keys, sink_keys_strides, tail_keys, tail_keys_strides);
      } else {
        row = k_exact + k_base + int64_t(t) * keys_strides[2];
      }
      auto accumulate = [&](int d, float k) {
        float qd[R];
        load_floats<R>(q_t + d * R, qd);
#pragma unroll
        for (int r = 0; r < R; ++r) dot[r] += qd[r] * k;
      };
      constexpr int CHUNK = 16 / sizeof(T);  // elements in one 16-byte load
      if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
#pragma unroll 2
        for (int d0 = 0; d0 < D; d0 += CHUNK) {
          const uint4 raw = *reinterpret_cast<const uint4*>(row + d0);
          const T* chunk = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int c = 0; c < CHUNK; ++c) accumulate(d0 + c, to_float(chunk[c]));
        }
      } else {
#pragma unroll 8
        for (int d = 0; d < D; ++d) accumulate(d, to_float(row[d]));
      }
      value_norm = EXACT ? 1.0f : norm_of(head_rows[int64_t(t) * row_stride + NORMS], 1);
    } else if constexpr (KEY_MMA) {
      load_floats<R>(tile_dots[warp][lane], dot);
      const uint32_t norms = stage[lane * RW + NORMS];
      const float k_norm = norm_of(norms, 0);
#pragma unroll
      for (int r = 0; r < R; ++r) dot[r] *= k_norm;
      value_norm = norm_of(norms, 1);
    } else {
      const uint32_t* row = head_rows + int64_t(t) * row_stride;
#pragma unroll
      for (int grp = 0; grp < D / 32; ++grp) {
        // Word loads: a row is KW + VW + 1 words, an odd count, so only every fourth
        // row starts 16-byte aligned.
        uint32_t w[KBW];
#pragma unroll
        for (int i = 0; i < KBW; ++i) w[i] = row[grp * KBW + i];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const float level = k_levels[code_at<KBW>(w, j)];
          float qd[R];
          load_floats<R>(q_t + (grp * 32 + j) * R, qd);
#pragma unroll
          for (int r = 0; r < R; ++r) dot[r] += qd[r] * level;
        }
      }
      const uint32_t norms = row[NORMS];
      const float k_norm = norm_of(norms, 0);
#pragma unroll
      for (int r = 0; r < R; ++r) dot[r] *= k_norm;
      value_norm = norm_of(norms, 1);
    }
    // Exact items are the sinks and the tail (the tail wins where both hold a token);
    // the compressed slices take every other (token, row). A compressed tile past the
    // sinks and before the exact tail (nearly every one) takes all: one test a warp, as a
    // branch of its own (folded into the checks below, they still ran: 52 instructions,
    // not 38).
    if (!EXACT && (!HAS_SINK_TOKENS || first > sink_hi) && first + 32 <= n_tokens - n_exact) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (rg * R + r < ROWS) s[r] = dot[r] + mask_term(t, r);
      }
    } else {
      const bool sink = EXACT ? item < n_sinks : is_sink(t);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = rg * R + r;
        if (row >= ROWS) continue;
        const bool exact_here = tail_exact(t, row % L);
        const bool take = EXACT ? (sink ? !exact_here : exact_here) : !(sink || exact_here);
        if (take) s[r] = dot[r] + mask_term(t, r);
      }
    }
  }
  // The running maxes are the warp's, so whether any moved is too: the accumulators
  // are rescaled only then (on about half the tiles at 128K, random data).
  float alpha[R];
  bool moved = false;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float m_new = fmaxf(m[r], warp_max(s[r]));
    // A row with no score yet (m_new -inf) subtracts 0, so that no difference is NaN:
    // exp2 of -inf is 0, and its sum and accumulators are 0 still.
    const float m_at = m_new == -INFINITY ? 0.0f : m_new;
    alpha[r] = exp2_or_zero(m[r] - m_at);
    const float p = exp2_or_zero(s[r] - m_at);
    moved |= m_new != m[r];
    l_lane[r] = l_lane[r] * alpha[r] + p;
    m[r] = m_new;
    const float w = p * value_norm;
    if constexpr (MMA_VALUES) {
      // pairs of tokens PAIR_DELTA apart as one fp16x2 word, the first in the low half
      const float partner = __shfl_xor_sync(FULL_MASK, w, PAIR_DELTA);
      // every lane stores (a branch around the store cost some 10 instructions a row):
      // the pair's first lane its word, the other the row's spare word 16
      weight_pairs[warp][r][pair_slot] = pack_half2(w, partner);
    } else {
      weights[warp][lane][r] = w;
    }
  }
  if (moved) {
    if constexpr (MMA_VALUES) {
      // this lane's accumulators hold rows 2t and 2t + 1
      float alpha_lo = 1.0f, alpha_hi = 1.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r == 2 * frag_t) alpha_lo = alpha[r];
        if (r == 2 * frag_t + 1) alpha_hi = alpha[r];
      }
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        acc[mt][0] *= alpha_lo, acc[mt][2] *= alpha_lo;
        acc[mt][1] *= alpha_hi, acc[mt][3] *= alpha_hi;
      }
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int k = 0; k < DPL; ++k) acc[r][k] *= alpha[r];
      }
    }
  }
  __syncwarp();
  if constexpr (MMA_VALUES) {
    // 16 tokens a pass: B (16 tokens x 8 rows) holds the rows' weights of the tokens in
    // k slots 2t, 2t + 1 (+ 8), A (16 dims x 16 tokens) the same tokens' levels of the
    // group's dims 2mt, 2mt + 1. Tokens past n_items weigh 0 (their scores were -inf);
    // their stale codes still index the table, so the products are 0.
    // A run-time count: unrolled, the two passes took 30 more registers.
    const int passes = min(2, n_items);
#pragma unroll 1
    for (int pass = 0; pass < passes; ++pass) {
      // B's columns past R weigh 0: their lanes read row 0 and drop it (a branch around
      // the reads cost more)
      const int b_row = frag_group < R ? frag_group : 0;
      uint32_t b0 = weight_pairs[warp][b_row][pair_word(value_token(frag_t, 4 * pass))];
      uint32_t b1 = weight_pairs[warp][b_row][pair_word(value_token(frag_t, 4 * pass + 2))];
      if (frag_group >= R) b0 = b1 = 0u;
      uint32_t bits[4][GW], even[2][GW], odd[2][GW], even3[2][VCH], odd3[2][VCH];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        value_bits(stage + value_token(frag_t, 4 * pass + c) * STAGE_STRIDE + STAGE_VALUES,
                   bits[c]);
      }
      if constexpr (VALUE_PAIR_TABLE || VALUE_LANE_PAIRS) {
        interleave(bits[0], bits[1], even[0], odd[0]);
        interleave(bits[2], bits[3], even[1], odd[1]);
      } else if constexpr (VALUE_LANE_PAIRS3) {
        interleave3(bits[0], bits[1], even3[0], odd3[0]);
        interleave3(bits[2], bits[3], even3[1], odd3[1]);
      }
      // The A register of dim j (2 mt or 2 mt + 1) for the tokens of slots 2p, 2p + 1.
      auto level_pair = [&](int p, int j) -> uint32_t {
        if constexpr (VALUE_LANE_PAIRS) {
          return lane_pair((j & 1) ? odd[p] : even[p], j >> 1);
        } else if constexpr (VALUE_LANE_PAIRS3) {
          return lane_pair3((j & 1) ? odd3[p][j >> 3] : even3[p][j >> 3], (j & 7) >> 1);
        } else if constexpr (!VALUE_PAIR_TABLE) {
          return shuffled_levels(v_lane, code_low<VB>(bits[2 * p], j),
                                 code_low<VB>(bits[2 * p + 1], j));
        } else {
          return load_shared(v_pairs_at | code_bytes<2 * VB>((j & 1) ? odd[p] : even[p], j >> 1));
        }
      };
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        const uint32_t a[4] = {level_pair(0, 2 * mt), level_pair(0, 2 * mt + 1),
                               level_pair(1, 2 * mt), level_pair(1, 2 * mt + 1)};
        mma_16816(acc[mt], a, b0, b1);
      }
    }
  } else {
#pragma unroll 4
    for (int jj = 0; jj < n_items; ++jj) {
      float v[DPL];
      if constexpr (EXACT) {
        const T* row = exact_row(first + jj, 1, sink_values, sink_values_strides, tail_values,
                                 tail_values_strides);
#pragma unroll
        for (int k = 0; k < DPL; ++k) v[k] = to_float(row[lane * DPL + k]);
      } else {
        constexpr int LANE_BITS = DPL * VB;
        const uint32_t* row = stage + jj * STAGE_STRIDE + STAGE_VALUES;
        const int bit = lane * LANE_BITS, word = bit >> 5, shift = bit & 31;
        uint64_t window_bits = row[word];
        if (shift + LANE_BITS > 32) window_bits |= uint64_t(row[word + 1]) << 32;
#pragma unroll
        for (int k = 0; k < DPL; ++k) {
          v[k] = v_levels[uint32_t(window_bits >> (shift + k * VB)) & ((1u << VB) - 1u)];
        }
      }
      float wj[R];
      load_floats<R>(weights[warp][jj], wj);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int k = 0; k < DPL; ++k) acc[r][k] += wj[r] * v[k];
      }
    }
  }
  __syncwarp();
};

// -- this warp's tiles; then its unnormalised rows go to warp_acc (the staging memory,
// once every warp is done with it)
auto store_rows = [&](auto mma_tag, auto& acc) {
  __syncthreads();
  if constexpr (decltype(mma_tag)::value != 0) {
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      const int d = GD * frag_group + 2 * mt, r = 2 * frag_t;
      if (r < R) warp_acc[warp][r][d] = acc[mt][0], warp_acc[warp][r][d + 1] = acc[mt][2];
      if (r + 1 < R) warp_acc[warp][r + 1][d] = acc[mt][1], warp_acc[warp][r + 1][d + 1] = acc[mt][3];
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int k = 0; k < DPL; ++k) warp_acc[warp][r][lane * DPL + k] = acc[r][k];
    }
  }
};
// -- a raw tail: one warp of each exact block rotates and calibrates the token's key and
// value (keys first scaled by the key statistics, as encode.cu); the head's first block
// also writes its packed row.
if constexpr (RAW_TAIL && KB > 0) {
  __shared__ uint32_t raw_words[KW + VW];
  // RECENT: the head's first exact block writes the rows one token on. The recent rows
  // shifted by one are one contiguous run, copied by its other warps while warp 0
  // encodes (16 bytes a lane, four loads in flight before their stores: a copy load by
  // load took some 40 us a layer); the raw token's row goes last, once encoded.
  const bool writes_recent = RECENT && split == n_splits && rg == 0;
  uint32_t* const next_tail = static_cast<uint32_t*>(static_cast<void*>(next_recent)) +
                              (int64_t(b) * n_kv_heads + h) * tail_words;
  T* next_rows = reinterpret_cast<T*>(next_tail + TAIL_FROM);
  static_assert(!RECENT || NW > 1, "the recent rows are copied by warps 1..NW-1");
  if (writes_recent && warp > 0) {
    const T* from = recent_rows + 4 * D;
    const int n_values = (n_recent - 1) * 4 * D, copiers = THREADS - 32;
    const int first = threadIdx.x - 32;
    constexpr int VEC = 16 / sizeof(T), BATCH = 4;
    // one contiguous run (16-byte aligned where both makers of it leave it so)
    if ((reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(next_rows)) % 16 == 0) {
      const uint4* src = reinterpret_cast<const uint4*>(from);
      uint4* dst = reinterpret_cast<uint4*>(next_rows);
      const int n_vecs = n_values / VEC;
      for (int v0 = first; v0 < n_vecs; v0 += BATCH * copiers) {
        uint4 held[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          if (v0 + u * copiers < n_vecs) held[u] = src[v0 + u * copiers];
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          if (v0 + u * copiers < n_vecs) dst[v0 + u * copiers] = held[u];
        }
      }
    } else {
      for (int i = first; i < n_values; i += copiers) next_rows[i] = from[i];
    }
  }
  if (split == n_splits && warp == 0) {
    float v[DPL], x[DPL];
#pragma unroll
    for (int k = 0; k < DPL; ++k) {
      const int d = lane * DPL + k;
      v[k] = to_float(tail_values[b * tail_values_strides[0] + h * tail_values_strides[1] +
                                  d * tail_values_strides[3]]);
      x[k] = to_float(tail_keys[b * tail_keys_strides[0] + h * tail_keys_strides[1] +
                                d * tail_keys_strides[3]]);
      if constexpr (HAS_KMEAN) {
        x[k] -= kmean[b * kmean_strides[0] + h * kmean_strides[1] + d * kmean_strides[2]];
      }
      if constexpr (HAS_KSCALE) {
        x[k] /= kscale[b * kscale_strides[0] + h * kscale_strides[1] + d * kscale_strides[2]];
      }
    }
    rotate_warp<D>(v, v_signs, lane);
    const float v_norm = quantize_warp<D, VB>(v, v_bounds, v_levels_in, raw_words + KW, lane);
    rotate_warp<D>(x, k_signs, lane);
    const float k_norm = quantize_warp<D, KB>(x, k_bounds, k_levels_in, raw_words, lane);
#pragma unroll
    for (int k = 0; k < DPL; ++k) {
      raw_tail[lane * DPL + k] = from_float<T>(x[k]);
      raw_tail[D + lane * DPL + k] = from_float<T>(v[k]);
    }
    __syncwarp();
    if (rg == 0) {
      uint32_t* row = RECENT ? next_tail : new_rows + (int64_t(b) * n_kv_heads + h) * RW;
      // ROW_IN_PLACE: also into the token's slot in `rows`, which no block of this
      // launch reads (n_stored excludes it); the next launch on the layer reads it.
      uint32_t* slot = const_cast<uint32_t*>(head_rows) + int64_t(n_tokens - 1) * row_stride;
      const uint32_t norms = norms_word(k_norm, v_norm);
      for (int w = lane; w < KW + VW; w += 32) {
        row[w] = raw_words[w];
        if (ROW_IN_PLACE) slot[w] = raw_words[w];
      }
      if (lane == 0) {
        row[KW + VW] = norms;
        if (ROW_IN_PLACE) slot[KW + VW] = norms;
      }
    }
  }
  __syncthreads();
  if (writes_recent) {
    T* last = next_rows + int64_t(n_recent - 1) * 4 * D;
    const int64_t raw_k = b * tail_keys_strides[0] + h * tail_keys_strides[1];
    const int64_t raw_v = b * tail_values_strides[0] + h * tail_values_strides[1];
    for (int c = threadIdx.x; c < 4 * D; c += THREADS) {
      last[c] = c < 2 * D   ? raw_tail[c]
                : c < 3 * D ? tail_keys[raw_k + (c - 2 * D) * tail_keys_strides[3]]
                            : tail_values[raw_v + (c - 3 * D) * tail_values_strides[3]];
    }
  }
}
if (HAS_EXACT && split == n_splits) {
  float acc[R][DPL] = {};
  const int n_items = n_sinks + n_exact;
  // The items spread over every warp, up to 32 a tile: a lane reads its item's key row
  // and then each item's values from global memory, so one warp taking the default
  // window's 32 items alone (16 sinks, 16 exact) kept the launch waiting on this block
  // while its other warps stalled at the barrier.
  const int tile = min(32, (n_items + NW - 1) / NW);
  for (int first = warp * tile; first < n_items; first += NW * tile) {
    attend_tile(Int<1>{}, first, min(first + tile, n_items), nullptr, acc);
  }
  store_rows(Int<0>{}, acc);
} else {
  float acc[VALUE_MMA ? D / 16 : R][VALUE_MMA ? 4 : DPL] = {};
  const int end = slice_end;
  int first = slice_start + warp * 32;  // its tile staged before the prologue
  for (int k = 0; first < end; ++k, first += THREADS) {
    const int next = first + THREADS;
    if (NBUF == 2 && next < end) {
      stage_tile(k + 1, next, end);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncwarp();
    attend_tile(Int<0>{}, first, end, stage_buffer(k), acc);
    if (NBUF == 1 && next < end) stage_tile(k + 1, next, end);
  }
  store_rows(Int<VALUE_MMA>{}, acc);
}

phase(5, 0);  // the tokens

// -- merge the warps; one partial output per (row, dim), unnormalised
#pragma unroll
for (int r = 0; r < R; ++r) {
  const float l = warp_sum(l_lane[r]);
  if (lane == 0) {
    warp_m[warp][r] = m[r];
    warp_l[warp][r] = l;
  }
}
__syncthreads();
const int n_parts = gridDim.x;
const int64_t group_parts = int64_t(blockIdx.y) * n_parts;
// Written through although an input: blocks of this launch alone touch it.
uint32_t* const shared_words = const_cast<uint32_t*>(workspace);
float* parts = reinterpret_cast<float*>(shared_words + workspace_shape[1]);
float* stats = parts + int64_t(gridDim.y) * n_parts * R * D;
for (int idx = threadIdx.x; idx < R * D; idx += THREADS) {
  const int r = idx / D, d = idx % D;
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < NW; ++w) M = fmaxf(M, warp_m[w][r]);
  float o = 0.0f, l = 0.0f;
  if (M != -INFINITY) {
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float f = exp2_or_zero(warp_m[w][r] - M);
      o += f * warp_acc[w][r][d];
      l += f * warp_l[w][r];
    }
  }
  parts[((group_parts + split) * R + r) * D + d] = o;
  if (d == 0) {
    stats[((group_parts + split) * R + r) * 2] = M;
    stats[((group_parts + split) * R + r) * 2 + 1] = l;
  }
}

phase(6, 0);  // the part

// -- the group's last block merges the slices (threadFenceReduction's pattern:
// publish, count, and read the others' results from L2, past this SM's L1). Where a
// group has more than MERGE_CHUNK parts, the last block of each chunk of MERGE_CHUNK
// parts first merges them into one part of the chunk (the chunks' merges overlap the
// slices still running), and the group's last chunk merger merges the chunks: one
// block reading every slice's part cost about 20 us at 255 slices, where one KV head
// needs that many slices to fill the GPU. Counters: the groups' in the workspace's first
// gridDim.y words, then one per (chunk, group); each is zero on entry and left zero.
const int n_chunks = (n_parts + MERGE_CHUNK - 1) / MERGE_CHUNK;
// (16-byte aligned for their float4 reads: the stats before them may end mid-way)
float* chunk_parts = stats + (int64_t(gridDim.y) * n_parts * R * 2 + 3) / 4 * 4;
float* chunk_stats = chunk_parts + int64_t(gridDim.y) * n_chunks * R * D;
__shared__ bool last_block;
// Counts this block on `counter` and says whether it is the last of `count`; the last
// zeroes the counter for the next call.
auto last_of = [&](unsigned int* counter, int count) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(counter, 1u) == unsigned(count - 1);
  __syncthreads();
  if (!last_block) return false;
  __threadfence();
  if (threadIdx.x == 0) *counter = 0u;
  return true;
};
// Each part's weight per row, exp2(its max - the row's), once per (part, row) and not
// per dim: in the staging memory, free now (the host caps the parts to fit).
float* part_weight = reinterpret_cast<float*>(scratch);  // [part][row]
__shared__ float row_m[R], row_l[R];
// The n parts from `first` ((max, sum) rows at src_stats): each row's weights, max and
// sum; the group's final merge adds the attention-sink logit. A lane reads its first
// part's (max, sum) once, as one 8-byte load: where n <= 32 (a chunk, and the chunks
// of up to 512 slices) the merge waits on L2 once here, not twice.
auto weigh = [&](const float* src_stats, int64_t first, int n, bool final) {
  auto stats_of = [&](int p, int r) {
    return __ldcg(reinterpret_cast<const float2*>(src_stats + ((first + p) * R + r) * 2));
  };
  for (int r = warp; r < R; r += NW) {
    const int row = rg * R + r, hq = h * G + row / L, i = row % L;
    const float2 own = lane < n ? stats_of(lane, r) : make_float2(-INFINITY, 0.0f);
    float M = own.x;
    for (int p = lane + 32; p < n; p += 32) M = fmaxf(M, stats_of(p, r).x);
    M = warp_max(M);
    float sink = -INFINITY;
    if constexpr (HAS_SINKS) {
      if (final && row < ROWS) {
        sink = sink_logits[(int64_t(b) * (n_kv_heads * G) + hq) * L + i];
      }
      M = fmaxf(M, sink);
    }
    float l = 0.0f;
    for (int p = lane; p < n; p += 32) {
      const float2 part = p == lane ? own : stats_of(p, r);
      const float w = M == -INFINITY ? 0.0f : exp2_or_zero(part.x - M);
      part_weight[p * R + r] = w;
      l += w * part.y;
    }
    l = warp_sum(l) + (M == -INFINITY ? 0.0f : exp2_or_zero(sink - M));
    if (lane == 0) row_m[r] = M, row_l[r] = l;
  }
  __syncthreads();
};
// Four dims a thread (float4 reads: the parts' reads in flight together): the n parts'
// rows from `first` at src, summed by their weights into dst (divided by the row's sum
// where normalise).
auto sum_parts = [&](const float* src, int64_t first, int n, float* dst, bool normalise) {
  for (int idx = 4 * threadIdx.x; idx < R * D; idx += 4 * THREADS) {
    const int r = idx / D;
    const float4* part = reinterpret_cast<const float4*>(src + first * R * D + idx);
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int p = 0; p < n; ++p) {
      const float w = part_weight[p * R + r];
      const float4 x = __ldcg(part + int64_t(p) * (R * D / 4));
      o.x += w * x.x, o.y += w * x.y, o.z += w * x.z, o.w += w * x.w;
    }
    const float inv = !normalise ? 1.0f : row_l[r] > 0.0f ? 1.0f / row_l[r] : 0.0f;
    dst[idx] = o.x * inv, dst[idx + 1] = o.y * inv;
    dst[idx + 2] = o.z * inv, dst[idx + 3] = o.w * inv;
  }
};
const float *final_parts = parts, *final_stats = stats;
int final_n = n_parts;
if (n_chunks > 1) {
  const int chunk = split / MERGE_CHUNK, first = chunk * MERGE_CHUNK;
  const int n = min(MERGE_CHUNK, n_parts - first);
  if (!last_of(shared_words + int64_t(gridDim.y) * (1 + chunk) + blockIdx.y, n)) {
    phase(8, 0);
    return;
  }
  weigh(stats, group_parts + first, n, false);
  const int64_t at = int64_t(blockIdx.y) * n_chunks + chunk;
  sum_parts(parts, group_parts + first, n, chunk_parts + at * R * D, false);
  for (int r = threadIdx.x; r < R; r += THREADS) {
    chunk_stats[(at * R + r) * 2] = row_m[r];
    chunk_stats[(at * R + r) * 2 + 1] = row_l[r];
  }
  phase(7, 2);  // the chunk's merge
  final_parts = chunk_parts, final_stats = chunk_stats, final_n = n_chunks;
}
if (!last_of(shared_words + blockIdx.y, final_n)) {
  phase(8, 0);
  return;
}
const int64_t final_first = int64_t(blockIdx.y) * final_n;
weigh(final_stats, final_first, final_n, true);
sum_parts(final_parts, final_first, final_n, q_rows, true);  // the query rows' memory, free now
__syncthreads();
// back out of the value rotation, a warp a row
const float unit = rsqrtf(float(D));
for (int r = warp; r < R; r += NW) {
  const int row = rg * R + r;
  if (row >= ROWS) break;
  const int hq = h * G + row / L, i = row % L;
  float x[DPL];
#pragma unroll
  for (int k = 0; k < DPL; ++k) x[k] = q_rows[r * D + lane * DPL + k];
  hadamard_warp<D>(x, lane);
  T* const out_row = out + ((int64_t(b) * (n_kv_heads * G) + hq) * L + i) * D;
#pragma unroll
  for (int k = 0; k < DPL; ++k) {
    const int d = lane * DPL + k;
    out_row[d] = from_float<T>(x[k] * unit * v_signs[d]);
  }
}
phase(8, 4);  // the group's merge
