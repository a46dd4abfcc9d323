"""The prefill kernel (kernels/prefill_attention.cu) against the portable path on the
same compressed caches: on MLX-CUDA's GPU, else its g++ build on the CPU.

Tolerance: both paths read the same keys; the kernel multiplies float16/bfloat16
queries, keys, values and softmax weights on the tensor cores (float32 sums), where
the portable path dequantizes and computes scores and weights in float32. In float16
outputs agree within 2e-3 relative (as the decode kernel's). bfloat16 keeps 8 bits of
mantissa for the dequantized keys, values and weights (as cuDNN's flash attention
does for the weights): against the portable path in float32 within 1.5e-2, where
the portable path with bfloat16 queries is about 3.5e-3 from it.
"""

import mlx.core as mx
import pytest
from helpers import outlier_keys, relative_error

from mlx_lm_turbo import TurboQuantKVCache
from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention
from mlx_lm_turbo.kernels import KERNEL_ENV, fused_prefill_attention, prefill_attention

TOLERANCE = 2e-3
BF16_TOLERANCE = 1.5e-2


def chunk(cache, L, H, G, D, dtype, seed):
    k = outlier_keys((1, H, L, D), seed=seed).astype(dtype)
    v = mx.random.normal((1, H, L, D), key=mx.random.key(seed + 1)).astype(dtype)
    q = mx.random.normal((1, H * G, L, D), key=mx.random.key(seed + 2)).astype(dtype)
    mask = "causal"
    view, _ = cache.update_and_fetch(k, v)
    return q, view, mask


def compare(
    monkeypatch, cache, history, L, H=2, G=2, D=64, dtype=mx.float16, step=None
):
    """Fill ``history`` tokens in chunks of ``step``, then run a chunk of L queries
    through both paths."""
    step = step or max(history, 1)
    for start in range(0, history, step):
        n = min(step, history - start)
        chunk(cache, n, H, G, D, dtype, seed=start)
    q, view, mask = chunk(cache, L, H, G, D, dtype, seed=history + 99)
    scale = D**-0.5
    monkeypatch.setenv(KERNEL_ENV, "off")
    portable = turbo_scaled_dot_product_attention(
        q.astype(mx.float32) if dtype == mx.bfloat16 else q, view, scale, mask
    )
    monkeypatch.setenv(KERNEL_ENV, "on")
    fused = fused_prefill_attention(q, view, scale, mask)
    assert fused is not None, "the kernel declined a call it covers"
    assert fused.shape == q.shape and fused.dtype == q.dtype
    error = relative_error(fused, portable)
    assert error < (BF16_TOLERANCE if dtype == mx.bfloat16 else TOLERANCE), error
    return error


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "scheme, D, dtype",
    [
        ("turbo4", 64, mx.float16),
        ("turbo3", 128, mx.float16),
        ("turbo4v2", 64, mx.bfloat16),
        ("turbo0v4", 64, mx.float16),
    ],
)
def test_a_chunk_after_a_history_matches_the_portable_path(
    monkeypatch, scheme, D, dtype
):
    compare(monkeypatch, TurboQuantKVCache(scheme), 150, 70, D=D, dtype=dtype, step=64)


@pytest.mark.usefixtures("cuda_kernels")
def test_the_first_chunk_and_no_window(monkeypatch):
    compare(monkeypatch, TurboQuantKVCache("turbo4"), 0, 90)
    compare(monkeypatch, TurboQuantKVCache("turbo4", recent_exact=1), 40, 33)


@pytest.mark.usefixtures("cuda_kernels")
def test_history_in_segments(monkeypatch):
    monkeypatch.setattr(prefill_attention, "WORKSPACE_BYTES", 64 * 2 * 2 * 64 * 2)
    compare(monkeypatch, TurboQuantKVCache("turbo4"), 300, 40)
