"""float16 caches stay finite on large finite values, and a token's bad key or value
reaches no row that cannot attend to it (issue 64)."""

import mlx.core as mx
import pytest

from mlx_lm_turbo import TurboQuantKVCache
from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention
from mlx_lm_turbo.codec.codec import TurboCodec
from mlx_lm_turbo.codec.schemes import parse_scheme
from mlx_lm_turbo.kernels.dispatch import KERNEL_ENV
from mlx_lm_turbo.kernels.encode import fused_encode

T, D, HEADS = 60, 128, 2


def inputs(dtype=mx.float16):
    keys, values, queries = (
        mx.random.normal((1, HEADS, T, D), key=mx.random.key(seed)).astype(dtype)
        for seed in range(3)
    )
    return queries, keys, values


def at(a, token, fill):
    """``a`` with every entry of ``token`` (all heads) set to ``fill``."""
    a = mx.array(a)
    a[:, :, token] = fill
    return a


def attend(queries, keys, values):
    """Causal attention of a 60-token prefill through a turbo4 cache."""
    kv, _ = TurboQuantKVCache("turbo4").update_and_fetch(keys, values)
    return turbo_scaled_dot_product_attention(queries, kv, D**-0.5, "causal")


@pytest.fixture(autouse=True)
def portable_path(monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, "off")


@pytest.mark.parametrize("large", [40000.0, 60000.0])
def test_a_large_finite_value_in_float16_keeps_every_row_finite(large):
    queries, keys, values = inputs()
    plain = attend(queries, keys, values)
    out = attend(queries, keys, at(values, 30, large))
    assert mx.isfinite(out).all().item()
    # the rows before it cannot see it: unchanged
    assert mx.array_equal(out[:, :, :30], plain[:, :, :30]).item()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_bad_key_at_a_sink_position_reaches_no_row_before_it(bad):
    # Rows from it on see it, as in exact attention; the key statistics, measured on
    # the sink tokens, leave it out (in them it would reach every key).
    queries, keys, values = inputs(mx.float32)
    plain = attend(queries, keys, values)
    out = attend(queries, at(keys, 2, bad), values)
    assert mx.allclose(out[:, :, :2], plain[:, :, :2], atol=1e-5).item()


@pytest.mark.parametrize("scheme", ["turbo4", "turbo0v4"])
def test_encoding_a_large_finite_value_in_float16_stays_finite(
    scheme, cuda_kernels, monkeypatch
):
    # the portable codec and the encode kernel (on the CPU: its g++ build)
    queries, keys, values = inputs()
    keys, values = at(keys, 30, 60000.0), at(values, 30, 60000.0)
    codec = TurboCodec.for_keys(parse_scheme(scheme), keys, values)
    for mode, encode in (("off", codec.encode), ("on", fused_encode.__get__(codec))):
        monkeypatch.setenv(KERNEL_ENV, mode)
        stored, exact_keys, exact_values = encode(keys, values)
        assert mx.isfinite(exact_keys).all().item(), mode
        assert mx.isfinite(exact_values).all().item(), mode
        norms = stored[-1][..., -1:].view(mx.float16)
        assert mx.isfinite(norms).all().item(), mode
