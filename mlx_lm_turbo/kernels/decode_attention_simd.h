// Helpers of the shared SIMD kernels, in the subset of CUDA C++ and Metal Shading
// Language both compile (with a backend's prelude before it).

// In-place unnormalised Walsh-Hadamard transform (Sylvester order, as
// mx.hadamard_transform) of `rows` vectors of length D in threadgroup memory, by
// the threadgroup's `threads` threads together (every one of them must call it).
template <int D>
INLINE void group_hadamard(TG float* x, int rows, int tid, int threads) {
  for (int h = 1; h < D; h <<= 1) {
    for (int p = tid; p < rows * (D / 2); p += threads) {
      const int r = p / (D / 2), k = p % (D / 2);
      const int i = r * D + (k / h) * 2 * h + (k % h);
      const float a = x[i], c = x[i + h];
      x[i] = a + c;
      x[i + h] = a - c;
    }
    BARRIER();
  }
}
