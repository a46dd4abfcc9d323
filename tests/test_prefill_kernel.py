"""The prefill kernel (kernels/prefill_attention.cu) against the portable path on the
same compressed caches: on MLX-CUDA's GPU, else its g++ build on the CPU.

Tolerance: both paths read the same keys; the kernel multiplies float16/bfloat16
queries, keys, values and softmax weights on the tensor cores (float32 sums), where
the portable path dequantizes and computes scores and weights in float32. In float16
outputs agree within 2e-3 relative (as the decode kernel's). bfloat16 keeps 8 bits of
mantissa for the dequantized keys, values and weights (as cuDNN's flash attention
does for the weights), where the portable path keeps them in float32: against the
portable path in float32 within 1.5e-2.

The kernel has two variants, mma.sync (every CUDA GPU) and wgmma (Hopper's warpgroup
MMA, head dims up to 128): the tests marked ``kernel_variant`` run each, on the CPU
both, on a GPU the mma.sync variant and, on Hopper, the wgmma one.
"""

import re
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import (
    ON_CUDA,
    outlier_keys,
    relative_error,
    scripts_compile_kernels,
    step_inputs,
)

from mlx_lm_turbo import TurboQuantKVCache, TurboQuantRotatingKVCache, parse_scheme
from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention
from mlx_lm_turbo.kernels import KERNEL_ENV, fused_prefill_attention, prefill_attention

TOLERANCE = 2e-3
BF16_TOLERANCE = 1.5e-2


@pytest.fixture(params=["mma.sync", "wgmma"])
def kernel_variant(request, monkeypatch):
    wgmma = request.param == "wgmma"
    if ON_CUDA and wgmma and not prefill_attention._hopper():
        pytest.skip("the wgmma variant runs on Hopper GPUs only")
    monkeypatch.setattr(prefill_attention, "_hopper", lambda: wgmma)
    tiling, used = prefill_attention.tiling, []
    monkeypatch.setattr(
        prefill_attention,
        "tiling",
        lambda head_dim, wgmma: (
            used.append((head_dim, wgmma)) or tiling(head_dim, wgmma)
        ),
    )
    yield request.param
    assert used, "no launch"
    assert all(w == (wgmma and d <= 128) for d, w in used), used


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "scheme, D, dtype",
    [
        ("turbo4", 128, mx.float16),
        ("turbo3", 64, mx.bfloat16),
        ("turbo2", 128, mx.float16),
        ("turbo5v3", 64, mx.float16),
        ("turbo6v2", 128, mx.bfloat16),
        ("turbo8", 64, mx.float16),
        ("turbo0v4", 64, mx.float16),
    ],
)
def test_the_dequantizing_launch_is_the_codecs_decode(scheme, D, dtype):
    cache = TurboQuantKVCache(scheme)
    step_inputs(cache, 40, 2, 1, D, dtype, seed=1)
    codec, stored = cache.codec, cache._stored_slice()
    keys, values = prefill_attention.dequantize(codec, stored[-1][:, :, 5:], dtype)
    want_keys, want_values = codec.decode(tuple(a[:, :, 5:] for a in stored))
    bound = 8e-3 if dtype == mx.bfloat16 else 1e-3  # one rounding of the product
    assert relative_error(values, want_values) < bound
    if codec.scheme.key_bits:
        assert relative_error(keys, want_keys) < bound
    else:
        assert keys is None


def compare(
    monkeypatch, cache, history, L, H=2, G=2, D=64, dtype=mx.float16, step=None
):
    """Fill ``history`` tokens in chunks of ``step``, then run a chunk of L queries
    through both paths."""
    step = step or max(history, 1)
    for start in range(0, history, step):
        n = min(step, history - start)
        step_inputs(cache, n, H, G, D, dtype, seed=start)
    q, view, mask = step_inputs(cache, L, H, G, D, dtype, seed=history + 99)
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


@pytest.mark.usefixtures("cuda_kernels", "kernel_variant")
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


@pytest.mark.usefixtures("cuda_kernels", "kernel_variant")
def test_the_first_chunk_and_no_window(monkeypatch):
    compare(monkeypatch, TurboQuantKVCache("turbo4"), 0, 90)
    compare(monkeypatch, TurboQuantKVCache("turbo4", recent_exact=1), 40, 33)


@pytest.mark.usefixtures("cuda_kernels", "kernel_variant")
def test_history_in_segments(monkeypatch):
    monkeypatch.setattr(prefill_attention, "WORKSPACE_BYTES", 64 * 2 * 2 * 64 * 2)
    compare(monkeypatch, TurboQuantKVCache("turbo4"), 300, 40)


@pytest.mark.usefixtures("cuda_kernels", "kernel_variant")
@pytest.mark.parametrize(
    "scheme, H, G, D",
    [("turbo4", 1, 2, 256), ("turbo2", 1, 4, 128), ("turbo5v3", 4, 1, 64)],
)
def test_head_dims_and_gqa(monkeypatch, scheme, H, G, D):
    compare(monkeypatch, TurboQuantKVCache(scheme), 80, 40, H=H, G=G, D=D, step=40)


@pytest.mark.usefixtures("cuda_kernels", "kernel_variant")
def test_a_sliding_window_cache_within_its_window(monkeypatch):
    compare(monkeypatch, TurboQuantRotatingKVCache("turbo4", max_size=512), 100, 50)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The prefill launches' calls, one entry each."""
    calls = []
    launch = prefill_attention.prefill_attention
    monkeypatch.setattr(
        prefill_attention,
        "prefill_attention",
        lambda *a: calls.append(1) or launch(*a),
    )
    return calls


def outputs_by_chunks(chunk_size, n=144, H=2, G=2, D=64):
    """Each token's attention output over a sequence prefilled in chunks of
    ``chunk_size``."""
    cache = TurboQuantKVCache("turbo4")
    keys = outlier_keys((1, H, n, D), seed=3).astype(mx.float16)
    values = mx.random.normal((1, H, n, D), key=mx.random.key(4)).astype(mx.float16)
    queries = mx.random.normal((1, H * G, n, D), key=mx.random.key(5))
    queries = queries.astype(mx.float16)
    outs = []
    for start in range(0, n, chunk_size):
        end = min(start + chunk_size, n)
        view, _ = cache.update_and_fetch(keys[:, :, start:end], values[:, :, start:end])
        q = queries[:, :, start:end]
        out = turbo_scaled_dot_product_attention(q, view, D**-0.5, "causal")
        outs.append(out)
    return mx.concatenate(outs, axis=2)


@pytest.mark.usefixtures("cuda_kernels", "kernel_variant")
def test_outputs_do_not_depend_on_the_chunking(monkeypatch, kernel_calls):
    monkeypatch.setenv(KERNEL_ENV, "on")
    by_48, by_80 = outputs_by_chunks(48), outputs_by_chunks(80)
    assert len(kernel_calls) == 3 + 2, "every chunk takes the kernel"
    # Each row is the same sums in the same order (tiles at absolute positions).
    assert mx.array_equal(by_48, by_80).item()


@pytest.mark.usefixtures("cuda_kernels", "kernel_variant")
def test_batch_rows_of_different_lengths(monkeypatch, kernel_calls):
    from mlx_lm_turbo.cache.kv_cache import TurboQuantBatchKVCache

    pads, H, G, D = [0, 37], 2, 2, 64
    cache = TurboQuantBatchKVCache(
        parse_scheme("turbo4"), left_padding=pads, recent_exact=16
    )
    B = len(pads)
    for n, seed in ((64, 0), (64, 1), (48, 2)):
        k = outlier_keys((B, H, n, D), seed=seed).astype(mx.float16)
        v = mx.random.normal((B, H, n, D), key=mx.random.key(seed + 10))
        q = mx.random.normal((B, H * G, n, D), key=mx.random.key(seed + 20))
        mask = cache.make_mask(n, return_array=True)
        view, _ = cache.update_and_fetch(k, v.astype(mx.float16))
        q = q.astype(mx.float16)
        monkeypatch.setenv(KERNEL_ENV, "off")
        portable = turbo_scaled_dot_product_attention(q, view, D**-0.5, mask)
        monkeypatch.setenv(KERNEL_ENV, "on")
        kernel_calls.clear()
        fused = turbo_scaled_dot_product_attention(q, view, D**-0.5, mask)
        assert kernel_calls, "a batch cache's own mask takes the kernel"
        first = view.shape[2] - n
        for row, pad in enumerate(pads):  # the rows' real queries
            start = max(pad - first, 0)
            error = relative_error(fused[row, :, start:], portable[row, :, start:])
            assert error < TOLERANCE, (row, error)


@pytest.mark.slow  # an nvcc subprocess
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_wgmma_variant_compiles_for_hopper_without_spilling():
    # Where no Hopper GPU runs the tests, ptxas still reads its PTX for sm_90a.
    compile_kernels = scripts_compile_kernels()
    variant = next(v for v in compile_kernels.prefill_variants() if v[0])
    with tempfile.TemporaryDirectory() as tmp:
        run = compile_kernels.compile_unit(
            compile_kernels.prefill_unit(*variant),
            "sm_90a",
            Path(tmp) / "unit.cu",
            Path(tmp) / "unit.cubin",
        )
    assert run.returncode == 0, run.stderr[-4000:]
    assert re.search(r"Used \d+ registers", run.stderr), run.stderr  # ptxas ran
    assert " 0 bytes spill stores" in run.stderr, run.stderr
