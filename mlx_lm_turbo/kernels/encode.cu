// One warp per (batch, head, token): rotate, quantize and pack a key and a value
// vector into one row as codec.TurboCodec.encode does (codec.join_rows: key codes,
// value codes, a word of both fp16 norms), and keep their exact rotated copies.
// Lane j holds dims [j * DPL, (j + 1) * DPL). Template values (encode.template, declared
// in the header): T, D, KB, VB, NW, and whether the key calibration's CENTER and SCALE
// statistics are inputs.
// `consts` holds the key signs (D), value signs (D), key boundaries and levels (2^KB - 1
// and 2^KB where KB > 0), value boundaries and levels (2^VB - 1, 2^VB).
using namespace turbo;
const float* k_signs = consts;
const float* v_signs = consts + D;
const float* k_bounds = consts + 2 * D;
const float* k_levels = k_bounds + (KB > 0 ? (1 << KB) - 1 : 0);
const float* v_bounds = k_levels + (KB > 0 ? 1 << KB : 0);
const float* v_levels = v_bounds + (1 << VB) - 1;
constexpr int DPL = D / 32;
constexpr int KW = KB > 0 ? D * KB / 32 : 0, VW = D * VB / 32, W = KW + VW + 1;
const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
const int vector = blockIdx.x * NW + warp;
const int n_heads = values_shape[1], n_tokens = values_shape[2];
if (vector >= values_shape[0] * n_heads * n_tokens) return;  // whole warps only
const int t = vector % n_tokens, h = (vector / n_tokens) % n_heads, b = vector / (n_tokens * n_heads);
__shared__ uint32_t packed[NW][KW + VW];
float k_norm = 0.0f;  // keys stored as they are: the norms word's low half is 0

const int64_t out_row = int64_t(vector);
float v[DPL];
#pragma unroll
for (int k = 0; k < DPL; ++k) {
  v[k] = to_float(values[b * values_strides[0] + h * values_strides[1] + t * values_strides[2] +
                         (lane * DPL + k) * values_strides[3]]);
}
rotate_warp<D>(v, v_signs, lane);
const float v_norm = quantize_warp<D, VB>(v, v_bounds, v_levels, packed[warp] + KW, lane);
#pragma unroll
for (int k = 0; k < DPL; ++k) exact_values[out_row * D + lane * DPL + k] = from_float<T>(v[k]);

if constexpr (KB > 0) {
  float x[DPL];
#pragma unroll
  for (int k = 0; k < DPL; ++k) {
    const int d = lane * DPL + k;
    x[k] = to_float(keys[b * keys_strides[0] + h * keys_strides[1] + t * keys_strides[2] +
                         d * keys_strides[3]]);
    if constexpr (CENTER) x[k] -= key_mean[b * key_mean_strides[0] + h * key_mean_strides[1] + d];
    if constexpr (SCALE) x[k] /= key_scale[b * key_scale_strides[0] + h * key_scale_strides[1] + d];
  }
  rotate_warp<D>(x, k_signs, lane);
  k_norm = quantize_warp<D, KB>(x, k_bounds, k_levels, packed[warp], lane);
#pragma unroll
  for (int k = 0; k < DPL; ++k) exact_keys[out_row * D + lane * DPL + k] = from_float<T>(x[k]);
}
__syncwarp();
for (int w = lane; w < KW + VW; w += 32) rows[out_row * W + w] = packed[warp][w];
if (lane == 0) {
  rows[out_row * W + KW + VW] = norms_word(k_norm, v_norm);
}
