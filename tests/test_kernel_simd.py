"""The shared SIMD decode-attention kernels (CUDA and Metal from one source) against
the portable path.

Everywhere: the sources each backend gets and the calls' support. The kernel cases
(fixture ``gpu_kernels``): this GPU's build of the shared bodies (CUDA or Metal)
against the portable path, as tests/test_kernels.py checks the fused kernel (same
tolerances); without a GPU, both builds run on the CPU (tests/gpu_on_cpu.py), as CI
runs them. On an Apple GPU this file is the run that can verify the Metal build.
"""

import math
import re
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import (
    WIDTHS,
    assert_as_portable,
    filled_cache,
    latin_cases,
    scripts_compile_kernels,
    step_inputs,
)

from mlx_lm_turbo import TurboQuantKVCache, TurboQuantRotatingKVCache
from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention
from mlx_lm_turbo.kernels import KERNEL_ENV, build, dispatch
from mlx_lm_turbo.kernels import decode_attention_simd as simd


@pytest.fixture(autouse=True)
def portable_caches(monkeypatch):
    """Caches encode every token themselves (no decode token left to a launch), and the
    reference is the portable path."""
    monkeypatch.setenv(KERNEL_ENV, "off")


# -- the sources -----------------------------------------------------------------
SHARED = (*simd.BODIES, "decode_attention_simd.h")
# Spellings of one backend that must not reach the shared sources.
BACKEND_ONLY = [
    r"__\w+",  # CUDA's __syncthreads, __shfl_*, __half, __shared__, __device__, ...
    r"\b(threadIdx|blockIdx|blockDim|gridDim|turbo::|asm|nv_bfloat16)\b",
    r"\bif constexpr\b|\[&\]|\[=\]",  # C++17 and lambdas: MSL is C++14 without lambdas
    r"\b(threadgroup|device|constant|thread|half|bfloat|metal|simd_\w+|as_type)\b",
    r"\b(thread_index_in_\w+|simdgroup_index_in_\w+|threadgroup_position_in_\w+)\b",
]


@pytest.mark.parametrize("name", SHARED)
def test_shared_sources_use_no_backend_spelling(name):
    text = build.source(name)
    for pattern in BACKEND_ONLY:
        assert not re.search(pattern, text), (name, re.search(pattern, text).group())


@pytest.mark.parametrize("body", simd.BODIES)
def test_each_backend_source_declares_the_indices_from_its_own_names(body):
    metal, cuda = (simd.kernel_source(b, body) for b in ("metal", "cuda"))
    # MLX adds a Metal attribute to the signature where the source (not the header) names it
    for attribute in (
        "threadgroup_position_in_grid",
        "threadgroups_per_grid",
        "thread_index_in_threadgroup",
        "thread_index_in_simdgroup",
        "simdgroup_index_in_threadgroup",
    ):
        assert attribute in metal and attribute not in cuda
    assert "blockIdx" in cuda and "blockIdx" not in metal
    assert metal.endswith(build.source(body) + "\n")
    assert cuda.endswith(build.included(body))  # MLX-CUDA's compiler reads the file
    assert "simd_sum" in simd.kernel_header("metal")
    assert build.included("simd_prelude_cuda.h") in simd.kernel_header("cuda")


def test_a_changed_source_is_built_under_a_new_name(monkeypatch):
    names = {"cuda": [], "metal": []}
    for backend in names:
        monkeypatch.setattr(
            mx.fast,
            f"{backend}_kernel",
            lambda name, b=backend, **options: names[b].append(name),
            raising=False,
        )

    def build_all():
        simd.kernels.cache_clear()
        build.source.cache_clear()
        for backend in names:
            simd.kernels(backend)
        return [n for built in names.values() for n in built[-2:]]

    first = build_all()
    assert len(set(first)) == 4 and first == build_all()
    read = build.Path.read_text
    for edited in (*SHARED, "simd_prelude_metal.h", "simd_prelude_cuda.h"):
        monkeypatch.setattr(
            build.Path,
            "read_text",
            lambda path, *a, e=edited: (
                read(path, *a) + ("\nint changed;" if path.name == e else "")
            ),
        )
        renamed = [a != b for a, b in zip(first, build_all())]
        backend = re.search(r"prelude_(\w+)\.h", edited)
        if backend:  # its own backend's two kernels
            assert renamed == [backend[1] == b for b in names for _ in (0, 1)]
        elif edited.endswith(".h"):  # every kernel
            assert all(renamed), edited
        else:  # that body's kernel on both backends
            at = simd.BODIES.index(edited)
            assert renamed == [i == at for _ in names for i in (0, 1)], edited
    monkeypatch.undo()
    simd.kernels.cache_clear()
    build.source.cache_clear()


@pytest.mark.slow  # compiler subprocesses
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_cuda_build_compiles():
    compile_kernels = scripts_compile_kernels()
    # 3-bit codes (words straddled), sink tokens, a tail in a window, an additive mask
    variant = next(
        v
        for v in compile_kernels.simd_variants()
        if dict(v[2])["KB"] == 3 and dict(v[2])["L"] == 8 and v[1] != "bool"
    )
    # Device code only, through ptxas (as MLX-CUDA's NVRTC builds it): -c would add
    # the host compiler's pass over the same source.
    with tempfile.TemporaryDirectory() as tmp:
        for n, unit in enumerate(compile_kernels.simd_units(*variant)):
            run = compile_kernels.compile_unit(
                unit, "sm_90", Path(tmp) / f"{n}.cu", Path(tmp) / f"{n}.cubin"
            )
            assert run.returncode == 0, run.stderr[-4000:]
            assert "Used" in run.stderr and "registers" in run.stderr  # ptxas ran


@pytest.mark.slow  # compiler subprocesses
@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_the_metal_build_compiles_as_cpp_against_metals_names():
    # No Metal compiler here: MLX's Metal kernel, written as MLX writes it, checked by a
    # C++14 compiler against a stand-in of Metal's names and types (undeclared names,
    # type errors, C++ beyond Metal's). A stand-in that hid errors would fail below.
    compile_kernels = scripts_compile_kernels()
    variants = list(compile_kernels.simd_variants())
    # A unit is a function template and its explicit instantiation for one variant:
    # the units of one template (one kernel, one signature's types) are checked in one
    # compiler run, each variant's instantiation checked as in a unit of its own.
    templates = {}
    for variant in variants[::23]:  # every dtype, head dim, width and mask kind
        for unit in compile_kernels.simd_units(*variant, backend="metal"):
            at = unit.rindex("\ntemplate void ")
            templates.setdefault(unit[:at], {})[unit[at:]] = None
    assert len(templates) < sum(map(len, templates.values()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "unit.cpp"
        for template, instances in templates.items():
            run = compile_kernels.compile_metal_as_cpp(
                template + "".join(instances), path
            )
            assert run.returncode == 0, run.stderr[-4000:]
        broken = unit.replace("BARRIER();", "__syncthreads();", 1)
        assert compile_kernels.compile_metal_as_cpp(broken, path).returncode != 0


# -- which calls the kernels take ---------------------------------------------------
def test_calls_they_do_not_cover_go_to_the_portable_path():
    cache = filled_cache(TurboQuantKVCache("turbo4"), 64, 2, 64, mx.float16)
    q, view, mask = step_inputs(cache, 1, 2, 2, 64, mx.float16)
    assert simd.simd_call_support(q, view, mask) is None
    long_q = mx.zeros((1, 4, 9, 64), mx.float16)
    assert simd.simd_call_support(long_q, view, mask) == "prefill"
    assert "dtype" in simd.simd_call_support(q.astype(mx.float32), view, mask)
    wide = filled_cache(TurboQuantKVCache("turbo4"), 64, 2, 96, mx.float16)
    q, view, mask = step_inputs(wide, 1, 2, 2, 96, mx.float16)
    assert "head dim 96" in simd.simd_call_support(q, view, mask)
    assert simd.simd_decode_attention(q, view, 0.1, mask, None, "cuda") is None


def test_a_token_not_encoded_yet_is_left_to_its_cache(monkeypatch):
    import mlx_lm_turbo.cache.kv_cache as cache_module

    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: True)
    cache = filled_cache(TurboQuantKVCache("turbo4"), 40, 2, 64, mx.float32)
    q, view, mask = step_inputs(cache, 1, 2, 2, 64, mx.float32)
    assert view.pending is not None
    assert simd.simd_decode_attention(q, view, 0.125, mask, None, "metal") is None


def test_on_apple_gpus_only_on_turns_the_simple_kernels_on(monkeypatch):
    """On Metal the kernels have never run: ``auto`` keeps the portable path, ``on``
    sends decode attention to the simple kernels, and neither the fast CUDA kernel
    nor the encode kernels are asked for."""
    from mlx_lm_turbo.kernels import decode_attention, encode
    from mlx_lm_turbo.tools import doctor

    for module in (dispatch, decode_attention, encode):
        monkeypatch.setattr(module, "gpu_backend", lambda: "metal")
    calls = []
    monkeypatch.setattr(
        decode_attention,
        "simd_launch",
        lambda q, kv, scale, mask, sinks, backend: calls.append(backend) or q,
    )
    cache = filled_cache(TurboQuantKVCache("turbo4"), 64, 2, 64, mx.float16)
    q, view, mask = step_inputs(cache, 1, 2, 2, 64, mx.float16)
    monkeypatch.setenv(KERNEL_ENV, "auto")
    assert "=on enables it" in dispatch.layer_support(64, 64)
    assert "=on enables it" in doctor._kernel_status()
    assert decode_attention.fused_decode_attention(q, view, 0.125, mask) is None
    monkeypatch.setenv(KERNEL_ENV, "on")
    assert dispatch.layer_support(64, 64) is None
    assert "UNVERIFIED on Apple GPUs" in doctor._kernel_status()
    assert decode_attention.fused_decode_attention(q, view, 0.125, mask) is q
    assert calls == ["metal"]
    assert not decode_attention.raw_tail_support(cache.codec)
    assert encode.fused_encode(cache.codec, q, q) is None
    assert "head dim 96" in dispatch.layer_support(96, 96)


def recent_tokens(recent):
    """A cache's options for ``recent`` exact recent tokens (None: the default)."""
    return {} if recent is None else {"recent_exact": recent}


# -- the kernels: a GPU's build of the shared bodies, or both builds on the CPU -----
def check(monkeypatch, q, view, mask, sinks=None):
    """This backend's build against the portable path (as tests/test_kernels.py's
    check)."""
    scale = q.shape[-1] ** -0.5
    portable = turbo_scaled_dot_product_attention(q, view, scale, mask, sinks)
    backend = dispatch.gpu_backend()  # on an Apple GPU, the Metal build
    out = simd.simd_decode_attention(q, view, scale, mask, sinks, backend)
    assert out is not None, "the kernels declined a case they cover"
    mx.eval(portable, out)
    assert out.shape == portable.shape and out.dtype == portable.dtype
    assert_as_portable(monkeypatch, out, portable, q, view, mask, sinks)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize(  # on the CPU each width in one build, the builds in turn
    "scheme, gpu_kernels",
    latin_cases(WIDTHS, ["cuda", "metal"]),
    indirect=["gpu_kernels"],
)
def test_every_width_matches_the_portable_path(monkeypatch, scheme):
    cache = filled_cache(TurboQuantKVCache(scheme), 1000, 8, 128, mx.float16)
    q, view, mask = step_inputs(cache, 1, 8, 4, 128, mx.float16)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize(
    "scheme, dtype, D",
    latin_cases(
        ["turbo4", "turbo3", "turbo0v3"],
        [mx.float16, mx.bfloat16, mx.float32],
        [64, 128, 256],
    ),
)
def test_head_dims_and_dtypes(monkeypatch, scheme, dtype, D):
    cache = filled_cache(TurboQuantKVCache(scheme), 777, 2, D, dtype)
    q, view, mask = step_inputs(cache, 1, 2, 4, D, dtype)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize("G, L", latin_cases([1, 3, 5, 8], [1, 2, 8]))
def test_gqa_ratios_and_verify_steps(monkeypatch, G, L):
    cache = filled_cache(
        TurboQuantKVCache("turbo4"), 3000, 4, 128, mx.float16, chunk=1024
    )
    q, view, mask = step_inputs(cache, L, 4, G, 128, mx.float16)
    check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize("calibration", ["none", "center", "center+scale"])
@pytest.mark.parametrize("L", [1, 3])
def test_key_calibrations_and_attention_sinks(monkeypatch, calibration, L):
    cache = filled_cache(
        TurboQuantKVCache("turbo4", key_calibration=calibration),
        900,
        4,
        64,
        mx.bfloat16,
    )
    q, view, mask = step_inputs(cache, L, 4, 2, 64, mx.bfloat16)
    check(monkeypatch, q, view, mask)
    sinks = 3 * mx.random.normal((8,), key=mx.random.key(3))  # GPT-OSS's
    check(monkeypatch, q, view, mask, sinks)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize("scheme", ["turbo4", "turbo0v4"])
@pytest.mark.parametrize("max_size, recent", [(512, None), (64, None), (64, 32)])
def test_sliding_windows(monkeypatch, scheme, max_size, recent):
    # (64, None) from 70 tokens: a young window's first tokens read exactly in the ring
    cache = filled_cache(
        TurboQuantRotatingKVCache(scheme, max_size=max_size, **recent_tokens(recent)),
        1500 if max_size == 512 else 70,
        2,
        128,
        mx.float16,
        chunk=500,
    )
    for step in range(3):  # the ring wraps
        mask = cache.make_mask(1, window_size=max_size)
        q, view, _ = step_inputs(cache, 1, 2, 4, 128, mx.float16, seed=10 + step)
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize("scheme", ["turbo3", "turbo0v4"])
@pytest.mark.parametrize("recent", [None, 32])
@pytest.mark.parametrize("additive", [False, True])
def test_batch_rows_of_different_lengths(monkeypatch, scheme, recent, additive):
    singles = [
        filled_cache(
            TurboQuantKVCache(scheme, **recent_tokens(recent)),
            n,
            4,
            128,
            mx.float16,
            seed=n,
        )
        for n in (700, 20, 1300)
    ]
    batch = TurboQuantKVCache.merge(singles)
    for step in range(2):
        k = mx.random.normal((3, 4, 1, 128), key=mx.random.key(step)).astype(mx.float16)
        q = mx.random.normal((3, 16, 1, 128), key=mx.random.key(step + 5)).astype(
            mx.float16
        )
        mask = batch.make_mask(1, return_array=True)
        if additive:
            mask = mx.where(mask, 0.0, -mx.inf).astype(mx.float16)
        view, _ = batch.update_and_fetch(k, k)
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize("L", [1, 2, 8])
def test_recent_tokens_read_exactly_in_the_tail(monkeypatch, L):
    cache = filled_cache(
        TurboQuantKVCache("turbo4", recent_exact=32), 700, 2, 128, mx.float16, chunk=300
    )
    for step in range(2):
        q, view, mask = step_inputs(cache, L, 2, 4, 128, mx.float16, seed=30 + step)
        cache.settle(view)  # on MLX-CUDA a decode token waits for the fast kernel
        assert view.window == 32 and view.new_keys.shape[2] == 31 + L
        check(monkeypatch, q, view, mask)


@pytest.mark.usefixtures("gpu_kernels")
@pytest.mark.parametrize(  # ten seconds a build on the CPU: CUDA's there
    "gpu_kernels",
    ["cuda", pytest.param("metal", marks=pytest.mark.gpu_matrix)],
    indirect=True,
)
def test_decode_after_a_long_context_covers_every_slice(monkeypatch):
    # 16000 tokens (8 KV heads, a row group each) take every slice the merge keeps
    # beside the exact part, each simd-group reading more than one tile of its slice.
    cache = filled_cache(
        TurboQuantKVCache("turbo4"), 16000, 8, 128, mx.float16, chunk=8192
    )
    q, view, mask = step_inputs(cache, 1, 8, 4, 128, mx.float16)
    n_tokens, groups = view.stored[-1].shape[2], 8
    has_exact = view.new_keys is not None or view.sinks is not None
    assert n_tokens >= simd.MIN_SLICE_TOKENS * simd.MAX_PARTS
    assert math.ceil(simd.TARGET_THREADGROUPS / groups) >= simd.MAX_PARTS
    slices = simd.MAX_PARTS - has_exact
    assert math.ceil(n_tokens / slices) > simd.THREADS
    check(monkeypatch, q, view, mask)


# -- the run-time check an Apple GPU makes before =on uses the kernel -----------------
def test_the_run_time_check_refuses_a_kernel_that_fails_or_differs(monkeypatch):
    from mlx_lm_turbo.cache import kernel_check

    def kernel(answer):
        def stand_in(queries, view, scale, mask, sinks, backend):
            return answer(kernel_check.blockwise_attention(queries, view, scale, mask))

        return stand_in

    def broken(out):
        raise RuntimeError("program_source:12:5: error: use of undeclared identifier")

    for answer, reason in [
        (lambda out: out, None),
        (lambda out: out * 1.01, "differs from the portable path's by "),
        (broken, "failed to build or run (turbo4): program_source:12:5: error"),
        (lambda out: None, "declined a decode step it covers (turbo4)"),
    ]:
        monkeypatch.setattr(kernel_check, "simd_decode_attention", kernel(answer))
        found = kernel_check.check_decode_kernel("metal")
        assert found == reason or (reason and reason in found), (found, reason)


def test_the_run_time_check_encodes_a_token_left_for_the_fast_kernel(monkeypatch):
    # As on MLX-CUDA, whose caches leave a decode token to the fast kernel to encode;
    # the stand-in declines such a view, as the simple kernel does.
    import mlx_lm_turbo.cache.kv_cache as cache_module
    from mlx_lm_turbo.cache import kernel_check

    def stand_in(queries, view, scale, mask, sinks, backend):
        if view.pending is not None:
            return None
        return kernel_check.blockwise_attention(queries, view, scale, mask)

    monkeypatch.setattr(cache_module, "raw_tail_support", lambda codec: True)
    monkeypatch.setattr(kernel_check, "simd_decode_attention", stand_in)
    assert kernel_check.check_decode_kernel("cuda") is None


@pytest.mark.usefixtures("gpu_kernels")
def test_the_run_time_check_passes_this_gpus_build():
    from mlx_lm_turbo.cache.kernel_check import check_decode_kernel

    assert check_decode_kernel(dispatch.gpu_backend()) is None
