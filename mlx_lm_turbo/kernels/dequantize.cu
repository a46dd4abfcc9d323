// Stored rows (codec.join_rows) of a run of tokens, dequantized into the attention
// domain: level times norm, in the model's dtype (the codec's `decode`). One thread:
// eight dims of one token's key and value in one head, written as 16 bytes each.
// `rows`: (B, H, N, RW) uint32, any strides; `keys_out`, `values_out`: (B, H, N, D); `levels`: the key levels (2^KB, where
// KB > 0), then the value levels (2^VB). The header's constants: T, D, KB, VB, KW
// (key code words), RW (row words).
using namespace turbo;
constexpr int CHUNKS = D / 8;
const int n = rows_shape[2];
const int x = blockIdx.x * blockDim.x + threadIdx.x;
const int t = x / CHUNKS, c = x % CHUNKS;
const int h = blockIdx.y, b = blockIdx.z;
if (t < n) {
  const uint32_t* row = rows + b * rows_strides[0] + h * rows_strides[1] + t * rows_strides[2];
  const uint32_t norms = row[RW - 1];
  const size_t at = ((size_t(b) * gridDim.y + h) * n + t) * D + c * 8;
  // Eight BITS-bit codes from bit `first` of the row: at most three words.
  auto decode = [&](auto bits_constant, int first, const float* table, float norm, T* out) {
    constexpr int BITS = decltype(bits_constant)::value;
    const int word = first >> 5;
    const uint32_t w[3] = {row[word], row[min(word + 1, RW - 1)], row[min(word + 2, RW - 1)]};
    uint32_t packed[4];
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      float pair[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int bit = (first & 31) + (j + i) * BITS, k = bit >> 5, shift = bit & 31;
        uint32_t v = w[k] >> shift;
        if (shift + BITS > 32 && k < 2) v |= w[k + 1] << (32 - shift);
        pair[i] = table[v & ((1u << BITS) - 1u)] * norm;
      }
      const T lo = from_float<T>(pair[0]), hi = from_float<T>(pair[1]);
      packed[j / 2] = uint32_t(*reinterpret_cast<const uint16_t*>(&lo)) |
                      uint32_t(*reinterpret_cast<const uint16_t*>(&hi)) << 16;
    }
    *reinterpret_cast<uint4*>(out + at) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  };
  const float value_norm = __half2float(__ushort_as_half(norms >> 16));
  decode(Int<VB>{}, KW * 32 + c * 8 * VB, levels + (KB > 0 ? 1 << KB : 0), value_norm,
         values_out);
  if constexpr (KB > 0) {
    const float key_norm = __half2float(__ushort_as_half(norms & 0xffffu));
    decode(Int<KB>{}, c * 8 * KB, levels, key_norm, keys_out);
  }
}
