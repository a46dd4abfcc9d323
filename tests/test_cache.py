import copy

import mlx.core as mx
import numpy as np
import pytest
from helpers import outlier_keys
from mlx_lm.models.cache import (
    KVCache,
    RotatingKVCache,
    load_prompt_cache,
    save_prompt_cache,
)

from mlx_lm_turbo import TurboKV, TurboQuantKVCache, TurboQuantRotatingKVCache
from mlx_lm_turbo.attach.files import register_cache_classes
from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention


def kv(T, H=2, D=128, seed=0, dtype=mx.float16):
    keys = outlier_keys((1, H, T, D), seed=seed).astype(dtype)
    values = mx.random.normal((1, H, T, D), key=mx.random.key(seed + 100)).astype(dtype)
    return keys, values


def dense(view):
    """A TurboKV's keys and values as whole arrays: every token dequantized, the exact
    ones (sink tokens, then the exact tail) written over their rows."""
    keys, values = view.codec.decode(view.stored)
    if view.sinks is not None:
        sink_keys, sink_values, positions = view.sinks
        if view.codec.scheme.key_bits:
            keys = mx.put_along_axis(keys, positions, sink_keys, axis=2)
        values = mx.put_along_axis(values, positions, sink_values, axis=2)
    if view.new_keys is not None:
        n = view.new_keys.shape[2]
        keys[..., -n:, :] = view.new_keys
        values[..., -n:, :] = view.new_values
    return keys, values


def fill(cache, keys, values, chunk=512):
    for start in range(0, keys.shape[2], chunk):
        cache.update_and_fetch(
            keys[:, :, start : start + chunk], values[:, :, start : start + chunk]
        )
    mx.eval([a for a in cache.state if isinstance(a, mx.array)])
    return cache


# The 16 exact sink tokens, held as given and in the attention domain, add 0.8% of fp16
# at 4096 tokens.
@pytest.mark.parametrize(
    "scheme, limit", [("turbo4", 0.267), ("turbo3", 0.205), ("turbo2", 0.142)]
)
def test_nbytes_of_4096_tokens_against_fp16(scheme, limit):
    keys, values = kv(4096)
    fp16 = fill(KVCache(), keys, values)
    turbo = fill(TurboQuantKVCache(scheme), keys, values)
    assert turbo.offset == fp16.offset == 4096
    assert turbo.nbytes <= limit * fp16.nbytes
    # bits per value from the stored arrays alone: 4.125 / 3.125 / 2.125 at d=128
    stored = sum(a.nbytes for a in turbo.stored)
    bits = {"turbo4": 4.125, "turbo3": 3.125, "turbo2": 2.125}[scheme]
    assert stored * 8 / (2 * 2 * 4096 * 128) == pytest.approx(bits)


def test_persistent_cache_holds_only_compressed_data():
    keys, values = kv(1000)
    cache = TurboQuantKVCache("turbo4")
    for start in range(0, 1000, 256):
        view, same = cache.update_and_fetch(
            keys[:, :, start : start + 256], values[:, :, start : start + 256]
        )
        assert view is same and isinstance(view, TurboKV)
        # only the current chunk is held exactly, by the returned view, and the sink tokens
        assert view.new_keys.shape[2] == min(256, 1000 - start)
        assert [a.shape for a in cache.sinks] == [(1, 2, cache.sink_tokens, 128)] * 2
        # one row per token and head: 16 words of key codes, 16 of value codes, norms
        assert [(a.dtype, a.shape[3]) for a in cache.stored] == [(mx.uint32, 33)]
        assert cache.uncompressed is None
        assert view.shape == (1, 2, start + view.new_keys.shape[2], 128)


@pytest.mark.parametrize("scheme", ["turbo4", "turbo3", "turbo0v4", "turbo4v2"])
@pytest.mark.parametrize("cls", [TurboQuantKVCache, TurboQuantRotatingKVCache])
def test_state_round_trip_is_bit_exact_through_a_file(tmp_path, scheme, cls):
    register_cache_classes()
    keys, values = kv(700)
    args = (scheme, 256, 4) if cls is TurboQuantRotatingKVCache else (scheme,)
    cache = cls(*args, seed=3, layer=5)
    fill(cache, keys, values[..., :128], chunk=300)
    path = str(tmp_path / "cache.safetensors")
    save_prompt_cache(path, [cache])
    (loaded,) = load_prompt_cache(path)
    assert type(loaded) is cls
    assert loaded.offset == cache.offset and loaded.scheme == cache.scheme
    assert loaded.codec.meta() == cache.codec.meta()
    for a, b in zip(cache._stored_slice(), loaded._stored_slice()):
        assert a.dtype == b.dtype and mx.array_equal(a, b).item()
    for a, b in zip(cache.sinks or (), loaded.sinks or ()):
        assert mx.array_equal(a, b).item()
    # sliding windows keep their sink tokens too (here held for good in the kept slots)
    assert loaded._sink_count() == cache._sink_count() == cache.sink_tokens
    if cache.scheme.key_bits:
        assert mx.array_equal(loaded.codec.key_mean, cache.codec.key_mean).item()
    else:
        assert loaded.codec.key_mean is None and cache.codec.key_mean is None
    # and it continues identically
    k, v = kv(1, seed=9)
    a, _ = cache.update_and_fetch(k, v[..., :128])
    b, _ = loaded.update_and_fetch(k, v[..., :128])
    for x, y in zip(dense(a), dense(b)):
        assert mx.array_equal(x, y).item()


def test_from_state_restores_scheme_seed_and_scales():
    keys, values = kv(64)
    cache = fill(
        TurboQuantKVCache("turbo4", seed=11, layer=2, key_calibration="center+scale"),
        keys,
        values,
    )
    clone = TurboQuantKVCache.from_state(cache.state)
    assert clone.codec.seed == 11 and clone.codec.layer == 2
    assert clone.codec.key_calibration == cache.codec.key_calibration == "center+scale"
    assert mx.array_equal(clone.codec.key_mean, cache.codec.key_mean).item()
    assert mx.array_equal(clone.codec.key_scale, cache.codec.key_scale).item()


def test_empty_cache_state_round_trip():
    cache = TurboQuantKVCache("turbo3")
    clone = TurboQuantKVCache.from_state(cache.state)
    assert clone.empty() and clone.offset == 0 and clone.nbytes == 0


def test_deepcopy_is_independent():
    keys, values = kv(300)
    cache = fill(TurboQuantKVCache("turbo4"), keys, values)
    clone = copy.deepcopy(cache)
    before = [mx.array(a) for a in cache._stored_slice()]
    k, v = kv(40, seed=4)
    clone.update_and_fetch(k, v)
    clone.trim(100)
    assert cache.offset == 300 and clone.offset == 240
    for a, b in zip(before, cache._stored_slice()):
        assert mx.array_equal(a, b).item()


def test_trim_then_continue_matches_a_shorter_cache():
    keys, values = kv(210)
    cache = fill(
        TurboQuantKVCache("turbo4"), keys[:, :, :200], values[:, :, :200], chunk=64
    )
    assert cache.is_trimmable() and cache.trim(50) == 50 and cache.offset == 150
    shorter = fill(
        TurboQuantKVCache("turbo4"), keys[:, :, :150], values[:, :, :150], chunk=64
    )
    continued, _ = cache.update_and_fetch(keys[:, :, 150:], values[:, :, 150:])
    expected, _ = shorter.update_and_fetch(keys[:, :, 150:], values[:, :, 150:])
    assert cache.offset == shorter.offset == 210
    for got, want in zip(dense(continued), dense(expected)):
        assert got.shape[2] == 210 and mx.array_equal(got, want).item()
    assert cache.trim(1000) == 210 and cache.offset == 0 and cache.size() == 0


def test_first_tokens_are_kept_exact_and_the_rest_dequantized():
    keys, values = kv(50)
    cache = TurboQuantKVCache("turbo4")
    cache.update_and_fetch(keys[:, :, :48], values[:, :, :48])
    view, _ = cache.update_and_fetch(keys[:, :, 48:], values[:, :, 48:])
    _, exact_keys, exact_values = cache.codec.encode(keys, values)
    n = cache.sink_tokens
    for got, exact, dequantized in zip(
        dense(view),
        (exact_keys, exact_values),
        cache.codec.decode(cache._stored_slice()),
    ):
        assert mx.array_equal(got[:, :, :n], exact[:, :, :n]).item()  # the sink tokens
        assert not mx.array_equal(dequantized[:, :, :n], exact[:, :, :n]).item()
        assert mx.array_equal(
            got[:, :, n:48], dequantized[:, :, n:48]
        ).item()  # compressed history
        assert mx.array_equal(got[:, :, 48:], exact[:, :, 48:]).item()  # the chunk


def test_trim_into_the_sink_tokens_keeps_only_what_is_left_then_refills():
    # A prompt cache trimmed to a shared prefix shorter than the sink tokens, then
    # continued with another prompt, must hold what a cold cache of that prompt holds.
    keys, values = kv(40)
    other_keys, other_values = kv(40, seed=7)
    cache = fill(TurboQuantKVCache("turbo4"), keys, values)
    assert cache.codec.key_mean is not None  # measured on the 16 sink tokens
    cache.trim(38)
    assert (
        cache.offset == 2
        and cache.sinks[0].shape[2] == 2
        and cache.codec.key_mean is None
    )
    prompt_keys = mx.concatenate([keys[:, :, :2], other_keys[:, :, 2:]], axis=2)
    prompt_values = mx.concatenate([values[:, :, :2], other_values[:, :, 2:]], axis=2)
    cache.update_and_fetch(prompt_keys[:, :, 2:], prompt_values[:, :, 2:])
    cold = fill(TurboQuantKVCache("turbo4"), prompt_keys, prompt_values)
    assert mx.array_equal(cache.codec.key_mean, cold.codec.key_mean).item()
    for a, b in zip(cache.sinks, cold.sinks):
        assert mx.array_equal(a, b).item()
    n = cache.sink_tokens  # the sink tokens' compressed copies are never read
    for a, b in zip(cache._stored_slice(), cold._stored_slice()):
        assert mx.array_equal(a[:, :, n:], b[:, :, n:]).item()
    cache.trim(100)
    assert cache.offset == 0 and cache.sinks is None


@pytest.mark.parametrize("scheme", ["turbo4", "turbo0v4"])
def test_memory_held_after_prefill_is_what_nbytes_counts(scheme):
    # Nothing else may stay alive: e.g. a view kept of a chunk pins its whole buffer.
    keys, values = kv(1024)
    fill(
        TurboQuantKVCache(scheme), keys, values, chunk=256
    )  # codebooks, compiled kernels
    # A GPU stream frees a buffer once the work reading it has run: wait for it.
    mx.synchronize()
    mx.clear_cache()
    before = mx.get_active_memory()
    cache = fill(TurboQuantKVCache(scheme), keys, values, chunk=256)
    mx.synchronize()
    mx.clear_cache()
    held = mx.get_active_memory() - before
    # A pinned chunk would be 256 KiB. The CPU allocator counts each buffer's bytes; a
    # GPU allocator rounds each buffer up to its page (16 KiB on MLX-CUDA) or pools small
    # ones, so there each array held may count up to a page more.
    arrays = [a for a in cache.state if isinstance(a, mx.array)]
    slack = 32 * 1024 + (
        0 if mx.default_device().type == mx.cpu else 16 * 1024 * len(arrays)
    )
    assert -32 * 1024 < held - cache.nbytes < slack, (held, cache.nbytes)


def test_sink_tokens_cut_the_error_where_attention_sinks_into_the_first_token():
    # Real models park most attention on their first token; its quantization error
    # then reaches every query, unless it is kept exact.
    from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention

    keys, values = kv(200, dtype=mx.float32)
    direction = mx.random.normal((1, 2, 1, 128), key=mx.random.key(5))
    queries = direction + 0.3 * mx.random.normal((1, 2, 8, 128), key=mx.random.key(6))
    keys[:, :, :1] = direction  # the sink: nearly all of every query's attention
    exact = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=128**-0.5)
    errors = {}
    for sink_tokens in (0, 4):
        cache = TurboQuantKVCache("turbo3")
        cache.sink_tokens = sink_tokens
        cache.update_and_fetch(keys[:, :, :192], values[:, :, :192])
        view, _ = cache.update_and_fetch(keys[:, :, 192:], values[:, :, 192:])
        out = turbo_scaled_dot_product_attention(queries, view, 128**-0.5, None)
        errors[sink_tokens] = (
            mx.linalg.norm(out - exact) / mx.linalg.norm(exact)
        ).item()
    assert errors[4] < 0.25 * errors[0], errors


def test_no_affine_routing_attributes():
    for cache in (TurboQuantKVCache("turbo4"), TurboQuantRotatingKVCache("turbo4", 64)):
        assert not hasattr(cache, "bits") and not hasattr(cache, "to_quantized")


def test_uncompressed_start_keeps_first_tokens_in_fp16():
    keys, values = kv(300)
    cache = TurboQuantKVCache("turbo4", uncompressed_start=256)
    out = cache.update_and_fetch(keys[:, :, :200], values[:, :, :200])
    assert isinstance(out[0], mx.array) and cache.codec is None and cache.offset == 200
    out, _ = cache.update_and_fetch(keys[:, :, 200:], values[:, :, 200:])
    assert (
        isinstance(out, TurboKV) and cache.uncompressed is None and cache.offset == 300
    )
    # The fp16 history was compressed at the switch: everything is stored, the chunk also exactly.
    assert out.stored[0].shape[2] == 300 and out.new_keys.shape[2] == 100


@pytest.mark.parametrize(
    "max_size, keep, chunks",
    [
        (64, 0, [100, 1, 1, 1, 30, 1, 1]),
        (64, 4, [10, 1, 1, 70, 1, 1, 1, 1, 5]),
        (32, 4, [1] * 40 + [20, 1]),
    ],
)
def test_rotating_positions_match_rotating_kv_cache(max_size, keep, chunks):
    total = sum(chunks)
    keys, values = kv(total, D=64)
    ref = RotatingKVCache(max_size, keep)
    turbo = TurboQuantRotatingKVCache("turbo8", max_size, keep)
    start = 0
    for n in chunks:
        k, v = keys[:, :, start : start + n], values[:, :, start : start + n]
        start += n
        mask_ref = ref.make_mask(n, window_size=max_size // 2)
        mask_turbo = turbo.make_mask(n, window_size=max_size // 2)
        _, ref_v = ref.update_and_fetch(k, v)
        view, _ = turbo.update_and_fetch(k, v)
        assert (turbo.offset, turbo._idx, turbo.size()) == (
            ref.offset,
            ref._idx,
            ref.size(),
        )
        assert view.shape[2] == ref_v.shape[2]
        got = view.codec.value_rotation.inverse(dense(view)[1])
        err = mx.linalg.norm(
            (got - ref_v).astype(mx.float32), axis=-1
        ) / mx.linalg.norm(ref_v.astype(mx.float32), axis=-1)
        assert err.max().item() < 0.03  # same token in every slot
        if mask_ref is None or isinstance(mask_ref, str):
            assert mask_turbo == mask_ref
        else:
            assert mx.array_equal(mask_ref, mask_turbo).item()


def test_rotating_trim_and_trimmable():
    keys, values = kv(40, D=64)
    cache = fill(TurboQuantRotatingKVCache("turbo4", 64), keys, values, chunk=40)
    assert (
        cache.is_trimmable()
        and cache.trim(10) == 10
        and cache.offset == 30
        and cache._idx == 30
    )
    fill(cache, *kv(60, D=64, seed=2), chunk=60)
    assert not cache.is_trimmable()


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="no codebook for head_dim=72"):
        TurboQuantKVCache("turbo4").update_and_fetch(*kv(4, D=72))
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        k, v = kv(4)
        TurboQuantKVCache("turbo4").update_and_fetch(
            k.astype(mx.int32), v.astype(mx.int32)
        )
    with pytest.raises(ValueError, match="batch, kv_heads, tokens, head_dim"):
        k, v = kv(4)
        TurboQuantKVCache("turbo4").update_and_fetch(k, v[:, :1])
    with pytest.raises(ValueError, match="do not match"):
        cache = TurboQuantKVCache("turbo4")
        cache.update_and_fetch(*kv(4))
        cache.update_and_fetch(*kv(4, D=64))
    with pytest.raises(ValueError, match="Did you mean turbo5v3"):
        TurboQuantKVCache("turbo5")
    with pytest.raises(ValueError, match="not 'none'"):
        TurboQuantKVCache("none")


def test_a_window_ends_its_uncompressed_start_before_its_first_token_leaves():
    # Asked to stay uncompressed for 30 tokens, a 16-token window compresses with the
    # chunk that would let token 0 go: the statistics are measured on the sequence's
    # first 30 tokens (kept exact), as when the whole prompt comes in one chunk.
    keys, values = kv(40)
    late = TurboQuantRotatingKVCache("turbo4", 16, uncompressed_start=30)
    for start in range(0, 40, 4):
        k, v = keys[:, :, start : start + 4], values[:, :, start : start + 4]
        late.update_and_fetch(k, v)
        assert (late.uncompressed is None) == (start + 4 > 16), start
    early = TurboQuantRotatingKVCache("turbo4", 16, uncompressed_start=30)
    early.update_and_fetch(keys, values)
    assert late.offset == early.offset == 40
    assert mx.array_equal(late.codec.key_mean, early.codec.key_mean).item()
    # the 40th query's window still holds exact tokens 25-29; once past the window and
    # trimming (max_size + 30 tokens on), they are let go, in both
    assert late.sinks[0].shape[2] == early.sinks[0].shape[2] == 30
    more = kv(46)
    for t in range(40, 46):
        for cache in (late, early):
            cache.update_and_fetch(more[0][:, :, t : t + 1], more[1][:, :, t : t + 1])
    assert late.sinks is None and early.sinks is None


def test_decode_steps_grow_no_process_wide_cache():
    # Memory must stay bounded while decoding: no lru_cache of the package may gain an
    # entry per step (one keyed by MLX devices, which hash by identity, once did).
    import functools
    import sys

    from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention

    def cache_sizes():
        return {
            f"{name}.{attr}": value.cache_info().currsize
            for name, module in list(sys.modules.items())
            if name.startswith("mlx_lm_turbo")
            for attr, value in vars(module).items()
            if isinstance(value, functools._lru_cache_wrapper)
        }

    cache = TurboQuantKVCache("turbo4")
    keys = outlier_keys((1, 2, 64, 64)).astype(mx.float16)
    cache.update_and_fetch(keys, keys)
    sizes = {}
    for step in range(20):
        k = mx.random.normal((1, 2, 1, 64), key=mx.random.key(step)).astype(mx.float16)
        view, _ = cache.update_and_fetch(k, k)
        q = mx.random.normal((1, 4, 1, 64), key=mx.random.key(step)).astype(mx.float16)
        mx.eval(turbo_scaled_dot_product_attention(q, view, 0.125, None))
        if step in (4, 19):
            sizes[step] = cache_sizes()
    assert sizes[4] and sizes[19] == sizes[4]


def query_aware_scale_reference(sink_keys, sink_queries):
    """center+query's key scale, written out in NumPy (float64): s = (E[k^2] of the
    centred keys / E[q^2] over the KV head's query heads) ** (1/4), each averaged over
    the RoPE pair (c, c + D/2), unit mean square."""
    k = np.array(sink_keys.astype(mx.float32), dtype=np.float64)[0]  # (H, T, D)
    q = np.array(sink_queries.astype(mx.float32), dtype=np.float64)[0]  # (Hq, T, D)
    H, T, D = k.shape
    key_energy = ((k - k.mean(axis=1, keepdims=True)) ** 2).mean(axis=1)
    query_energy = (q.reshape(H, -1, T, D) ** 2).mean(axis=(1, 2))

    def paired(e):
        e = (e[:, : D // 2] + e[:, D // 2 :]) / 2
        return np.concatenate([e, e], axis=1)

    s = (paired(key_energy) / paired(query_energy)) ** 0.25
    return s / np.sqrt((s**2).mean(axis=1, keepdims=True))


def attend_chunks(cache, keys, values, queries, chunks):
    """Feed the tokens in these chunks as a model does: each update, then attention."""
    start = 0
    for n in chunks:
        view, _ = cache.update_and_fetch(
            keys[:, :, start : start + n], values[:, :, start : start + n]
        )
        mask = "causal" if n > 1 else None
        turbo_scaled_dot_product_attention(
            queries[:, :, start : start + n], view, keys.shape[-1] ** -0.5, mask
        )
        start += n


@pytest.mark.parametrize("chunks", [[40], [5, 35], [1] * 20])
def test_keys_are_scaled_by_the_sink_tokens_keys_and_queries(chunks):
    # center+query (the default): the sink tokens' queries reach the cache through
    # attention, and the update that completes them is made again with them.
    keys, values = kv(sum(chunks), H=2, D=64)
    queries = mx.random.normal((1, 8, keys.shape[2], 64), key=mx.random.key(7))
    queries = (queries * mx.linspace(0.2, 3.0, 64)).astype(mx.float16)  # uneven
    cache = TurboQuantKVCache("turbo4")
    attend_chunks(cache, keys, values, queries, chunks)
    assert cache.codec.key_calibration == "center+query"
    assert not cache.sink_queries_missing
    S = cache.sink_tokens
    want = query_aware_scale_reference(keys[:, :, :S], queries[:, :, :S])
    got = np.array(cache.codec.key_scale[0])
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert np.abs(want - 1).max() > 0.1  # a scale that matters
    # nothing of a first pass is left behind
    assert cache._rerun is None and cache.sink_query_energy.shape == (1, 2, S, 32)


def test_without_attention_the_keys_are_only_centred():
    # An update no attention follows (no queries seen): center+query centres alone,
    # for good, and says so in its state.
    keys, values = kv(40, H=2, D=64)
    cache = TurboQuantKVCache("turbo4")
    cache.update_and_fetch(keys, values)
    assert cache.sink_queries_missing and cache.codec.key_scale is None
    assert cache.codec.key_mean is not None


def test_a_saved_cache_within_its_sink_tokens_continues_like_a_cold_one(tmp_path):
    register_cache_classes()
    keys, values = kv(40, H=2, D=64)
    queries = mx.random.normal((1, 4, 40, 64), key=mx.random.key(3)).astype(mx.float16)
    cold = TurboQuantKVCache("turbo4")
    attend_chunks(cold, keys, values, queries, [40])
    part = TurboQuantKVCache("turbo4")
    attend_chunks(part, keys, values, queries, [10])
    save_prompt_cache(str(tmp_path / "c.safetensors"), [part])
    (loaded,) = load_prompt_cache(str(tmp_path / "c.safetensors"))
    assert loaded.sink_query_energy.shape == (1, 2, 10, 32)
    attend_chunks(loaded, keys[:, :, 10:], values[:, :, 10:], queries[:, :, 10:], [30])
    assert mx.array_equal(loaded.codec.key_scale, cold.codec.key_scale)
    # the rows past the sink tokens (theirs are never read: the sinks are, exactly)
    S = cold.sink_tokens
    assert all(
        mx.array_equal(a[:, :, S:], b[:, :, S:])
        for a, b in zip(loaded._stored_slice(), cold._stored_slice())
    )


def test_a_cache_keeping_no_sink_tokens_never_makes_an_update_twice():
    # No sink tokens, nothing to calibrate on: no update waits for its queries.
    keys, values = kv(40, H=2, D=64)
    cache = TurboQuantKVCache("turbo4")
    cache.sink_tokens = 0
    for t in range(0, 40, 8):
        view, _ = cache.update_and_fetch(keys[:, :, t : t + 8], values[:, :, t : t + 8])
        assert view.calibrating is None
    assert cache.codec.key_mean is None and cache.codec.key_scale is None
