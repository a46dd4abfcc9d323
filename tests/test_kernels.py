"""The fused decode-attention kernel against the portable path it replaces.

The kernel cases (fixture ``cuda_kernels``) run on MLX-CUDA's GPU where there is one,
else on the CPU: the same sources built by g++ (tests/gpu_on_cpu.py), as CI runs them.
There a few matrices run a Latin subset (``latin_cases``) and two cases that need the
GPU itself skip (marked ``gpu``); the H200 runs them all. Both paths accumulate in fp32
but round differently (the portable path rounds the rotated query, the codebook
levels and the dequantized K/V to the model dtype), so they agree to 2e-3 relative,
not bit for bit. In bfloat16 (8 significant bits) the portable path's own rounding
moves its output by 1-2% (measured on the H200), so there both are compared with the
portable path run in float32 on the same caches: the kernel must be within 4e-3 of it
(its bfloat16 output alone rounds by ~1e-3) and no further from it than the portable path."""

import copy
import itertools
import shutil
import struct
import tempfile
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import (
    ON_CUDA,
    TOLERANCE,
    WIDTHS,
    assert_as_portable,
    filled_cache,
    forget_kernels,
    latin_cases,
    outlier_keys,
    relative_error,
    scripts_compile_kernels,
    step_inputs,
)

from mlx_lm_turbo import TurboQuantKVCache, TurboQuantRotatingKVCache
from mlx_lm_turbo.cache.attention import (
    dense_prefill_attention,
    dense_prefill_support,
    turbo_scaled_dot_product_attention,
)
from mlx_lm_turbo.cache.view import recent_part
from mlx_lm_turbo.kernels import (
    KERNEL_ENV,
    KernelUnavailableError,
    fused_decode_and_encode,
    fused_decode_attention,
    fused_encode,
    kernel_mode,
    layer_support,
)
from mlx_lm_turbo.kernels.decode_attention import recent_tail, tail_row, tail_rows


def both_paths(monkeypatch, q, view, mask, sinks=None, scale=None):
    scale = scale or q.shape[-1] ** -0.5
    monkeypatch.setenv(KERNEL_ENV, "off")
    portable = turbo_scaled_dot_product_attention(q, view, scale, mask, sinks)
    monkeypatch.setenv(KERNEL_ENV, "on")
    fused = fused_decode_attention(q, view, scale, mask, sinks)
    assert fused is not None, "the kernel declined a case it covers"
    mx.eval(portable, fused)
    assert fused.shape == portable.shape and fused.dtype == portable.dtype
    return fused, portable


def check(monkeypatch, q, view, mask, sinks=None):
    """The fused kernel against the portable path."""
    fused, portable = both_paths(monkeypatch, q, view, mask, sinks)
    assert_as_portable(monkeypatch, fused, portable, q, view, mask, sinks)


# -- everywhere ----------------------------------------------------------------
def test_kernel_mode_reads_the_environment(monkeypatch):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    assert kernel_mode() == "auto"
    monkeypatch.setenv(KERNEL_ENV, " OFF ")
    assert kernel_mode() == "off"
    monkeypatch.setenv(KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match=f"{KERNEL_ENV}='fast'.*auto, on, off"):
        kernel_mode()


@pytest.mark.parametrize(
    "name", ["decode_attention.cu", "encode.cu", "decode_attention_simd.body"]
)
def test_an_included_source_names_what_its_text_reads(name):
    # MLX-CUDA passes an input's shape and strides only where the kernel's source
    # names them: the #include line's comment must name what the file reads.
    import mlx_lm_turbo.kernels.build as build
    import mlx_lm_turbo.kernels.decode_attention as decode_attention
    import mlx_lm_turbo.kernels.decode_attention_simd as simd
    import mlx_lm_turbo.kernels.encode as encode

    text, line = build.source(name), build.included(name)
    assert line.startswith(f'#include "{build._SOURCES / name}"')
    assert len(line) < len(text) / 10  # what MLX hashes at every call
    inputs = {*decode_attention.INPUTS, *encode.INPUTS, *simd.MERGE_INPUTS}
    for input_name in inputs:
        for suffix in ("_shape", "_strides", "_ndim"):
            key = input_name + suffix
            assert (key in line) == (key in text), (name, key)


def test_a_source_under_a_path_no_include_can_name_comes_as_its_text(
    monkeypatch, tmp_path
):
    import mlx_lm_turbo.kernels.build as build

    folder = tmp_path / 'a "quoted" folder'
    folder.mkdir()
    (folder / "encode.cu").write_text((build._SOURCES / "encode.cu").read_text())
    expected = build.source("encode.cu") + "\n"
    build.source.cache_clear()
    monkeypatch.setattr(build, "_SOURCES", folder)
    assert build.included("encode.cu") == expected
    build.source.cache_clear()


def test_a_changed_kernel_source_is_compiled_under_a_new_name(monkeypatch):
    # MLX-CUDA finds compiled kernels on disk by name and template values: a source
    # changed by an upgrade must not reach an earlier binary. Runs anywhere (the
    # kernels are built by a stand-in recording their names).
    import mlx_lm_turbo.kernels.build as build
    import mlx_lm_turbo.kernels.decode_attention as decode_attention
    import mlx_lm_turbo.kernels.encode as encode

    names = []
    monkeypatch.setattr(
        mx.fast, "cuda_kernel", lambda name, **options: names.append(name)
    )

    def build_all():
        for cached in (decode_attention._kernel, encode._kernel, build.source):
            cached.cache_clear()
        inputs = decode_attention.call_inputs(4, 0)
        constants = decode_attention.template(
            "float16", "bool", 128, 4, 1, 4, 4, 4, 4, 0, 0
        )
        decode_attention._kernel(4, False, False, inputs, constants)
        decode_attention._kernel(4, True, False, inputs, constants)
        encode._kernel(encode.template("float16", 128, 4, 4, True, False))
        built = names[-3:]
        assert len(set(built)) == 3
        return built

    first, again = build_all(), build_all()
    assert first == again  # the same source finds its compiled kernel again
    read = build.Path.read_text
    # which of (decode, decode with a raw tail, encode) each file's edit renames
    renamed = {
        "common.cuh": [True, True, True],
        "decode_attention.cu": [True, True, False],
        "encode.cu": [False, False, True],
    }
    for edited, expected in renamed.items():
        monkeypatch.setattr(
            build.Path,
            "read_text",
            lambda path, *a, e=edited: (
                read(path, *a) + ("\nint changed;" if path.name == e else "")
            ),
        )
        assert [a != b for a, b in zip(first, build_all())] == expected, edited
    monkeypatch.undo()
    for cached in (decode_attention._kernel, encode._kernel, build.source):
        cached.cache_clear()


def test_where_the_kernels_run_is_worked_out_once_per_setting():
    # Keyed by values: MLX devices hash by identity (each default_device() is a new
    # one), so a cache keyed by the device itself grew by an entry a layer and a step.
    from mlx_lm_turbo.kernels import dispatch

    dispatch._layer_support.cache_clear()
    for _ in range(3):
        layer_support(64, 64)
    info = dispatch._layer_support.cache_info()
    assert (info.currsize, info.hits) == (1, 2)


@pytest.mark.skipif(
    mx.default_device() == mx.gpu,
    reason="checks the refusal where no kernel runs (CPU)",
)
def test_on_where_the_kernel_cannot_run_is_a_clear_error(monkeypatch):
    cache = filled_cache(TurboQuantKVCache("turbo4"), 64, 2, 64, mx.float16)
    q, view, mask = step_inputs(cache, 1, 2, 2, 64, mx.float16)
    assert layer_support(view.codec.key_dim, view.codec.value_dim) is not None
    monkeypatch.setenv(KERNEL_ENV, "on")
    with pytest.raises(KernelUnavailableError, match=f"{KERNEL_ENV}=on.*cannot run"):
        turbo_scaled_dot_product_attention(q, view, 0.125, mask)
    monkeypatch.setenv(
        KERNEL_ENV, "auto"
    )  # auto: the portable path, same answer as off
    auto = turbo_scaled_dot_product_attention(q, view, 0.125, mask)
    monkeypatch.setenv(KERNEL_ENV, "off")
    assert mx.array_equal(
        auto, turbo_scaled_dot_product_attention(q, view, 0.125, mask)
    ).item()


# -- on the GPU ------------------------------------------------------------------


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("scheme", WIDTHS)
def test_every_width_matches_the_portable_path(monkeypatch, scheme):
    cache = filled_cache(TurboQuantKVCache(scheme), 1000, 8, 128, mx.float16)
    q, view, mask = step_inputs(cache, 1, 8, 4, 128, mx.float16)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("scheme", ["turbo2", "turbo4v2"])
def test_two_bit_values_at_head_dim_64(monkeypatch, scheme):
    # SmolLM2's shape: a lane group's 16 bits of 2-bit values start at bit 0 or 16 of a
    # word, so the value loop reads one word a group (decode_attention.cu's
    # VALUE_READ_WORDS), where other widths read the word after too
    cache = filled_cache(TurboQuantKVCache(scheme), 1000, 3, 64, mx.float16)
    q, view, mask = step_inputs(cache, 1, 3, 3, 64, mx.float16)
    check(monkeypatch, q, view, mask)


def fused_under_settings(monkeypatch, scheme, settings):
    """The fused kernel's output on one cache of ``scheme`` under each of ``settings``
    (a decode_attention constant and its value), each within TOLERANCE of the portable
    path. Two slices, so each warp stages several tiles."""
    from mlx_lm_turbo.kernels import decode_attention

    cache = filled_cache(TurboQuantKVCache(scheme), 1000, 2, 128, mx.float16)
    q, view, mask = step_inputs(cache, 1, 2, 4, 128, mx.float16)
    monkeypatch.setattr(decode_attention, "MAX_SLICES", 2)
    outputs = []
    try:
        for name, value in settings:
            monkeypatch.setattr(decode_attention, name, value)
            forget_kernels()
            fused, portable = both_paths(monkeypatch, q, view, mask)
            assert relative_error(fused, portable) < TOLERANCE
            outputs.append(fused)
    finally:  # no later test gets these variants
        forget_kernels()
    return outputs


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("scheme", ["turbo4", "turbo3"])
def test_one_or_two_staging_buffers_compute_alike(monkeypatch, scheme):
    # The sweeps force a warp's staging buffers (decode_kernel_sweep.py, kernel_times.py
    # --stage-buffers): one buffer copies the next tile after reading this one, two
    # while reading it (turbo4's two in dynamic shared memory, its one in static).
    settings = [("STAGE_BUFFERS", 1), ("STAGE_BUFFERS", 2)]
    assert mx.array_equal(*fused_under_settings(monkeypatch, scheme, settings)).item()


@pytest.mark.parametrize("widths", [{(4, 4)}, {(4, 4), (4, 2)}, {(4, 4), (3, 3)}])
def test_dynamic_shared_memory_is_what_mlx_cuda_raises_the_limit_for(
    monkeypatch, widths
):
    # MLX-CUDA raises a kernel's limit of 48 KiB of shared memory a block only where it
    # asks for more than 48,000 bytes of dynamic memory: a variant asking for less with
    # the static arrays beside it would not launch. (The kernel checks at compile time
    # that the bytes hold its layout.)
    from mlx_lm_turbo.kernels import decode_attention

    monkeypatch.setattr(decode_attention, "DYNAMIC_WIDTHS", widths)
    chosen = set()
    for dtype, D, (kb, vb), R in itertools.product(
        ("float16", "bfloat16", "float32"),
        (64, 128, 256),
        ((4, 4), (3, 3), (2, 2), (8, 8), (4, 2), (0, 4), (5, 3)),
        (1, 2, 4, 8),
    ):
        values = decode_attention.template(dtype, "bool", D, R, 1, R, kb, vb, 4, 0, 0)
        dynamic = decode_attention.dynamic_shared(4, values)
        assert dynamic == 0 or 48000 < dynamic <= 227 * 1024
        if dynamic:
            chosen.add((dtype, D, kb, vb, R))
    assert chosen == {
        (dtype, 128, kb, vb, R)
        for dtype in ("float16", "bfloat16")
        for kb, vb in widths
        if kb == 4  # the layout holds 4-bit keys' pair table
        for R in (1, 2, 4)
    }


@pytest.mark.usefixtures("cuda_kernels")
def test_turbo4v2_in_dynamic_shared_memory_computes_alike(monkeypatch):
    # DYNAMIC_WIDTHS holds the widths measured no slower with the dynamic layout; turbo4v2
    # (a smaller layout, padded to what MLX-CUDA raises the limit for) must compute
    # exactly as with the static one when it joins them.
    settings = [("DYNAMIC_WIDTHS", {(4, 4)}), ("DYNAMIC_WIDTHS", {(4, 4), (4, 2)})]
    outputs = fused_under_settings(monkeypatch, "turbo4v2", settings)
    assert mx.array_equal(*outputs).item()


@pytest.mark.usefixtures("cuda_kernels")
def test_calls_in_a_row_on_one_layer_agree(monkeypatch):
    # The workspace's group counters must be left zeroed by each call: a call
    # that left one counting would make the next call's merge read unwritten slices.
    cache = filled_cache(TurboQuantKVCache("turbo4"), 1000, 8, 128, mx.float16)
    q, view, mask = step_inputs(cache, 1, 8, 4, 128, mx.float16)
    fused, portable = both_paths(monkeypatch, q, view, mask)
    again = [
        fused_decode_attention(q, view, q.shape[-1] ** -0.5, mask) for _ in range(3)
    ]
    mx.eval(again)
    for out in again:
        assert mx.array_equal(out, fused).item()
    assert relative_error(fused, portable) < TOLERANCE


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "scheme, dtype, D",
    # turbo5v3: 5-bit keys, the widest on the tensor cores (levels by warp shuffles)
    latin_cases(
        ["turbo4", "turbo3", "turbo5v3"],
        [mx.float16, mx.bfloat16, mx.float32],
        [64, 128, 256],
    ),
)
def test_head_dims_and_dtypes(monkeypatch, scheme, dtype, D):
    cache = filled_cache(TurboQuantKVCache(scheme), 777, 2, D, dtype)
    q, view, mask = step_inputs(cache, 1, 2, 4, D, dtype)
    check(monkeypatch, q, view, mask)


@pytest.fixture
def values_max_dim(request, monkeypatch):
    """VALUE_MMA_MAX_DIM set to the test's parameter (at 128 values at head dim 256 are
    summed lane by lane: the sweep's other setting); its kernels are dropped after."""
    from mlx_lm_turbo.kernels import decode_attention

    monkeypatch.setattr(decode_attention, "VALUE_MMA_MAX_DIM", request.param)
    forget_kernels()
    yield
    forget_kernels()


@pytest.mark.usefixtures("cuda_kernels", "values_max_dim")
@pytest.mark.parametrize(
    "scheme, dtype, L, values_max_dim",
    # 4-, 3- and 2-bit values on the tensor cores (lane shuffles, lane pairs of 3-bit
    # codes, a pair table; 8 query rows a block at L 2), then lane by lane
    [
        ("turbo4", mx.float16, 1, 256),
        ("turbo3", mx.bfloat16, 1, 256),
        ("turbo2", mx.float16, 2, 256),
        ("turbo4v2", mx.bfloat16, 2, 256),
        ("turbo4", mx.float16, 2, 128),
    ],
    indirect=["values_max_dim"],
)
def test_values_at_head_dim_256(monkeypatch, scheme, dtype, L):
    cache = filled_cache(TurboQuantKVCache(scheme), 777, 2, 256, dtype)
    q, view, mask = step_inputs(cache, L, 2, 4, 256, dtype)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("G, L", latin_cases([1, 3, 8], [1, 2, 8]))
def test_gqa_ratios_and_verify_steps(monkeypatch, G, L):
    cache = filled_cache(
        TurboQuantKVCache("turbo4"), 3000, 4, 128, mx.float16, chunk=1024
    )
    q, view, mask = step_inputs(cache, L, 4, G, 128, mx.float16)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "scheme, D",
    [("turbo4v2", 128), ("turbo5v3", 128), ("turbo2", 128), ("turbo5v3", 256)],
)
def test_verify_steps_of_other_widths(monkeypatch, scheme, D):
    # 4 x 8 query rows a KV head: the shared-memory fit test picks these shapes' staging
    # buffers and level tables (turbo4v2's once asked for over 48 KiB; turbo5v3 at head
    # dim 256 fits the tensor cores' key path only without the pair table it never reads;
    # fewer tokens there keep the CPU build's run short).
    tokens = 3000 if D == 128 else 1000
    cache = filled_cache(
        TurboQuantKVCache(scheme), tokens, 4, D, mx.float16, chunk=1024
    )
    q, view, mask = step_inputs(cache, 8, 4, 4, D, mx.float16)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("scheme", ["turbo4", "turbo3", "turbo2"])
def test_more_than_eight_query_rows_at_head_dim_64(monkeypatch, scheme):
    # 3 x 8 query rows a KV head (SmolLM2's group, a verify step): 16 rows a block, so
    # the key scores take two tiles of 8 query rows on the tensor cores; 3-bit key
    # pairs are not whole words at head dim 64.
    cache = filled_cache(TurboQuantKVCache(scheme), 2000, 3, 64, mx.float16, chunk=512)
    q, view, mask = step_inputs(cache, 8, 3, 3, 64, mx.float16)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("calibration", ["none", "center", "center+scale"])
def test_key_calibrations_and_attention_sinks(monkeypatch, calibration):
    cache = filled_cache(
        TurboQuantKVCache("turbo4", key_calibration=calibration),
        900,
        4,
        64,
        mx.bfloat16,
    )
    q, view, mask = step_inputs(cache, 1, 4, 2, 64, mx.bfloat16)
    check(monkeypatch, q, view, mask)
    sinks = 3 * mx.random.normal(
        (8,), key=mx.random.key(3)
    )  # GPT-OSS learned sink logits
    check(monkeypatch, q, view, mask, sinks)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("scheme", ["turbo4", "turbo0v4"])
def test_sliding_window_cache(monkeypatch, scheme):
    cache = filled_cache(
        TurboQuantRotatingKVCache(scheme, max_size=512),
        1500,
        2,
        128,
        mx.float16,
        chunk=500,
    )
    for step in range(3):  # the ring wraps
        mask = cache.make_mask(1, window_size=512)
        q, view, _ = step_inputs(cache, 1, 2, 4, 128, mx.float16, seed=10 + step)
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
def test_young_sliding_window_hands_its_first_tokens_over_in_the_ring(monkeypatch):
    # Until a window has moved max_size + 16 tokens on, the first tokens it still
    # holds are read exactly at their ring positions (with the newest token).
    cache = filled_cache(
        TurboQuantRotatingKVCache("turbo4", max_size=64), 70, 2, 128, mx.float16
    )
    for step in range(3):
        mask = cache.make_mask(1, window_size=64)
        q, view, _ = step_inputs(cache, 1, 2, 4, 128, mx.float16, seed=20 + step)
        assert view.new_keys is None and view.sinks[0].shape[2] > 1
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("scheme", ["turbo3", "turbo0v4"])
def test_batch_rows_of_different_lengths(monkeypatch, scheme):
    singles = [
        filled_cache(TurboQuantKVCache(scheme), n, 4, 128, mx.float16, seed=n)
        for n in (700, 90, 1300)
    ]
    batch = TurboQuantKVCache.merge(singles)
    for step in range(2):
        k = mx.random.normal((3, 4, 1, 128), key=mx.random.key(step)).astype(mx.float16)
        q = mx.random.normal((3, 16, 1, 128), key=mx.random.key(step + 5)).astype(
            mx.float16
        )
        mask = batch.make_mask(1, return_array=True)
        view, _ = batch.update_and_fetch(k, k)
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize("L", [1, 2, 8])
def test_recent_tokens_read_exactly_in_the_tail(monkeypatch, L):
    # recent_exact: the exact tail is the 31 tokens before the step and the step,
    # read exactly within a window of 32 (a decode token, left to its launch to encode
    # on MLX-CUDA, encoded first: test_decode_steps_with_a_window_... covers that launch).
    cache = filled_cache(
        TurboQuantKVCache("turbo4", recent_exact=32), 700, 2, 128, mx.float16, chunk=300
    )
    for step in range(2):
        q, view, mask = step_inputs(cache, L, 2, 4, 128, mx.float16, seed=30 + step)
        cache.settle(view)
        assert view.window == 32 and view.new_keys.shape[2] == 31 + L
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
def test_batch_rows_with_recent_tokens_read_exactly(monkeypatch):
    singles = [
        filled_cache(
            TurboQuantKVCache("turbo3", recent_exact=32), n, 4, 128, mx.float16, seed=n
        )
        for n in (700, 20, 300)
    ]
    batch = TurboQuantKVCache.merge(singles)
    for step in range(2):
        k = mx.random.normal((3, 4, 1, 128), key=mx.random.key(step)).astype(mx.float16)
        q = mx.random.normal((3, 16, 1, 128), key=mx.random.key(step + 5)).astype(
            mx.float16
        )
        mask = batch.make_mask(1, return_array=True)
        view, _ = batch.update_and_fetch(k, k)
        assert view.new_keys.shape[2] == 32
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("cuda_kernels")
def test_sliding_window_hands_its_recent_tokens_over_in_the_ring(monkeypatch):
    # A window past its first tokens, recent_exact 32: at decode the 31 recent tokens
    # and the newest are exact at their ring positions.
    cache = filled_cache(
        TurboQuantRotatingKVCache("turbo4", max_size=64, recent_exact=32),
        200,
        2,
        128,
        mx.float16,
    )
    for step in range(3):  # the ring wraps
        mask = cache.make_mask(1, window_size=64)
        q, view, _ = step_inputs(cache, 1, 2, 4, 128, mx.float16, seed=40 + step)
        assert view.new_keys is None and view.sinks[0].shape[2] == 32
        check(monkeypatch, q, view, mask)


@pytest.mark.gpu  # a minute on the CPU's build; 3000 tokens cut 24 slices elsewhere
def test_decode_after_a_long_context_covers_every_slice(monkeypatch):
    cache = filled_cache(
        TurboQuantKVCache("turbo4"), 40000, 8, 128, mx.float16, chunk=8192
    )
    q, view, mask = step_inputs(cache, 1, 8, 4, 128, mx.float16)
    check(monkeypatch, q, view, mask)


@pytest.fixture
def launch_grids(monkeypatch):
    """The grid of each fused launch from here on, in order."""
    from mlx_lm_turbo.kernels import decode_attention

    launch, grids = decode_attention._Plan.launch, []

    def recorded(plan, n_tokens):
        settings = launch(plan, n_tokens)
        grids.append(settings["grid"])
        return settings

    monkeypatch.setattr(decode_attention._Plan, "launch", recorded)
    return grids


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "G, D, n_tokens, n_parts",
    [
        (3, 64, 1530, 49),  # three full chunks and one of a part
        (4, 256, 1530, 49),
        (3, 64, 470, 16),  # one chunk's worth: merged in one step
        (3, 64, 500, 17),  # a full chunk and one of a part
        (4, 256, 990, 32),  # full chunks only
        (3, 64, 16400, 513),  # the most slices: 33 chunks, more than a warp's lanes
    ],
)
def test_one_kv_head_in_many_slices_merges_them_by_chunks(
    monkeypatch, launch_grids, G, D, n_tokens, n_parts
):
    # One KV head (Gemma 3's at head dim 256) is cut into up to MAX_SLICES slices to
    # fill the GPU, and a group of more parts than MERGE_CHUNK merges them by chunks,
    # then the chunks. Slices of 32 tokens here, and the exact part; odd counts of
    # 3-row parts leave the chunks' rows 16-byte aligned only if the kernel aligns them.
    from mlx_lm_turbo.kernels import decode_attention

    monkeypatch.setattr(decode_attention, "MIN_SLICE_TOKENS", 32)
    cache = filled_cache(TurboQuantKVCache("turbo4"), n_tokens, 1, D, mx.float16)
    q, view, mask = step_inputs(cache, 1, 1, G, D, mx.float16)
    check(monkeypatch, q, view, mask)
    parts = [grid[0] // (32 * decode_attention.WARPS) for grid in launch_grids]
    assert parts == [n_parts] and decode_attention.MERGE_CHUNK == 16


@pytest.mark.usefixtures("cuda_kernels")
def test_each_block_records_its_phases_where_asked(monkeypatch, launch_grids):
    # benchmarks/block_phases.py reads these records to find what holds a launch: each
    # block's phases in order, the exact block, one merger a chunk and one a group, and
    # the output as without them. Two groups of 16 slices and the exact part.
    from mlx_lm_turbo.kernels import decode_attention

    monkeypatch.setattr(decode_attention, "MIN_SLICE_TOKENS", 32)
    monkeypatch.setattr(decode_attention, "PHASE_TIMES", True)
    forget_kernels()  # none built without the records
    try:
        cache = filled_cache(TurboQuantKVCache("turbo4"), 500, 2, 64, mx.float16)
        q, view, mask = step_inputs(cache, 1, 2, 3, 64, mx.float16)
        check(monkeypatch, q, view, mask)
        grid = launch_grids[-1]
        n_parts, groups = grid[0] // (32 * decode_attention.WARPS), grid[1]
        words = decode_attention.PHASE_WORDS
        workspace = decode_attention._workspace(mx.float16).array.reshape(-1)
        records = workspace[-n_parts * groups * words :].reshape(groups, n_parts, words)
        records = records.tolist()
    finally:
        forget_kernels()  # nor kept for later tests
    assert (n_parts, groups) == (17, 2)
    for group in records:
        roles = [r[3] for r in group]
        assert [role & 1 for role in roles] == [0] * 16 + [1]  # the exact block last
        assert sum(role >> 1 & 1 for role in roles) == 2  # a merger a chunk
        assert sum(role >> 2 & 1 for role in roles) == 1  # and the group's
        for record, role in zip(group, roles):
            prologue, tokens, part, chunk, end = record[4:9]
            assert 0 <= prologue <= tokens <= part <= end and end > 0
            assert (chunk > 0) == bool(role & 2)
            assert not chunk or part <= chunk <= end


@pytest.mark.usefixtures("cuda_kernels")
def test_auto_picks_the_kernel_for_decode_and_the_portable_path_for_prefill(
    monkeypatch,
):
    cache = filled_cache(TurboQuantKVCache("turbo4"), 300, 2, 128, mx.float16)
    monkeypatch.setenv(KERNEL_ENV, "auto")
    q, view, mask = step_inputs(cache, 1, 2, 4, 128, mx.float16)
    assert view.pending is not None  # encoded in the launch
    assert fused_decode_and_encode(q, view, 0.1, mask) is not None
    q, view, mask = step_inputs(cache, 16, 2, 4, 128, mx.float16)
    assert fused_decode_attention(q, view, 0.1, mask) is None


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "scheme, calibration, D",
    latin_cases(
        [
            ("turbo4", "center"),
            ("turbo3", "center+scale"),
            ("turbo2", "none"),
            ("turbo8v4", "center"),
            ("turbo0v3", None),
            ("turbo5v3", "center+scale"),
            ("turbo6v2", "center"),
        ],
        [64, 128, 256],
    ),
)
def test_encode_matches_the_codec(monkeypatch, scheme, calibration, D):
    from mlx_lm_turbo.codec.codec import TurboCodec, split_rows
    from mlx_lm_turbo.codec.schemes import parse_scheme

    keys = outlier_keys((2, 4, 300, D)).astype(mx.bfloat16)
    values = mx.random.normal((2, 4, 300, D), key=mx.random.key(1)).astype(mx.bfloat16)
    codec = TurboCodec.for_keys(
        parse_scheme(scheme), keys, values, key_calibration=calibration
    )
    codec = codec.with_statistics(*codec.key_statistics(keys))
    monkeypatch.setenv(KERNEL_ENV, "off")
    stored, exact_keys, exact_values = codec.encode(keys, values)
    monkeypatch.setenv(KERNEL_ENV, "on")
    fused, fused_keys, fused_values = fused_encode(codec, keys, values)
    mx.eval(stored, fused)
    errors = (
        relative_error(fused_keys, exact_keys),
        relative_error(fused_values, exact_values),
    )
    assert max(errors) < 1e-3, f"rotated keys, values off by {errors}"
    assert [(a.shape, a.dtype) for a in fused] == [(a.shape, a.dtype) for a in stored]
    *fused_exact, fused_rows = fused
    *stored_exact, stored_rows = stored
    parts = "keys as they are", "key codes", "key norms", "value codes", "value norms"
    for name, mine, theirs in zip(
        parts[1 - len(fused_exact) :],
        (*fused_exact, *split_rows(fused_rows, codec.key_words)),
        (*stored_exact, *split_rows(stored_rows, codec.key_words)),
    ):
        if mine.size == 0:  # no key codes where keys are stored as they are
            continue
        if mine.dtype == mx.uint32:
            # codes: a coordinate within float error of a boundary may flip
            flipped = (mine != theirs).astype(mx.float32).mean().item()
            assert flipped < 0.01, f"{flipped:.2%} of the {name}' words differ"
        else:
            assert mx.allclose(mine, theirs, rtol=2e-3, atol=1e-3).item(), (
                f"{name} differ by up to "
                f"{mx.abs(mine - theirs).astype(mx.float32).max().item():.3g}"
            )
    # What matters downstream: the decoded vectors agree.
    decoded, expected = codec.decode(fused), codec.decode(stored)
    for name, a, b in zip(("keys", "values"), decoded, expected):
        error = relative_error(a, b)
        assert error < 1e-2, f"decoded {name} off by {error:.3g}"


def test_doctor_says_which_attention_path_each_layer_takes(tiny_model, capsys):
    from mlx_lm_turbo.tools.doctor import main as doctor

    doctor(["--model", str(tiny_model("llama"))])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 0 |")]
    expected = "fused kernel" if ON_CUDA else "portable: MLX runs on the CPU"
    assert rows and rows[0].endswith(" |") and expected in rows[0]


@pytest.mark.usefixtures("cuda_kernels")
def test_auto_serves_attention_sinks_and_sliding_windows(monkeypatch):
    # Each was checked against the portable path on the H200 (test_key_calibrations_...,
    # test_sliding_window_cache, test_young_sliding_window_..., the recent-token tests:
    # benchmarks/results/decode_kernel_h200_*.md), so auto serves them.
    monkeypatch.setenv(KERNEL_ENV, "auto")
    plain = filled_cache(TurboQuantKVCache("turbo4"), 40, 2, 64, mx.float16)
    q, view, mask = step_inputs(plain, 1, 2, 2, 64, mx.float16)
    assert view.pending is not None  # its encoding left to the attention launch
    step = fused_decode_and_encode(q, view, 0.125, mask, 3 * mx.ones((4,)))
    assert step is not None
    ring = filled_cache(
        TurboQuantRotatingKVCache("turbo4", max_size=32), 60, 2, 64, mx.float16
    )
    q, view, mask = step_inputs(ring, 1, 2, 2, 64, mx.float16)
    assert (
        view.sinks is not None and view.new_keys is None
    )  # the newest token, held exactly
    assert fused_decode_attention(q, view, 0.125, mask) is not None
    young = filled_cache(
        TurboQuantRotatingKVCache("turbo4", max_size=32), 40, 2, 64, mx.float16
    )
    q, view, mask = step_inputs(young, 1, 2, 2, 64, mx.float16)
    assert view.new_keys is None and view.sinks[0].shape[2] > 1  # its first tokens
    assert fused_decode_attention(q, view, 0.125, mask) is not None
    recent = filled_cache(
        TurboQuantKVCache("turbo4", recent_exact=8), 40, 2, 64, mx.float16
    )
    q, view, mask = step_inputs(recent, 1, 2, 2, 64, mx.float16)
    assert view.window == 8 and view.pending is not None  # encoded in its launch too
    assert fused_decode_and_encode(q, view, 0.125, mask) is not None
    ring = filled_cache(
        TurboQuantRotatingKVCache("turbo4", max_size=32, recent_exact=8),
        60,
        2,
        64,
        mx.float16,
    )
    q, view, mask = step_inputs(ring, 1, 2, 2, 64, mx.float16)
    assert view.sinks[0].shape[2] == 8
    assert fused_decode_attention(q, view, 0.125, mask) is not None


@pytest.mark.gpu  # MLX-CUDA's own fused attention
def test_auto_sends_float16_prefill_chunks_to_mlx_fused_attention(monkeypatch):
    cache = filled_cache(TurboQuantKVCache("turbo4"), 300, 2, 128, mx.float16)
    q, view, _ = step_inputs(cache, 16, 2, 4, 128, mx.float16)
    assert dense_prefill_support(q, view, "causal") is None
    assert dense_prefill_attention(q, view, 0.1, "causal", fused_only=True) is not None


def recording_kernel(calls, constants):
    """A stand-in for a compiled kernel of the template values ``constants``: records
    each call's arguments and those values in ``calls`` and returns zeroed outputs
    (runs on any backend)."""

    def kernel(**arguments):
        calls.append(dict(arguments, constants=constants))
        return [
            mx.zeros(s, d)
            for s, d in zip(arguments["output_shapes"], arguments["output_dtypes"])
        ]

    return kernel


def test_the_shared_workspace_grows_to_every_launch_it_has_served():
    # Row 0: a counter per group and chunk (the kernel finds the parts one row in, after
    # workspace_shape[1] words); the rows after it: the parts. Growing for one launch
    # must keep room for the launches before, and start zeroed (the counters).
    from mlx_lm_turbo.kernels.decode_attention import _Workspace

    workspace = _Workspace(mx.float16)
    workspace.fit(3, 1000)
    first = workspace.array
    assert first.dtype == mx.uint32 and first.shape[1] % 4 == 0  # parts 16-byte aligned
    assert first.shape[1] >= 3 and (first.shape[0] - 1) * first.shape[1] >= 1000
    workspace.fit(2, 500)  # fits already: the same array
    assert workspace.array is first
    workspace.fit(9, 100)  # more counters: wider, the parts' room kept
    rows, width = workspace.array.shape
    assert width >= 9 and (rows - 1) * width >= 1000
    assert not mx.any(workspace.array).item()
    assert (workspace.counters, workspace.part_words) == (width, (rows - 1) * width)


def test_threads_share_no_workspace():
    # Launches that threads build (on MLX streams of their own) are not ordered
    # against each other: each thread has its own workspace and chain of launches.
    import threading

    from mlx_lm_turbo.kernels.decode_attention import _workspace

    mine, theirs = _workspace(mx.float16), []
    thread = threading.Thread(target=lambda: theirs.append(_workspace(mx.float16)))
    thread.start()
    thread.join()
    assert _workspace(mx.float16) is mine and theirs[0] is not mine
    assert _workspace(mx.bfloat16) is not mine


def test_every_call_passes_queries_constants_rows_workspace_and_previous():
    # Also a variant of no flags at all (no tail, no sink tokens, no mask, no key
    # statistics): it still needs the arrays every call reads.
    from mlx_lm_turbo.kernels.decode_attention import INPUTS, call_inputs

    always = ("q", "consts", "rows", "workspace", "previous")
    assert call_inputs(4, 0) == always
    assert call_inputs(0, 0) == ("q", "consts", "keys", "rows", "workspace", "previous")
    assert set(always) < set(call_inputs(4, 0b11111111111)) <= set(INPUTS)


def test_calls_with_a_built_plan_pass_what_a_first_call_passes(monkeypatch):
    # Runs anywhere: the kernel is a stand-in recording its arguments. A layer's later
    # calls reuse the plan of their configuration; what they pass must be what a call
    # that builds its plan afresh passes (arrays of the call itself, the same constants
    # and placeholders, template values, grid and output shapes).
    import mlx_lm_turbo.kernels.decode_attention as decode_attention
    import mlx_lm_turbo.kernels.dispatch as dispatch

    calls, made = [], []
    monkeypatch.setattr(
        decode_attention,
        "_kernel",
        lambda warps, raw_tail, recent, names, constants: (
            made.append(names) or recording_kernel(calls, constants)
        ),
    )
    monkeypatch.setattr(dispatch, "_layer_support", lambda *where_and_what: None)
    monkeypatch.setattr(decode_attention, "gpu_backend", lambda: "cuda")
    caches = [
        TurboQuantKVCache("turbo4"),
        TurboQuantKVCache("turbo0v4", key_calibration="center+scale"),
        TurboQuantRotatingKVCache("turbo3", max_size=32, recent_exact=4),
    ]
    for cache in caches:
        monkeypatch.setenv(KERNEL_ENV, "off")  # the caches encode portably
        filled_cache(cache, 48, 2, 64, mx.float16)
        for step, (L, sinks) in enumerate([(1, None), (1, mx.ones((4,))), (2, None)]):
            monkeypatch.setenv(KERNEL_ENV, "off")
            q, view, mask = step_inputs(cache, L, 2, 2, 64, mx.float16, seed=step)
            cache.settle()  # a decode token encoded as a plain update (as off's is)
            monkeypatch.setenv(KERNEL_ENV, "on")
            # with the plans of the calls before (other configurations), then afresh
            fused_decode_attention(q, view, 0.125, mask, sinks)
            layer = decode_attention._LAYERS[view.codec]
            plans, layer.plans = layer.plans, {}
            fused_decode_attention(q, view, 0.125, mask, sinks)
            layer.plans = plans
            again, first = calls[-2], calls[-1]
            assert [k for k in first if k != "inputs"] == [
                k for k in again if k != "inputs"
            ]
            for k in first:
                if k != "inputs":
                    assert first[k] == again[k], k
            names = made[-1]  # the inputs the call passes, in their order
            assert len(first["inputs"]) == len(again["inputs"]) == len(names)
            for name, a, b in zip(names, first["inputs"], again["inputs"]):
                if name == "previous":  # the layer's last output
                    continue
                assert a is b or (a.shape == b.shape and mx.array_equal(a, b).item()), (
                    name
                )
            # decode_call.flags(): tail 16, tokens 32, logits 64
            flag_bits = dict(again["constants"])["FLAGS"]
            assert bool(flag_bits & 16) == (view.new_keys is not None)
            assert bool(flag_bits & 32) == (view.sinks is not None)
            assert bool(flag_bits & 64) == (sinks is not None)
            # only what the call reads: stored keys, sink tokens, a mask, sink logits
            assert ("keys" in names) == (view.codec.scheme.key_bits == 0)
            assert ("sink_keys" in names) == (view.sinks is not None)
            assert ("sink_logits" in names) == (sinks is not None)
            assert ("kscale" in names) == (view.codec.key_scale is not None)
            assert ("mask" in names) == isinstance(mask, mx.array)
            assert "recent" not in names and "kmean" not in names  # no raw tail
            at = {name: i for i, name in enumerate(names)}
            assert again["inputs"][at["q"]] is q
            assert again["inputs"][at["rows"]] is view.stored[-1]
            if view.new_keys is not None:
                assert again["inputs"][at["tail_keys"]] is view.new_keys


def test_a_launch_that_encodes_the_token_gets_it_raw_with_the_key_statistics(
    monkeypatch,
):
    # Runs anywhere (the kernel a recording stand-in): what a decode step's one launch
    # is handed: the token as the model gave it, the key mean and scale, the flags that
    # say so, and an output for its row.
    import mlx_lm_turbo.cache.kv_cache as cache_module
    import mlx_lm_turbo.kernels.decode_attention as decode_attention
    import mlx_lm_turbo.kernels.dispatch as dispatch

    calls, made = [], []
    monkeypatch.setattr(
        decode_attention,
        "_kernel",
        lambda warps, raw_tail, recent, names, constants: (
            made.append((raw_tail, names)) or recording_kernel(calls, constants)
        ),
    )
    monkeypatch.setenv(KERNEL_ENV, "off")  # the cache fills portably
    cache = filled_cache(
        TurboQuantKVCache("turbo3", key_calibration="center+scale"),
        48,
        2,
        64,
        mx.float16,
    )
    monkeypatch.setenv(KERNEL_ENV, "on")
    monkeypatch.setattr(dispatch, "_layer_support", lambda *where_and_what: None)
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: True)
    q, view, mask = step_inputs(cache, 1, 2, 2, 64, mx.float16)
    assert view.pending is not None and view.new_keys.shape == (1, 2, 1, 64)
    out, rows, recent_rows = fused_decode_and_encode(q, view, 0.125, mask)
    assert recent_rows is None  # no window
    (arguments,) = calls
    ((raw_tail, names),) = made
    assert raw_tail and "kmean" in names and "recent" not in names
    inputs, at = arguments["inputs"], {name: i for i, name in enumerate(names)}
    assert len(inputs) == len(names)
    assert inputs[at["tail_keys"]] is view.new_keys  # as the model gave it
    assert inputs[at["tail_values"]] is view.new_values
    for name, statistic in (
        ("kmean", view.codec.key_mean),
        ("kscale", view.codec.key_scale),
    ):
        assert mx.array_equal(inputs[at[name]], statistic).item(), name
    flag_bits = dict(arguments["constants"])["FLAGS"]
    assert flag_bits & 128 and flag_bits & 256 and flag_bits & 8  # raw, mean, scale
    assert arguments["output_shapes"][1] == (1, 2, 1, view.codec.row_words)
    assert rows.shape == (1, 2, 1, view.codec.row_words) and out.shape == q.shape


def test_a_launch_with_a_window_reads_the_recent_rows_and_hands_them_back(monkeypatch):
    # Runs anywhere (the kernel a recording stand-in): with a window of exact recent
    # tokens the decode step's one launch takes the rows of the tokens before its own
    # (attention domain, then as the model gave them) and writes them one token on.
    import mlx_lm_turbo.cache.kv_cache as cache_module
    import mlx_lm_turbo.kernels.decode_attention as decode_attention
    import mlx_lm_turbo.kernels.dispatch as dispatch

    calls, made = [], []
    monkeypatch.setattr(
        decode_attention,
        "_kernel",
        lambda warps, raw_tail, recent, names, constants: (
            made.append((raw_tail, recent, names)) or recording_kernel(calls, constants)
        ),
    )
    monkeypatch.setenv(KERNEL_ENV, "off")  # the cache fills portably
    cache = TurboQuantKVCache("turbo4", recent_exact=8)
    filled_cache(cache, 48, 2, 64, mx.float16)
    raw = cache.recent
    monkeypatch.setenv(KERNEL_ENV, "on")
    monkeypatch.setattr(dispatch, "_layer_support", lambda *where_and_what: None)
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: True)
    q, view, mask = step_inputs(cache, 1, 2, 2, 64, mx.float16)
    assert view.pending is not None and view.new_keys.shape == (1, 2, 1, 64)
    # per head: room for a packed row (17 words, 20 with the alignment), then 7 rows
    # of 4 x 64 fp16 values (128 words each)
    assert view.recent.shape == (1, 2, 1, 20 + 7 * 128) and view.window == 8
    assert view.recent.dtype == mx.uint32
    rows_before = decode_attention.tail_rows(view.codec, view.recent)
    exact = view.codec.exact(*raw)
    for i, a in enumerate((*exact, *raw)):
        assert mx.array_equal(rows_before[..., 64 * i : 64 * (i + 1)], a).item()
    out, rows, recent_rows = fused_decode_and_encode(q, view, 0.125, mask)
    (arguments,) = calls
    ((raw_tail, recent, names),) = made
    assert raw_tail and recent and "recent" in names
    inputs, at = arguments["inputs"], {name: i for i, name in enumerate(names)}
    assert len(inputs) == len(names)
    assert inputs[at["recent"]] is view.recent
    assert inputs[at["tail_keys"]] is view.new_keys  # as the model gave it
    flag_bits = dict(arguments["constants"])["FLAGS"]
    assert flag_bits & 1024 and flag_bits & 128 and flag_bits & 16  # recent, raw, tail
    assert dict(arguments["constants"])["WINDOW"] == 8
    # one output besides the attention's: the tail one token on, led by the new row
    assert arguments["output_shapes"][1:] == [view.recent.shape]
    assert arguments["output_dtypes"][1:] == [mx.uint32]
    assert rows is None and recent_rows.shape == view.recent.shape
    # (the stand-in kernel's outputs are zeros: a tail of distinct words instead)
    recent_rows = mx.arange(recent_rows.size, dtype=mx.uint32).reshape(
        recent_rows.shape
    )
    step = view.pending
    step.launched, step.rows, step.recent_rows = True, rows, recent_rows
    cache._take_launch()
    assert cache._recent_rows_now() is recent_rows
    # the row, sliced from the tail when ordered
    assert cache._rows_in_place[1] is recent_rows
    cache._order_rows()
    position = cache.offset - 1
    expected = decode_attention.tail_row(view.codec, recent_rows)
    assert mx.array_equal(cache.stored[-1][:, :, position : position + 1], expected)
    assert expected.shape == (1, 2, 1, view.codec.row_words) and expected.max() > 0
    # a row alone (a launch without a window) is written as it is, no slice op
    assert decode_attention.tail_row(view.codec, expected) is expected


# -- a decode token encoded in its attention launch ------------------------------
def emulated_launch(calls):
    """``fused_decode_and_encode`` by the portable path (runs anywhere): the token's
    row and exact copies from the codec, attention over the plain view; a write in
    place lands in the cache's own array; a window's tail comes back led by the row.
    Records (view, in place) in ``calls``."""
    from mlx_lm_turbo.cache.attention import blockwise_attention
    from mlx_lm_turbo.cache.view import TurboKV

    def launch(queries, kv, scale, mask, sinks=None, in_place=False):
        calls.append((kv, in_place))
        (rows,), exact_keys, exact_values = kv.codec.encode(kv.new_keys, kv.new_values)
        recent_rows = None
        if kv.recent is not None:  # the window's rows read first, handed back one on
            recent = tail_rows(kv.codec, kv.recent)
            new = [exact_keys, exact_values, kv.new_keys, kv.new_values]
            next_rows = mx.concatenate(
                [recent[:, :, 1:], mx.concatenate(new, axis=-1)], axis=2
            )
            tail = recent_tail(kv.codec, next_rows)
            recent_rows = mx.concatenate(
                [rows, tail[..., kv.codec.row_words :]], axis=-1
            )
            D = kv.codec.key_dim
            exact_keys, exact_values = (
                mx.concatenate([recent_part(recent, i, D), a], axis=2)
                for i, a in enumerate((exact_keys, exact_values))
            )
        plain = TurboKV(
            kv.codec, kv.stored, exact_keys, exact_values, kv.sinks, kv.window
        )
        if in_place:  # into the cache's own buffer, as the kernel writes
            slot = kv.stored[-1].shape[2] - 1
            kv.pending.settle.__self__.stored[-1][:, :, slot : slot + 1] = rows
        out = blockwise_attention(queries, plain, scale, mask, sinks)
        return out, None if kv.recent is not None else rows, recent_rows

    return launch


def small_cache(scheme="turbo4", **options):
    """A cache of 40 tokens, 2 heads of 64, float32 (``decode_steps``' defaults)."""
    return filled_cache(TurboQuantKVCache(scheme, **options), 40, 2, 64, mx.float32)


def decode_steps(cache, steps, H=2, G=2, D=64, seed=30, dtype=mx.float32):
    """A model's decode steps through mlx-lm's attention: the outputs."""
    from mlx_lm.models import base

    outputs = []
    for step in range(steps):
        q, k, v = (
            mx.random.normal(
                (1, H * n, 1, D), key=mx.random.key(seed + 3 * step + i)
            ).astype(dtype)
            for i, n in enumerate((G, 1, 1))
        )
        keys, values = cache.update_and_fetch(k, v)
        outputs.append(
            base.scaled_dot_product_attention(
                q, keys, values, cache=cache, scale=D**-0.5, mask=None
            )
        )
    return outputs


@pytest.fixture
def launch_anywhere(monkeypatch):
    """Caches defer their decode tokens and attention takes them to an emulated launch;
    everything else on the portable path (so on a GPU too both sides compute alike)."""
    import mlx_lm_turbo.cache.attention as attention
    import mlx_lm_turbo.cache.kv_cache as cache_module

    monkeypatch.setenv(KERNEL_ENV, "off")
    calls = []
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: True)
    monkeypatch.setattr(attention, "fused_decode_and_encode", emulated_launch(calls))
    return calls


def states_equal(a, b):
    for x, y in zip(a.state[1:], b.state[1:], strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            assert mx.array_equal(x, y).item()


@pytest.mark.parametrize(
    "calibration, recent_exact",
    [("center", 1), ("center+scale", 1), ("center", 8), ("none", 8)],
)
def test_a_decode_token_encoded_by_its_launch_leaves_what_a_plain_update_leaves(
    monkeypatch, launch_anywhere, calibration, recent_exact
):
    # With a window (recent_exact > 1) the launch also reads the recent tokens from
    # the rows the cache hands it, and hands them back one token on.
    import mlx_lm_turbo.cache.kv_cache as cache_module

    deferred, plain = (
        small_cache(key_calibration=calibration, recent_exact=recent_exact)
        for _ in range(2)
    )
    codecs = (deferred.codec, plain.codec)
    out = decode_steps(deferred, 5)
    assert len(launch_anywhere) == 5  # every step went to the launch
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: False)
    reference = decode_steps(plain, 5)
    for a, b in zip(out, reference):
        assert mx.allclose(a, b, rtol=1e-5, atol=1e-6).item()
    states_equal(deferred, plain)
    # the statistics were measured once, on the sink tokens: decode steps keep the codec
    # (which a launch's layer and recent rows are tied to), "none" included
    assert deferred.codec is codecs[0] and plain.codec is codecs[1]
    if recent_exact > 1:
        # the launch's view: the 7 tokens before its own, as rows of 4 x 64
        view, _ = launch_anywhere[-1]
        assert tail_rows(view.codec, view.recent).shape == (1, 2, 7, 4 * 64)
        # held once: the recent copies are views of the launch's tail, which also has
        # room for a row (17 words, 20 with the alignment) per head
        tail, lead = deferred._recent_rows[1], 2 * 20 * 4
        assert deferred.nbytes == plain.nbytes + (tail.nbytes - lead) // 2 + lead
        # and a chunk after the steps goes on as the plain cache does
        k, v = (mx.random.normal((1, 2, 5, 64), key=mx.random.key(i)) for i in (4, 5))
        for cache in (deferred, plain):
            cache.update_and_fetch(k, v)
        states_equal(deferred, plain)


def graph_ops(array, tmp_path):
    """The ops MLX would run to compute ``array``, from its DOT export: {op id: (name,
    input array names in order, output array names)}."""
    import re

    path = tmp_path / "graph.dot"
    mx.export_to_dot(str(path), array)
    ops = {}
    for line in path.read_text().splitlines():
        if m := re.match(r'\{ (\d+) \[label ="([^"]+)"', line.strip()):
            ops[m[1]] = (m[2], [], [])
        elif m := re.match(r'"(\w+)" -> (\d+)$', line.strip()):
            ops[m[2]][1].append(m[1])
        elif m := re.match(r'(\d+) -> "(\w+)"$', line.strip()):
            ops[m[1]][2].append(m[2])
    return ops


def test_ordering_rows_written_in_place_reads_the_launch_output_in_one_kernel(
    launch_anywhere, tmp_path
):
    # MLX-CUDA orders a graph's kernels by the buffers each reads and writes. A slice
    # update copies a buffer it cannot donate in a kernel that does not read the
    # update, so the row of the last launch alone would not order that copy after
    # the launches writing into the buffer (on the H200 it lost rows:
    # benchmarks/results/rows_in_place_h200_f6e8e08.md). The buffer the row goes into
    # must come from one elementwise kernel that reads the launch's output too.
    cache = small_cache(recent_exact=16)
    decode_steps(cache, 3)
    assert all(in_place for _, in_place in launch_anywhere)
    cache._take_launch()
    position, rows = cache._rows_in_place
    cache._order_rows()
    ops = graph_ops(cache.stored[0], tmp_path)
    (write,) = [
        op
        for op in ops.values()
        if op[0] == "SliceUpdate"
        and not any(a in other[1] for other in ops.values() for a in op[2])
    ]
    into, row = write[1]
    (made,) = [op for op in ops.values() if into in op[2]]
    assert made[0] == "BitwiseOr", made
    # the launch's row reaches what that kernel reads
    reached, frontier = set(), {row}
    while frontier:
        reached |= frontier
        frontier = {
            out for op in ops.values() if set(op[1]) & frontier for out in op[2]
        } - reached
    assert set(made[1]) & reached
    assert mx.array_equal(
        cache.stored[0][:, :, position : position + 1],
        tail_row(cache.codec, rows),
    ).item()


def test_rows_written_in_place_keep_no_launch_outputs_alive(launch_anywhere):
    # Each launch's recent tail (the window's rows, led by the new row) is kept until
    # the next step's; for ordering the cache keeps the last launch's, not every
    # step's (at W 16 that would be 2 x 15 x 256 floats a step until the cache grows).
    import gc

    cache = small_cache(recent_exact=16)
    outputs = decode_steps(cache, 150)
    mx.eval(outputs)
    assert len(launch_anywhere) == 150
    assert all(in_place for _, in_place in launch_anywhere)
    del outputs
    launch_anywhere.clear()  # its views hold their steps' tails
    gc.collect()
    nbytes, before = cache.nbytes, mx.get_active_memory()
    del cache
    gc.collect()
    freed = before - mx.get_active_memory()
    assert freed < 2 * nbytes, (freed, nbytes)


def test_a_launch_writes_its_row_in_place_only_where_no_one_else_holds_the_slot(
    monkeypatch, launch_anywhere
):
    # Slots handed out (a state, a trim's earlier ones, a copy of the cache, ``keys``)
    # may sit in arrays others keep: those rows go through an update op. Growing into
    # new buffers makes every slot private again.
    import mlx_lm_turbo.cache.kv_cache as cache_module

    deferred = TurboQuantKVCache("turbo4")
    deferred.step = 8  # grow often
    filled_cache(deferred, 40, 2, 64, mx.float32)

    def in_place(steps, seed):
        del launch_anywhere[:]
        outputs.extend(decode_steps(deferred, steps, seed=seed))
        return [flag for _, flag in launch_anywhere]

    outputs = []
    assert in_place(3, 0) == [True] * 3  # slots 40-42, after the prefill's
    deferred.state  # hands out 0-42
    assert in_place(1, 10) == [True]  # slot 43
    deferred.trim(2)
    assert in_place(3, 20) == [False, True, True]  # slot 42 was handed out
    twin = copy.deepcopy(deferred)  # shares the buffers (capacity 48)
    assert in_place(3, 30) == [False, False, False]  # slots 45-47
    assert in_place(2, 40) == [True] * 2  # 48-49 in new buffers
    deferred.keys  # handed out whole (as a pipeline stage ties its send to it)
    assert in_place(6, 50) == [False] * 6  # 50-55
    assert in_place(1, 60) == [True]  # 56, in new buffers

    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: False)
    plain = small_cache()
    reference = []
    for steps, seed in ((3, 0), (1, 10)):
        reference += decode_steps(plain, steps, seed=seed)
    plain.trim(2)
    for steps, seed in ((3, 20), (3, 30), (2, 40), (6, 50), (1, 60)):
        reference += decode_steps(plain, steps, seed=seed)
    for a, b in zip(outputs, reference, strict=True):
        assert mx.allclose(a, b, rtol=1e-5, atol=1e-6).item()
    states_equal(deferred, plain)
    assert twin.offset == 45


@pytest.mark.parametrize("recent_exact", [1, 8])
def test_a_waiting_token_is_encoded_before_anything_else_reads_the_cache(
    monkeypatch, launch_anywhere, recent_exact
):
    import mlx_lm_turbo.cache.kv_cache as cache_module

    deferred = small_cache("turbo3", recent_exact=recent_exact)
    k, v = (mx.random.normal((1, 2, 1, 64), key=mx.random.key(i)) for i in (1, 2))
    view, _ = deferred.update_and_fetch(k, v)
    assert view.pending is not None and deferred.offset == 41
    assert (view.recent is None) == (recent_exact == 1)
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: False)
    plain = small_cache("turbo3", recent_exact=recent_exact)
    plain_view, _ = plain.update_and_fetch(k, v)
    states_equal(deferred, plain)  # no attention call: state encodes it
    assert view.pending is None and view.recent is None  # a plain view now
    assert view.new_keys.shape[2] == recent_exact
    assert mx.array_equal(view.new_keys, plain_view.new_keys).item()
    if recent_exact == 1:  # (a window's caches cannot be trimmed)
        assert deferred.trim(1) == plain.trim(1) == 1
        states_equal(deferred, plain)


def test_a_cache_joins_a_batch_with_its_waiting_token_encoded(
    monkeypatch, launch_anywhere
):
    # mlx-lm's batch generator merges single caches into batch caches: a decode token
    # left for its launch is encoded first, so the batch's rows and its recent copies
    # hold it as a plain update's would.
    import mlx_lm_turbo.cache.kv_cache as cache_module

    def waiting(defers):
        monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: defers)
        cache = small_cache(recent_exact=8)
        k, v = (mx.random.normal((1, 2, 1, 64), key=mx.random.key(i)) for i in (1, 2))
        view, _ = cache.update_and_fetch(k, v)
        assert (view.pending is not None) == defers
        return cache

    deferred, plain = waiting(True), waiting(False)
    joined, reference = (TurboQuantKVCache.merge([c]) for c in (deferred, plain))
    for a, b in zip(joined.recent, reference.recent, strict=True):
        assert mx.array_equal(a, b).item()
    states_equal(joined, reference)


@pytest.mark.parametrize("recent_exact", [1, 8])
def test_a_launch_that_declines_leaves_the_token_to_the_cache(
    monkeypatch, launch_anywhere, recent_exact
):
    import mlx_lm_turbo.cache.attention as attention
    import mlx_lm_turbo.cache.kv_cache as cache_module

    declined = []
    monkeypatch.setattr(
        attention,
        "fused_decode_and_encode",
        lambda queries, kv, *a, **k: declined.append(kv.pending) and None,
    )
    deferred = small_cache(recent_exact=recent_exact)
    out = decode_steps(deferred, 3)
    assert len(declined) == 3 and None not in declined  # each waited for its launch
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: False)
    plain = small_cache(recent_exact=recent_exact)
    for a, b in zip(out, decode_steps(plain, 3)):
        assert mx.array_equal(a, b).item()
    states_equal(deferred, plain)


@pytest.mark.parametrize("recent_exact", [1, 8])
def test_a_view_attended_twice_gives_the_same_output(
    monkeypatch, launch_anywhere, recent_exact
):
    from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention

    cache = small_cache(recent_exact=recent_exact)
    k, v = (mx.random.normal((1, 2, 1, 64), key=mx.random.key(i)) for i in (1, 2))
    q = mx.random.normal((1, 4, 1, 64), key=mx.random.key(3))
    view, _ = cache.update_and_fetch(k, v)
    first = turbo_scaled_dot_product_attention(q, view, 0.125, None)
    assert len(launch_anywhere) == 1 and view.pending.launched
    again = turbo_scaled_dot_product_attention(q, view, 0.125, None)
    assert view.pending is None  # its exact copies made for the second call
    assert mx.allclose(first, again, rtol=1e-5, atol=1e-6).item()


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "scheme, calibration, D, dtype",
    [
        ("turbo4", "center", 128, mx.float16),
        ("turbo3", "center+scale", 64, mx.float16),
        ("turbo2", "none", 256, mx.bfloat16),
        ("turbo8", "center", 64, mx.float32),
        ("turbo4v2", "center", 128, mx.bfloat16),
        ("turbo5v3", "center+scale", 64, mx.float16),
        ("turbo6v2", "center", 256, mx.bfloat16),
    ],
)
def test_a_decode_token_encoded_in_the_launch_matches_the_encode_kernel(
    monkeypatch, scheme, calibration, D, dtype
):
    # Same bits as the encode kernel (so a prompt's output does not depend on which
    # of them encoded its last token), same output as the plain launch.
    from mlx_lm_turbo.cache.view import TurboKV

    monkeypatch.setenv(KERNEL_ENV, "auto")
    cache = filled_cache(
        TurboQuantKVCache(scheme, key_calibration=calibration), 600, 4, D, dtype
    )
    q, view, mask = step_inputs(cache, 1, 4, 3, D, dtype)
    assert view.pending is not None and view.pending.in_place
    out, rows, _ = fused_decode_and_encode(q, view, D**-0.5, mask, in_place=True)
    (encoded,), exact_keys, exact_values = fused_encode(
        view.codec, view.new_keys, view.new_values
    )
    assert mx.array_equal(rows, encoded).item()
    mx.eval(out)
    # the launch wrote the row into its slot (read without any op ordering it)
    assert mx.array_equal(cache._slice()[-1][:, :, -1:], encoded).item()
    plain = TurboKV(
        view.codec, view.stored, exact_keys, exact_values, view.sinks, view.window
    )
    reference = fused_decode_attention(q, plain, D**-0.5, mask)
    assert relative_error(out, reference) < 1e-6
    view.pending.launched, view.pending.rows = True, rows
    assert mx.array_equal(cache._stored_slice()[-1][:, :, -1:], encoded).item()


@pytest.mark.usefixtures("cuda_kernels")
def test_decode_steps_with_the_encoding_in_the_launch_match_two_launches(monkeypatch):
    import mlx_lm_turbo.cache.kv_cache as cache_module

    monkeypatch.setenv(KERNEL_ENV, "auto")
    # 766 tokens: the steps write rows in place into slots 766 and 767, then the
    # cache grows (reading those rows) and the next ones go into the new buffers;
    # all built before anything is evaluated, as one graph.
    one = filled_cache(TurboQuantKVCache("turbo4"), 766, 2, 128, mx.float16)
    two = filled_cache(TurboQuantKVCache("turbo4"), 766, 2, 128, mx.float16)
    out = decode_steps(one, 4, D=128, dtype=mx.float16)
    one._take_launch()  # the last launch's row, stored on the cache's next call
    assert one._waiting is None  # each launch's row stored
    assert one._rows_in_place[0] == 769  # the last row; 766-767 ordered by the growth
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: False)
    for a, b in zip(out, decode_steps(two, 4, D=128, dtype=mx.float16)):
        assert relative_error(a, b) < 1e-6
    states_equal(one, two)


@pytest.mark.usefixtures("cuda_kernels")
@pytest.mark.parametrize(
    "scheme, D, dtype",
    [
        ("turbo4", 128, mx.float16),
        ("turbo3", 64, mx.bfloat16),
        ("turbo2", 256, mx.float16),
        ("turbo4v2", 128, mx.float32),
        ("turbo5v3", 128, mx.float16),
        ("turbo6v2", 64, mx.bfloat16),
    ],
)
def test_decode_steps_with_a_window_in_one_launch_match_the_plain_update(
    monkeypatch, scheme, D, dtype
):
    # recent_exact 32: each step's one launch reads the 31 recent tokens from the rows
    # the cache hands it and hands them back one token on. The plain update encodes the
    # window with each token (the encode kernel) and attends with a second launch. The
    # first step's rows are made by MLX ops (codec.exact) where the plain update's
    # copies come from the encode kernel: the same arithmetic in another order, so the
    # outputs agree to the kernels' tolerance against each other (2e-3 relative, as
    # against the portable path), the stored bits exactly.
    import mlx_lm_turbo.cache.kv_cache as cache_module

    monkeypatch.setenv(KERNEL_ENV, "auto")

    def new():
        cache = TurboQuantKVCache(scheme, recent_exact=32)
        return filled_cache(cache, 766, 2, D, dtype)

    one, two = new(), new()
    out = decode_steps(one, 6, D=D, dtype=dtype)
    one._take_launch()  # the last launch's tail, taken on the cache's next call
    assert one._waiting is None and one._recent_rows is not None
    # the rows the last launch handed back: its token's and the ones before it in the
    # attention domain, as the codec makes them from their raw copies
    rows = tail_rows(one.codec, one._recent_rows[1])
    for i, exact in enumerate(one.codec.exact(*one.recent)):
        assert relative_error(recent_part(rows, i, D), exact) < 2e-3
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: False)
    for a, b in zip(out, decode_steps(two, 6, D=D, dtype=dtype), strict=True):
        assert relative_error(a, b) < 2e-3
    states_equal(one, two)


@pytest.mark.usefixtures("cuda_kernels")
def test_copies_of_a_cache_decode_apart(monkeypatch):
    # mlx-lm's prompt caches deep-copy caches, and a copy shares the stored buffers
    # (MLX arrays copy by reference): rows written in place by one must not reach
    # the other. Both decode different tokens, each as a cache of its own would.
    import mlx_lm_turbo.cache.kv_cache as cache_module

    monkeypatch.setenv(KERNEL_ENV, "auto")
    cache = filled_cache(TurboQuantKVCache("turbo4"), 300, 2, 128, mx.float16)
    twin = copy.deepcopy(cache)
    out = {id(cache): [], id(twin): []}
    for step in range(4):
        for c, seed in ((cache, 100), (twin, 200)):
            out[id(c)] += decode_steps(
                c, 3, D=128, seed=seed + 10 * step, dtype=mx.float16
            )
    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: False)
    for c, seed in ((cache, 100), (twin, 200)):
        alone = filled_cache(TurboQuantKVCache("turbo4"), 300, 2, 128, mx.float16)
        reference = []
        for step in range(4):
            reference += decode_steps(
                alone, 3, D=128, seed=seed + 10 * step, dtype=mx.float16
            )
        for a, b in zip(out[id(c)], reference, strict=True):
            assert relative_error(a, b) < 1e-6
        states_equal(c, alone)


# -- offline (nvcc, no GPU) --------------------------------------------------------
@pytest.mark.slow  # an nvcc subprocess
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("key_bits", [4, 3])
def test_the_fused_kernel_compiles_with_two_tiles_of_query_rows(key_bits):
    # head dim 64, 4 x 8 query rows: the key scores' second tile of 8 rows (4-bit key
    # pairs read as bytes of whole words, 3-bit pairs straddling words)
    compile_kernels = scripts_compile_kernels()
    variant = next(
        (dtype, kind, template)
        for dtype, kind, template in compile_kernels.attention_variants()
        if dtype == "float16"
        and dict(template)["D"] == 64
        and dict(template)["R"] == 16
        and dict(template)["KB"] == key_bits
    )
    unit = compile_kernels.attention_unit(*variant)
    with tempfile.TemporaryDirectory() as tmp:
        # device code only, through ptxas (which reads the inline PTX), as NVRTC
        run = compile_kernels.compile_unit(
            unit, "sm_90", Path(tmp) / "unit.cu", Path(tmp) / "unit.cubin"
        )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Used" in run.stderr and "registers" in run.stderr  # ptxas ran


def test_mma_loops_counts_the_loops_holding_tensor_core_instructions_and_inside():
    listing = """
        /*0000*/                   MOV R1, RZ ;
.L_x_1:
        /*0010*/                   LDS R2, [R3] ;
        /*0020*/                   HMMA.16816.F32 R4, R8, R2, R4 ;
.L_x_3:
        /*0030*/                   STL [R1], R2 ;
        /*0040*/                   LDL R2, [R1] ;
        /*0050*/              @P2 BRA `(.L_x_3) ;
        /*0060*/                   IADD3 R3, R3, 0x4, RZ ;
        /*0070*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0080*/                   IADD3 R3, R3, 0x4, RZ ;
        /*0090*/              @P1 BRA `(.L_x_2) ;
        /*00a0*/                   BRA `(.L_x_1) ;
        /*00b0*/                   EXIT ;
"""
    # (depth, instructions, MMA, shared loads, local loads and stores): the loop inside
    # the MMA loop counts, the later loop without MMA does not, and the last jump back
    # is unconditional (a divergence handler's return), no loop
    assert scripts_compile_kernels().mma_loops(listing) == [
        (0, 7, 1, 1, 2),
        (1, 3, 0, 0, 2),
    ]


def elf_with_sections(sections):
    """A minimal ELF64 file of the given (name, bytes) sections and their name table."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _ in sections) + b".shstrtab\0"
    body, name_at, headers = b"", 1, [bytes(64)]  # section 0 is the null section
    for name, data in [*sections, (".shstrtab", names)]:
        kind = 3 if name == ".shstrtab" else 1  # string table, else program data
        offset = 64 + len(body)
        headers.append(
            struct.pack(
                "<IIQQQQIIQQ", name_at, kind, 0, 0, offset, len(data), 0, 0, 1, 0
            )
        )
        name_at += len(name) + 1
        body += data
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    struct.pack_into("<Q", header, 0x28, 64 + len(body))
    struct.pack_into("<HHH", header, 0x3A, 64, len(headers), len(headers) - 1)
    return bytes(header) + body + b"".join(headers)


def test_code_hash_reads_the_machine_code_alone(tmp_path):
    code_hash = scripts_compile_kernels().code_hash

    def hashed(sections):
        path = tmp_path / "unit.cubin"
        path.write_bytes(elf_with_sections(sections))
        return code_hash(path)

    code = [(".text.attention", b"\x01\x02\x03\x04" * 8)]
    same = hashed([(".nv.info", b"one build"), *code])
    assert hashed([(".nv.info", b"another build's notes"), *code]) == same
    assert (
        hashed([(".nv.info", b"one build"), (".text.attention", b"\x01" * 32)]) != same
    )
    assert hashed([*code, (".text.merge", b"\x05")]) != same
