"""The decode kernel checked against the portable path on the user's own machine, where
no run of ours has verified it: Apple GPUs, whose Metal build of
``kernels.decode_attention_simd`` runs only under ``MLX_LM_TURBO_KERNEL=on``.

A few decode steps over small caches of the kinds the kernel reads (packed keys and
values with sink tokens and a window of exact recent tokens; keys stored as they
are; a query of several tokens): a Metal compile error or a wrong answer is then a
clear refusal when a command starts, not a traceback or wrong text mid-generation.
"""

import mlx.core as mx

from ..kernels.decode_attention_simd import simd_decode_attention
from .attention import blockwise_attention
from .kv_cache import TurboQuantKVCache

# Relative to the portable path's output: the kernels' GPU tests hold 2e-3 (both paths
# accumulate in float32 and differ only in summation order).
TOLERANCE = 2e-3
CASES = (  # scheme, recent_exact, query tokens
    ("turbo4", 8, 1),
    ("turbo3", 1, 3),
    ("turbo0v4", 1, 1),
)


def check_decode_kernel(backend, dtype=mx.float16) -> "str | None":
    """Why the decode kernel built for ``backend`` must not serve here; None where it
    matched the portable path in every case."""
    for n, (scheme, recent_exact, L) in enumerate(CASES):
        cache = TurboQuantKVCache(scheme, recent_exact=recent_exact)
        keys, values = (
            mx.random.normal((1, 2, 300 + L, 128), key=mx.random.key(2 * n + i)).astype(
                dtype
            )
            for i in range(2)
        )
        cache.update_and_fetch(keys[:, :, :300], values[:, :, :300])
        view, _ = cache.update_and_fetch(keys[:, :, 300:], values[:, :, 300:])
        cache.settle(view)  # where MLX-CUDA's fast kernel would encode a decode token
        queries = mx.random.normal((1, 8, L, 128), key=mx.random.key(99)).astype(dtype)
        mask = cache.make_mask(L, return_array=False, window_size=None)
        scale = 128**-0.5
        try:
            out = simd_decode_attention(queries, view, scale, mask, None, backend)
            if out is None:
                return f"it declined a decode step it covers ({scheme})"
            reference = blockwise_attention(queries, view, scale, mask)
            mx.eval(out, reference)
        except Exception as error:  # a compile error surfaces when the step runs
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return f"it failed to build or run ({scheme}): {first_line}"
        difference = (
            mx.linalg.norm((out - reference).astype(mx.float32))
            / mx.linalg.norm(reference.astype(mx.float32))
        ).item()
        if not difference < TOLERANCE:
            return (
                f"its output differs from the portable path's by {difference:.1e} "
                f"relative ({scheme}; at most {TOLERANCE:.0e} expected)"
            )
    return None
