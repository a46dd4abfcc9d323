import copy

import mlx.core as mx
import pytest
from helpers import outlier_keys, relative_error
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache

import mlx_lm_turbo.cache.attention as attention
from mlx_lm_turbo import TurboQuantKVCache, TurboQuantRotatingKVCache
from mlx_lm_turbo.cache.attention import (
    dense_prefill_attention,
    dense_prefill_rule,
    dense_prefill_support,
    turbo_scaled_dot_product_attention,
)

D = 64
DENSE_PREFILL_BYTES = attention.DENSE_PREFILL_BYTES  # the default, for the dense tests


@pytest.fixture(autouse=True)
def portable_path(monkeypatch):
    """This module holds the portable blockwise path to the rule at 1e-3 on every
    backend; on a GPU the fused kernel would take its decode calls (its fp16 tensor-core
    math is held to this path at 2e-3 in tests/test_kernels.py: 1.7e-3 measured here on
    the H200) and MLX-CUDA's fused attention its prefill calls (the dense tests below)."""
    monkeypatch.setenv("MLX_LM_TURBO_KERNEL", "off")
    monkeypatch.setattr(attention, "DENSE_PREFILL_BYTES", 0)


def inputs(T, L, n_q_heads=4, n_kv_heads=2, seed=0, dtype=mx.float32):
    keys = outlier_keys((1, n_kv_heads, T, D), seed=seed, bias=40.0).astype(dtype)
    values = mx.random.normal(
        (1, n_kv_heads, T, D), key=mx.random.key(seed + 1)
    ).astype(dtype)
    queries = mx.random.normal(
        (1, n_q_heads, L, D), key=mx.random.key(seed + 2)
    ).astype(dtype)
    return queries, keys, values


def run_both(
    scheme,
    queries,
    keys,
    values,
    mask,
    sinks=None,
    prefix=None,
    rotating=None,
    key_calibration=None,
):
    """Attend the last L tokens after caching the first T - L, in turbo and in fp."""
    L, T = queries.shape[2], keys.shape[2]
    prefix = T - L if prefix is None else prefix
    ref = RotatingKVCache(*rotating) if rotating else KVCache()
    options = dict(key_calibration=key_calibration)
    turbo = (
        TurboQuantRotatingKVCache(scheme, *rotating, **options)
        if rotating
        else TurboQuantKVCache(scheme, **options)
    )
    for c in (ref, turbo):
        if prefix:
            c.update_and_fetch(keys[:, :, :prefix], values[:, :, :prefix])
    rk, rv = ref.update_and_fetch(keys[:, :, prefix:], values[:, :, prefix:])
    view, _ = turbo.update_and_fetch(keys[:, :, prefix:], values[:, :, prefix:])
    scale = D**-0.5
    expected = mx.fast.scaled_dot_product_attention(
        queries, rk, rv, scale=scale, mask=mask, sinks=sinks
    )
    got = turbo_scaled_dot_product_attention(queries, view, scale, mask, sinks)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    return relative_error(got, expected)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "additive", "window"])
@pytest.mark.parametrize("n_q_heads", [2, 4, 16])
def test_every_mask_kind_and_gqa_ratio(mask_kind, n_q_heads):
    T, L = 96, 1 if mask_kind == "none" else 32
    queries, keys, values = inputs(T, L, n_q_heads=n_q_heads)
    bool_mask = create_causal_mask(L, T - L)
    mask = {
        "none": None,
        "causal": "causal",
        "bool": bool_mask,
        "additive": mx.where(bool_mask, 0.0, -1e9),
        "window": create_causal_mask(L, T - L, window_size=20),
    }[mask_kind]
    # harsh synthetic keys (bias 40, 10x outlier channels): loose bounds; quality
    # is measured on the real model (benchmarks/key_calibration.py). A single query
    # (mask "none") varies most with the rotation: turbo4 over 12 rotation seeds,
    # 4 query heads, statistics from the 16 sink tokens: mean 0.22, max 0.375.
    assert run_both("turbo8", queries, keys, values, mask) < 0.04
    assert run_both("turbo4", queries, keys, values, mask) < 0.4


def test_equivalent_masks_give_identical_output():
    queries, keys, values = inputs(96, 32)
    bool_mask = create_causal_mask(32, 64)
    outputs = []
    for mask in ("causal", bool_mask, mx.where(bool_mask, 0.0, -1e9)):
        cache = TurboQuantKVCache("turbo3")
        cache.update_and_fetch(keys[:, :, :64], values[:, :, :64])
        view, _ = cache.update_and_fetch(keys[:, :, 64:], values[:, :, 64:])
        outputs.append(turbo_scaled_dot_product_attention(queries, view, D**-0.5, mask))
    assert mx.allclose(outputs[0], outputs[1], atol=1e-5).item()
    assert mx.allclose(outputs[0], outputs[2], atol=1e-5).item()


def test_error_grows_as_bits_drop():
    queries, keys, values = inputs(256, 1)
    errors = [
        run_both(s, queries, keys, values, None)
        for s in ("turbo8", "turbo4", "turbo3", "turbo2")
    ]
    # One query, one rotation draw: turbo2's error here ranges 0.5-0.95 over rotation seeds
    # (mean 0.77 over 48 seeds and 16 queries, the same for either sign source), so its cap
    # catches a broken codec, not a statistic.
    assert errors == sorted(errors) and errors[0] < 0.02 and errors[-1] < 0.7


@pytest.mark.parametrize("calibration", ["center", "center+scale"])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_attention_sinks_with_centred_keys(mask, calibration):
    L = 1 if mask is None else 16
    queries, keys, values = inputs(128, L)
    sinks = mx.array([0.5, 3.0, -1.0, 2.0])
    # keys carry a large common offset, so a missing score shift would be visible (0.37
    # here); what is left is 8-bit error on keys centred by the 16 sink tokens' mean
    assert (
        run_both(
            "turbo8",
            queries,
            keys,
            values,
            mask,
            sinks=sinks,
            key_calibration=calibration,
        )
        < 0.04
    )


@pytest.mark.parametrize("calibration", ["none", "center", "center+scale"])
def test_every_calibration_leaves_scores_unchanged(calibration):
    # at 8 bits the only error left is quantization: the folds are exact. Uncentred keys
    # (bias 40) quantize worse: over 32 rotation seeds "none" gives 0.0195 on average, up to
    # 0.025 (either sign source), the folds 0.010-0.012, up to 0.016.
    queries, keys, values = inputs(128, 8)
    limit = 0.03 if calibration == "none" else 0.02
    assert (
        run_both("turbo8", queries, keys, values, "causal", key_calibration=calibration)
        < limit
    )


def test_sink_tokens_and_each_query_itself_are_read_exactly():
    # A first chunk of sink tokens only: every key a query sees is exact, even at 2 bits.
    n = TurboQuantKVCache.sink_tokens
    queries, keys, values = inputs(n, n)
    assert run_both("turbo2", queries, keys, values, "causal", prefix=0) < 1e-3


def test_rotating_window_prefill_and_decode():
    queries, keys, values = inputs(200, 40)
    ref, turbo = RotatingKVCache(64, 0), TurboQuantRotatingKVCache("turbo8", 64, 0)
    for c in (ref, turbo):
        c.update_and_fetch(keys[:, :, :160], values[:, :, :160])
    m = ref.make_mask(40, window_size=64)
    assert mx.array_equal(m, turbo.make_mask(40, window_size=64)).item()
    rk, rv = ref.update_and_fetch(keys[:, :, 160:], values[:, :, 160:])
    view, _ = turbo.update_and_fetch(keys[:, :, 160:], values[:, :, 160:])
    expected = mx.fast.scaled_dot_product_attention(
        queries, rk, rv, scale=D**-0.5, mask=m
    )
    assert (
        relative_error(
            turbo_scaled_dot_product_attention(queries, view, D**-0.5, m), expected
        )
        < 0.02
    )


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision_models(dtype):
    queries, keys, values = inputs(128, 1, dtype=dtype)
    assert run_both("turbo8", queries, keys, values, None) < 0.04


def reference_attention(queries, view, scale, mask, sinks=None):
    """TurboKV's rule spelled out, one query at a time, in float32: every key dequantized,
    then the sink tokens and the exact tail within the query's window overwritten, then
    one fused SDPA."""
    codec = copy.copy(view.codec)
    codec.dtype = mx.float32

    def f32(a):
        return a.astype(mx.float32)

    B, _, L, _ = queries.shape
    T = view.shape[2]
    n = 0 if view.new_keys is None else view.new_keys.shape[2]
    if isinstance(mask, str):
        mask = create_causal_mask(L, T - L)
    shift = codec.score_shift(queries, scale) if sinks is not None else None
    compressed = codec.decode(view.stored)
    outputs = []
    for i in range(L):
        keys, values = (mx.array(a) for a in compressed)
        if view.sinks is not None:
            sink_keys, sink_values, positions = view.sinks
            keys = mx.put_along_axis(keys, positions, f32(sink_keys), axis=2)
            values = mx.put_along_axis(values, positions, f32(sink_values), axis=2)
        if n:
            start = (
                T - n
                if view.window is None
                else max(T - n, T - L + i - view.window + 1)
            )
            keys[:, :, start:] = f32(view.new_keys[:, :, start - (T - n) :])
            values[:, :, start:] = f32(view.new_values[:, :, start - (T - n) :])
        row_mask = None if mask is None else mask[..., i : i + 1, :]
        if row_mask is not None and row_mask.dtype != mx.bool_:
            row_mask = row_mask.astype(mx.float32)
        if shift is not None:  # the centring shift as a score offset on every key
            row_shift = shift[:, :, i : i + 1]
            if row_mask is None:
                row_mask = row_shift
            elif row_mask.dtype == mx.bool_:
                row_mask = mx.where(row_mask, row_shift, mx.finfo(mx.float32).min)
            else:
                row_mask = row_mask + row_shift
        q = codec.prepare_queries(queries[:, :, i : i + 1].astype(mx.float32))
        outputs.append(
            mx.fast.scaled_dot_product_attention(
                q, keys, values, scale=scale, mask=row_mask, sinks=sinks
            )
        )
    return codec.restore_output(mx.concatenate(outputs, axis=2)).astype(queries.dtype)


@pytest.fixture(params=["whole chunk", "query slices"])
def small_blocks(monkeypatch, request):
    """Blocks of 16 keys, so short test histories span many blocks; with query slices,
    a chunk's queries also go a few rows at a time."""
    monkeypatch.setattr(attention, "DECODE_BLOCK_TOKENS", 16)
    monkeypatch.setattr(attention, "PREFILL_BLOCK_SCORES", 16)
    monkeypatch.setattr(attention, "_MIN_BLOCK_TOKENS", 16)
    if request.param == "query slices":
        monkeypatch.setattr(attention, "PREFILL_QUERY_ROWS", 16)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "additive", "window"])
@pytest.mark.parametrize("n_q_heads", [2, 8])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("dtype", [mx.float16, mx.float32])
def test_blockwise_equals_the_rule_spelled_out(
    small_blocks, mask_kind, n_q_heads, with_sinks, dtype
):
    T, L = 150, 1 if mask_kind == "none" else 37
    queries, keys, values = inputs(T, L, n_q_heads=n_q_heads, dtype=dtype)
    bool_mask = create_causal_mask(L, T - L)
    mask = {
        "none": None,
        "causal": "causal",
        "bool": bool_mask,
        "additive": mx.where(bool_mask, 0.0, -1e9).astype(dtype),
        "window": create_causal_mask(L, T - L, window_size=50),
    }[mask_kind]
    sinks = mx.linspace(-1.0, 3.0, n_q_heads) if with_sinks else None
    cache = TurboQuantKVCache("turbo4")
    cache.update_and_fetch(keys[:, :, : T - L], values[:, :, : T - L])
    view, _ = cache.update_and_fetch(keys[:, :, T - L :], values[:, :, T - L :])
    got = turbo_scaled_dot_product_attention(queries, view, D**-0.5, mask, sinks)
    assert got.dtype == dtype
    assert (
        relative_error(got, reference_attention(queries, view, D**-0.5, mask, sinks))
        < 1e-3
    )


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "additive", "window"])
@pytest.mark.parametrize("recent_exact", [1, 8])
@pytest.mark.parametrize("blocks", ["one", "many"])
def test_one_pass_decode_equals_the_rule_spelled_out(
    monkeypatch, mask_kind, recent_exact, blocks
):
    """A decode step takes the one-pass path (never the blockwise one), a history of
    one block or of many, and reads what the rule says."""
    if blocks == "many":
        monkeypatch.setattr(attention, "DECODE_BLOCK_TOKENS", 16)
        monkeypatch.setattr(attention, "_MIN_BLOCK_TOKENS", 16)

    def refused(*args):
        raise AssertionError("a decode step went blockwise")

    monkeypatch.setattr(attention, "blockwise_attention", refused)
    T = 150
    queries, keys, values = inputs(T, 1, n_q_heads=8, dtype=mx.float16)
    bool_mask = create_causal_mask(1, T - 1)
    mask = {
        "none": None,
        "causal": "causal",
        "bool": bool_mask,
        "additive": mx.where(bool_mask, 0.0, -1e9).astype(mx.float16),
        "window": create_causal_mask(1, T - 1, window_size=50),
    }[mask_kind]
    cache = TurboQuantKVCache("turbo4", recent_exact=recent_exact)
    cache.update_and_fetch(keys[:, :, : T - 1], values[:, :, : T - 1])
    view, _ = cache.update_and_fetch(keys[:, :, T - 1 :], values[:, :, T - 1 :])
    cache.settle(view)  # encoded as a step the fused kernel does not serve
    got = turbo_scaled_dot_product_attention(queries, view, D**-0.5, mask)
    assert got.dtype == mx.float16
    assert relative_error(got, reference_attention(queries, view, D**-0.5, mask)) < 1e-3


@pytest.mark.parametrize("L", [1, 9])
def test_blockwise_batch_rows_with_left_padding_and_sink_tokens(small_blocks, L):
    from mlx_lm_turbo.cache.kv_cache import TurboQuantBatchKVCache
    from mlx_lm_turbo.codec.schemes import parse_scheme

    lengths = [70, 3, 41]  # one row with fewer real tokens than sink slots
    seqs = [inputs(n + L, L, seed=i, dtype=mx.float16) for i, n in enumerate(lengths)]
    batch = TurboQuantBatchKVCache(
        parse_scheme("turbo4"), [max(lengths) - n for n in lengths]
    )

    def pad(a, n):
        return mx.pad(a, [(0, 0), (0, 0), (max(lengths) - n, 0), (0, 0)])

    batch.update_and_fetch(
        mx.concatenate([pad(k[:, :, :n], n) for (_, k, _), n in zip(seqs, lengths)]),
        mx.concatenate([pad(v[:, :, :n], n) for (_, _, v), n in zip(seqs, lengths)]),
    )
    mask = batch.make_mask(L, return_array=True)
    view, _ = batch.update_and_fetch(
        mx.concatenate([k[:, :, n:] for (_, k, _), n in zip(seqs, lengths)]),
        mx.concatenate([v[:, :, n:] for (_, _, v), n in zip(seqs, lengths)]),
    )
    queries = mx.concatenate([q for q, _, _ in seqs])
    got = turbo_scaled_dot_product_attention(queries, view, D**-0.5, mask)
    assert relative_error(got, reference_attention(queries, view, D**-0.5, mask)) < 1e-3


@pytest.mark.parametrize("L", [1, 12])
def test_blockwise_rotating_window(small_blocks, L):
    queries, keys, values = inputs(120, L, dtype=mx.float16)
    cache = TurboQuantRotatingKVCache("turbo4", 48, 0)
    cache.update_and_fetch(keys[:, :, :60], values[:, :, :60])
    for t in range(60, 120 - L):  # the ring wraps
        cache.update_and_fetch(keys[:, :, t : t + 1], values[:, :, t : t + 1])
    mask = cache.make_mask(L, window_size=48)
    view, _ = cache.update_and_fetch(keys[:, :, 120 - L :], values[:, :, 120 - L :])
    got = turbo_scaled_dot_product_attention(queries, view, D**-0.5, mask)
    assert relative_error(got, reference_attention(queries, view, D**-0.5, mask)) < 1e-3


# The dense prefill path hands MLX's attention the dequantized history in the model
# dtype: float32 models are held to the rule as tightly as the blockwise path, half
# precision ones within their own rounding (scores and weights in 16 bits: about 1e-3
# relative on CPU, where MLX rounds the scores to the model dtype).
DENSE_LIMITS = {mx.float32: 1e-4, mx.float16: 5e-3, mx.bfloat16: 3e-2}


@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize(
    "scheme,recent_exact",
    [("turbo4", 1), ("turbo3", 1), ("turbo0v4", 1), ("turbo4", 5)],
)
@pytest.mark.parametrize("sliced", [False, True])
def test_dense_prefill_equals_the_rule_spelled_out(
    monkeypatch, mask, dtype, scheme, recent_exact, sliced
):
    monkeypatch.setattr(attention, "DENSE_PREFILL_BYTES", DENSE_PREFILL_BYTES)
    if sliced:  # the mask in slices of 10 query rows
        monkeypatch.setattr(attention, "DENSE_MASK_BYTES", 10 * 187 * 5)
    T, L = 150, 37
    queries, keys, values = inputs(T, L, n_q_heads=8, dtype=dtype)
    cache = TurboQuantKVCache(
        scheme, key_calibration="center+scale", recent_exact=recent_exact
    )
    cache.update_and_fetch(keys[:, :, : T - L], values[:, :, : T - L])
    view, _ = cache.update_and_fetch(keys[:, :, T - L :], values[:, :, T - L :])
    assert view.sinks is not None  # the sink tokens sit in the history
    assert dense_prefill_rule(queries, view, mask) is None
    got = dense_prefill_attention(queries, view, D**-0.5, mask)
    assert got.dtype == dtype
    expected = reference_attention(queries, view, D**-0.5, mask)
    assert relative_error(got, expected) < DENSE_LIMITS[dtype]


@pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="MLX on CPU has no fused SDPA"
)
def test_dense_prefill_gives_way_where_mlx_attention_is_not_fused():
    queries, keys, values = inputs(40, 8, dtype=mx.float16)
    view, _ = TurboQuantKVCache("turbo4").update_and_fetch(keys, values)
    assert dense_prefill_attention(queries, view, D**-0.5, "causal", True) is None


def test_dense_prefill_first_chunk_holds_its_sink_tokens_in_the_tail():
    queries, keys, values = inputs(40, 40, dtype=mx.float16)
    view, _ = TurboQuantKVCache("turbo2").update_and_fetch(keys, values)
    got = dense_prefill_attention(queries, view, D**-0.5, "causal")
    expected = reference_attention(queries, view, D**-0.5, "causal")
    assert relative_error(got, expected) < DENSE_LIMITS[mx.float16]


def test_dense_prefill_rule_sends_the_rest_blockwise(monkeypatch):
    queries, keys, values = inputs(96, 16, dtype=mx.float16)
    cache = TurboQuantKVCache("turbo4")
    cache.update_and_fetch(keys[:, :, :80], values[:, :, :80])
    view, _ = cache.update_and_fetch(keys[:, :, 80:], values[:, :, 80:])
    monkeypatch.setattr(attention, "DENSE_PREFILL_BYTES", DENSE_PREFILL_BYTES)
    assert dense_prefill_rule(queries, view, "causal") is None
    assert "array mask" in dense_prefill_rule(queries, view, create_causal_mask(16, 80))
    assert "sink logits" in dense_prefill_rule(queries, view, None, mx.zeros((4,)))
    n = 96 + 16  # the stored tokens and the exact tail
    monkeypatch.setattr(attention, "DENSE_MASK_BYTES", 5 * n * 3)  # 5-row slices
    monkeypatch.setattr(
        attention, "DENSE_PREFILL_BYTES", 2 * 2 * n * D * 2 + 5 * n * 3 - 1
    )
    assert "MiB of dequantized history and mask" in dense_prefill_rule(
        queries, view, None
    )


def test_dense_prefill_on_apple_gpus_only_when_asked_for(monkeypatch):
    queries, keys, values = inputs(96, 16, dtype=mx.float16)
    view, _ = TurboQuantKVCache("turbo4").update_and_fetch(keys, values)
    monkeypatch.setattr(attention, "DENSE_PREFILL_BYTES", DENSE_PREFILL_BYTES)
    monkeypatch.setattr(attention, "gpu_backend", lambda: "metal")
    monkeypatch.delenv("MLX_LM_TURBO_KERNEL", raising=False)
    assert "not verified on Apple GPUs" in dense_prefill_support(queries, view, None)
    monkeypatch.setenv("MLX_LM_TURBO_KERNEL", "on")
    assert dense_prefill_support(queries, view, None) is None
    monkeypatch.setattr(attention, "gpu_backend", lambda: None)
    assert "GPUs only" in dense_prefill_support(queries, view, None)


def test_dense_prefill_reads_the_same_whatever_the_chunking(monkeypatch):
    # Chunks of a float16 prompt through the dense path (single tokens through the
    # decode path), then decode steps: every query's output within float16 rounding of
    # the one-chunk run's, the rule being the same for every chunking.
    monkeypatch.setattr(attention, "DENSE_PREFILL_BYTES", DENSE_PREFILL_BYTES)
    T, steps = 70, 6
    queries, keys, values = inputs(T + steps, T + steps, dtype=mx.float16)

    def run(chunks):
        cache, outs, start = TurboQuantKVCache("turbo4"), [], 0
        for n in chunks + [1] * steps:
            end = start + n
            view, _ = cache.update_and_fetch(
                keys[:, :, start:end], values[:, :, start:end]
            )
            q = queries[:, :, start:end]
            outs.append(
                dense_prefill_attention(q, view, D**-0.5, "causal")
                if n > 1
                else turbo_scaled_dot_product_attention(q, view, D**-0.5, None)
            )
            start = end
        return mx.concatenate(outs, axis=2)

    want = run([T])
    for chunks in ([8, 62], [16, 16, 16, 16, 6], [3, 1, 30, 1, 35]):
        assert relative_error(run(chunks), want) < DENSE_LIMITS[mx.float16], chunks
