"""Which stored rows differ between a cache whose launches write rows in place (W 32)
and the plain update, on the GPU; variants: eval per step, every row reordered."""

import os
import sys

sys.path.insert(0, "tests")
import mlx.core as mx  # noqa: E402
import test_kernels as tk  # noqa: E402

import mlx_lm_turbo.cache.cache as cm  # noqa: E402
from mlx_lm_turbo import TurboQuantKVCache  # noqa: E402
from mlx_lm_turbo.kernels.decode_attention import tail_row  # noqa: E402

os.environ["MLX_LM_TURBO_KERNEL"] = "auto"
variant = sys.argv[1]
scheme, D, W, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dtype = mx.float16

if variant == "all_rows":
    real_store = cm.TurboQuantKVCache.store_row

    def store_row(self, view, rows, recent_rows=None):
        in_place = self._deferred[4]
        real_store(self, view, rows, recent_rows)
        if in_place:
            self.__dict__.setdefault("_all", []).append(self._rows_in_place)

    def order_rows(self):
        for position, rows in self.__dict__.pop("_all", []):
            self._write((tail_row(self.codec, rows),), position)
        self._rows_in_place = None

    cm.TurboQuantKVCache.store_row = store_row
    cm.TurboQuantKVCache._order_rows = order_rows


def new():
    return tk.filled_cache(TurboQuantKVCache(scheme, recent_exact=W), 766, 2, D, dtype)


def steps_of(cache):
    outs = []
    for s in range(steps):
        outs += tk.decode_steps(cache, 1, D=D, dtype=dtype, seed=30 + 3 * s)
        if variant == "eval":
            mx.eval(outs, cache._recent_rows[1] if cache._recent_rows else [])
    return outs


one, two = new(), new()
a = steps_of(one)
mx.eval(a)
real = cm.raw_tail_support
cm.raw_tail_support = lambda codec: False
b = steps_of(two)
cm.raw_tail_support = real
x, y = one.state[-1], two.state[-1]
mx.eval(x, y)
bad = mx.any(x != y, axis=-1)  # (B, H, T)
zero = mx.all(x == 0, axis=-1)
where = [
    (h, t, bool(zero[0, h, t].item()))
    for h in range(bad.shape[1])
    for t in range(bad.shape[2])
    if bad[0, h, t].item()
]
err = max(tk.relative_error(p, q) for p, q in zip(a, b))
print(
    f"{variant} {scheme} D{D} W{W} steps{steps}: out err {err:.2e}; rows differing (head, pos, one's row zero): {where}"
)
