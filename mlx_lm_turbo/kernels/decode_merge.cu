// One block per group of decode_attention.cu (sequence, KV head, R query rows): merges
// the group's slices (log-sum-exp over their (max, sum) in log2 units), adds the
// attention-sink logit, rotates the rows back out of the value rotation and writes
// them in the query dtype. A second launch instead of the first's last block merging:
// that needed zeroed counters, and mx.fast.cuda_kernel's init_value fills every output
// (one more launch per output).
// Template constants: T (query dtype), D, H (KV heads), G, L, R, NW, HAS_SINKS (sink_logits holds
// one logit per query row, log2 units, centring shift folded in).
using namespace turbo;
constexpr int THREADS = NW * 32;
constexpr int ROWS = G * L;
constexpr int NRG = (ROWS + R - 1) / R;

const int n_parts = parts_shape[1];
const int rg = blockIdx.x % NRG, h = (blockIdx.x / NRG) % H;
const int b = blockIdx.x / (NRG * H);
const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
const int64_t group_parts = int64_t(blockIdx.x) * n_parts;

__shared__ float rows_out[R * D];
__shared__ float row_m[R], row_l[R];
for (int r = warp; r < R; r += NW) {
  const int row = rg * R + r, hq = h * G + row / L, i = row % L;
  float M = -INFINITY;
  for (int p = lane; p < n_parts; p += 32) M = fmaxf(M, stats[((group_parts + p) * R + r) * 2]);
  M = warp_max(M);
  float sink = -INFINITY;
  if constexpr (HAS_SINKS) {
    if (row < ROWS) sink = sink_logits[(int64_t(b) * (H * G) + hq) * L + i];
    M = fmaxf(M, sink);
  }
  float l = 0.0f;
  if (M != -INFINITY) {
    for (int p = lane; p < n_parts; p += 32) {
      const int64_t at = ((group_parts + p) * R + r) * 2;
      l += exp2_or_zero(stats[at] - M) * stats[at + 1];
    }
    l = warp_sum(l) + exp2_or_zero(sink - M);
  }
  if (lane == 0) {
    row_m[r] = M;
    row_l[r] = l;
  }
}
__syncthreads();
for (int idx = threadIdx.x; idx < R * D; idx += THREADS) {
  const int r = idx / D, d = idx % D;
  const float M = row_m[r];
  float o = 0.0f;
  if (M != -INFINITY) {
#pragma unroll 4
    for (int p = 0; p < n_parts; ++p) {
      const int64_t at = (group_parts + p) * R + r;
      o += exp2_or_zero(stats[at * 2] - M) * parts[at * D + d];
    }
  }
  rows_out[idx] = row_l[r] > 0.0f ? o / row_l[r] : 0.0f;
}
__syncthreads();
hadamard_rows<D>(rows_out, R);
const float unit = rsqrtf(float(D));
for (int idx = threadIdx.x; idx < R * D; idx += THREADS) {
  const int r = idx / D, d = idx % D, row = rg * R + r;
  if (row >= ROWS) continue;
  const int hq = h * G + row / L, i = row % L;
  out[((int64_t(b) * (H * G) + hq) * L + i) * D + d] =
      from_float<T>(rows_out[idx] * unit * v_signs[d]);
}
