// One block per output row (b, query head, query): merges the slices' partial
// outputs (log-sum-exp), adds the attention-sink logit if any, rotates the row
// back out of the value rotation and writes it in the model's dtype.
// Threads: D dims times CG groups that share the slices between them.
// Template constants: T, D, G, L, R, CG, HQ (query heads), HAS_SINKS.
using namespace turbo;
constexpr int NRG = (G * L + R - 1) / R;
const int n_parts = stats_shape[1], n_q_heads = HQ;
const int y = blockIdx.y, i = y % L, hq = (y / L) % n_q_heads, b = y / (L * n_q_heads);
const int h = hq / G, row = (hq % G) * L + i, rg = row / R, r = row % R;
const int64_t first_part = (int64_t(b) * (n_q_heads / G) + h) * NRG * n_parts + rg * n_parts;
const int d = threadIdx.x % D, cg = threadIdx.x / D;

__shared__ float group_m[CG], group_l[CG];
__shared__ float group_o[CG][D];
__shared__ float x[D];

float M = -INFINITY;
#pragma unroll 4
for (int p = cg; p < n_parts; p += CG) M = fmaxf(M, stats[((first_part + p) * R + r) * 2]);
if (d == 0) group_m[cg] = M;
__syncthreads();
#pragma unroll
for (int c = 0; c < CG; ++c) M = fmaxf(M, group_m[c]);
float sink = -INFINITY;
if constexpr (HAS_SINKS) {
  sink = sink_logits[y];
  M = fmaxf(M, sink);
}
float o = 0.0f, l = 0.0f;
if (M != -INFINITY) {
#pragma unroll 4
  for (int p = cg; p < n_parts; p += CG) {
    const int64_t at = (first_part + p) * R + r;
    const float f = exp2_or_zero(stats[at * 2] - M);
    o += f * parts[at * D + d];
    l += f * stats[at * 2 + 1];
  }
}
group_o[cg][d] = o;
if (d == 0) group_l[cg] = l;
__syncthreads();
if (cg == 0) {
  o = 0.0f;
  l = M == -INFINITY ? 0.0f : exp2_or_zero(sink - M);
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    o += group_o[c][d];
    l += group_l[c];
  }
  x[d] = l > 0.0f ? o / l : 0.0f;
}
__syncthreads();
hadamard_rows<D>(x, 1);
if (cg == 0) out[int64_t(y) * D + d] = from_float<T>(x[d] * rsqrtf(float(D)) * v_signs[d]);
