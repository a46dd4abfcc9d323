"""Host microseconds to build one decode layer of the default turbo4 cache (W 16) with the
kernels stubbed (``benchmarks/kernel_host_cost.py``'s stand-ins), as it is and with the
checks a steady decode step repeats skipped: the kernel mode and layer support
(``use_kernel``), the call's support, the cache's routing checks (``_defers`` once per
cache, ``_compressing``) and the sink tuple (made once). An upper bound on what trimming
those checks could save, not a change to make: they stay where a user can change the mode
or the inputs between calls. SmolLM2's decode shapes, 2048 cached tokens; medians of 300
layers, the least of five rounds.

    python benchmarks/results/decode_layer_checks_cpu.py
"""

import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models import base as mlx_base

sys.path.insert(0, str(Path(__file__).parents[1]))
from kernel_host_cost import stub_kernels  # noqa: E402

stub_kernels()
import mlx_lm_turbo.cache.cache as cache_module  # noqa: E402
import mlx_lm_turbo.kernels.decode_attention as decode_attention  # noqa: E402
from mlx_lm_turbo import TurboQuantKVCache  # noqa: E402
from mlx_lm_turbo.cache.attention import install_attention_dispatch  # noqa: E402

D, Q_HEADS, KV_HEADS = 64, 9, 3


def layer_build_us(history, query):
    cache = TurboQuantKVCache("turbo4", recent_exact=16)
    cache.update_and_fetch(history, history)
    token = history[:, :, :1]

    def layer():
        keys, values = cache.update_and_fetch(token, token)
        return mlx_base.scaled_dot_product_attention(
            query, keys, values, cache=cache, scale=D**-0.5, mask=None
        )

    for _ in range(20):
        mx.eval(layer())
    medians = []
    for _ in range(5):
        times = []
        for _ in range(300):
            start = time.perf_counter()
            out = layer()
            times.append(time.perf_counter() - start)
            mx.eval(out)
        medians.append(statistics.median(times) * 1e6)
    return min(medians)


def skip_checks():
    TurboCache = cache_module.TurboQuantKVCache
    defers, compressing = TurboCache._defers, TurboCache._compressing

    def defers_once(self, keys):
        if self.stored is None or keys.shape[2] != 1:
            return False
        return self.__dict__.setdefault("_defers_once", defers(self, keys))

    def sinks_once(self, width):
        made = (*self._attention_sinks(), cache_module._leading_positions(16))
        return self.__dict__.setdefault("_sinks_once", made)

    decode_attention.use_kernel = lambda codec: True
    decode_attention.call_support = lambda *args: None
    TurboCache._defers = defers_once
    TurboCache._compressing = lambda self, keys, values: (
        self.codec is not None or compressing(self, keys, values)
    )
    cache_module._TurboCache._sinks_in = sinks_once


def layer_inputs():
    """(history, query) of a timed layer, with turbo attention installed; prints the
    device."""
    install_attention_dispatch()
    history = mx.random.normal((1, KV_HEADS, 2048, D)).astype(mx.float16)
    query = mx.random.normal((1, Q_HEADS, 1, D)).astype(mx.float16)
    mx.eval(history, query)
    print(f"{mx.default_device()}, MLX {mx.__version__}")
    return history, query


def main():
    history, query = layer_inputs()
    print(f"as it is: {layer_build_us(history, query):.1f} us a layer")
    skip_checks()
    print(f"checks skipped: {layer_build_us(history, query):.1f} us a layer")


if __name__ == "__main__":
    main()
