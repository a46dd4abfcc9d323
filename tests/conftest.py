import os
import sys

# MLX-CUDA runs float32 matmuls as TF32 unless told otherwise (ml-explore/mlx#3860: a
# 10-bit mantissa). The float32 tests compare float32 rounding (chunk invariance,
# batches against single sequences): TF32 rounding, which changes with the matmul's
# shape, moves coordinates across codebook boundaries far more often. Ask for float32;
# set before MLX is imported, as MLX reads it once. CPU and Metal ignore it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import subprocess

import helpers
import mlx.core as mx
import pytest
from helpers import ON_CUDA, forget_kernels, relative_error


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, with the reason, where MLX has no CUDA backend (CI);
    those marked ``gpu_matrix`` where it runs on no GPU, unless GPU_ON_CPU_MATRIX=full
    (the kernels' CPU builds then run the whole matrices: about six minutes)."""
    skips = {
        "gpu": None
        if ON_CUDA
        else pytest.mark.skip(reason="needs MLX's CUDA backend (run by hand on a GPU)"),
        "gpu_matrix": None
        if mx.default_device() == mx.gpu
        or os.environ.get("GPU_ON_CPU_MATRIX") == "full"
        else pytest.mark.skip(
            reason="a kernel case for a GPU: the CPU build runs a subset of the matrix"
        ),
    }
    for item in items:
        for marker, skip in skips.items():
            if skip is not None and marker in item.keywords:
                item.add_marker(skip)


# -- the quick loop (pytest -m 'not slow') starts no process -----------------------
_running = {"slow": True}  # the test whose setup, call or teardown runs now


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running["slow"] = item.get_closest_marker("slow") is not None
    yield
    _running["slow"] = True


_popen_init = subprocess.Popen.__init__


def _check_start(program):
    """A test that starts a process (a command, a server, pip, a compiler) must be
    marked ``slow``. Not counted: the kernels' g++ builds for the CPU
    (tests/gpu_on_cpu.py, kept between runs), ``git``, which the tools run
    in-process to record the commit (milliseconds, no model loaded), and
    ``fc-list``, which matplotlib's first import on a machine runs to list its fonts
    (the bench's plots; kept in its cache after)."""
    import gpu_on_cpu

    allowed = (str(gpu_on_cpu.COMPILER), "git", "fc-list")
    if not _running["slow"] and str(program) not in allowed:
        raise AssertionError(
            f"this test starts {program!r}: mark it @pytest.mark.slow (a subprocess)"
        )


def _guarded_popen_init(self, args, *rest, **options):
    _check_start(args if isinstance(args, (str, bytes)) else args[0])
    _popen_init(self, args, *rest, **options)


subprocess.Popen.__init__ = _guarded_popen_init
helpers.START_CHECKS.append(_check_start)  # commands forked by a running process too


@pytest.fixture
def rel_err():
    return relative_error


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    from helpers import write_tiny_gguf

    from mlx_lm_turbo.tools.gguf import convert_gguf

    root = tmp_path_factory.mktemp("tokenizer")
    return convert_gguf(
        write_tiny_gguf(root / "tiny.gguf", layers=1), root / "model", progress=False
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, tiny_tokenizer_dir):
    """tiny_model(name) -> path of a tiny random-weight model directory of that architecture."""
    from tiny_models import build_model_dir

    root = tmp_path_factory.mktemp("models")
    return lambda name: build_model_dir(name, root, tiny_tokenizer_dir)


def _kernels_on_cpu(monkeypatch, backend):
    """Our kernels for ``backend`` ("cuda" or "metal") built by g++ and run on the CPU
    for this test (``gpu_on_cpu.py``), as MLX would run them: what they compute, not
    how fast."""
    import gpu_on_cpu

    if sys.platform != "linux" or gpu_on_cpu.COMPILER is None:
        pytest.skip("needs a GPU, or Linux and g++ to run the kernels on the CPU")
    from mlx_lm_turbo.cache import attention
    from mlx_lm_turbo.kernels import (
        decode_attention,
        dispatch,
        encode,
        prefill_attention,
    )

    forget_kernels()
    monkeypatch.setattr(mx.fast, "cuda_kernel", gpu_on_cpu.cuda_kernel)
    monkeypatch.setattr(mx.fast, "metal_kernel", gpu_on_cpu.metal_kernel)
    for module in (attention, decode_attention, encode, dispatch, prefill_attention):
        monkeypatch.setattr(module, "gpu_backend", lambda: backend)
    yield
    forget_kernels()


@pytest.fixture
def cuda_kernels(monkeypatch):
    """The CUDA kernels serve attention: on MLX-CUDA's GPU, else on the CPU."""
    if ON_CUDA:
        yield
    else:
        yield from _kernels_on_cpu(monkeypatch, "cuda")


@pytest.fixture(params=["cuda", "metal"])
def gpu_kernels(request, monkeypatch):
    """The shared SIMD kernels' build for each backend: on a GPU its own build (CUDA or
    Metal; the other skips), else both builds on the CPU."""
    if mx.default_device() == mx.gpu:
        from mlx_lm_turbo.kernels.dispatch import gpu_backend

        if gpu_backend() != request.param:
            pytest.skip(f"this GPU runs its own build, not {request.param}'s")
        yield
    else:
        yield from _kernels_on_cpu(monkeypatch, request.param)
