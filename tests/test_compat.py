"""Outside the tested mlx-lm range the plugin patches nothing; inside it, wrappers pass
every argument through; the range is written in one place."""

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import mlx_lm_turbo.compat as compat
from mlx_lm_turbo.attach import attach
from mlx_lm_turbo.attach.attention import install_attention_dispatch
from mlx_lm_turbo.attach.files import register_cache_classes

ROOT = Path(__file__).resolve().parent.parent

# Runs in a fresh interpreter (the start-up hook installed by the .pth file): mlx-lm
# reports the given version, then each module the hook attaches to is imported.
PROBE = """
import sys, types
fake = types.ModuleType("mlx_lm._version")
fake.__version__ = {version!r}
sys.modules["mlx_lm._version"] = fake
sys.argv = ["mlx_lm.generate", *{argv!r}]
import mlx_lm.models.cache as cache, mlx_lm.perplexity as perplexity
generate = sys.modules["mlx_lm.generate"]
wrapped = [f.__qualname__ for f in (cache.make_prompt_cache, cache.load_prompt_cache, generate.main,
           perplexity.eval_ppl, perplexity.main) if hasattr(f, "__wrapped__")]
print("wrapped:", wrapped)
if {run_main!r}:
    generate.main()
"""


def probe(version, *argv, run_main=False, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LM_TURBO")}
    full_env.update(env or {})
    code = PROBE.format(version=version, argv=[str(a) for a in argv], run_main=run_main)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


@pytest.mark.slow  # a subprocess
def test_outside_the_tested_range_nothing_is_patched_and_nothing_said():
    result = probe("0.33.0")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrapped: []" in result.stdout
    assert result.stderr == ""
    inside = probe("0.32.2")
    assert (
        "wrapped: ['make_prompt_cache', 'load_prompt_cache', 'main', 'eval_ppl', 'main']"
        in inside.stdout
    )


@pytest.mark.slow  # a subprocess
def test_outside_the_range_a_requested_scheme_gets_one_notice(tiny_model):
    path = tiny_model("llama")
    result = probe(
        "0.33.1",
        "--model",
        path,
        "--prompt",
        "hi",
        "--max-tokens",
        2,
        "--kv-scheme",
        "turbo4",
        run_main=True,
    )
    # mlx-lm's own parser does not know the option: its usage error, after our notice
    assert (
        result.returncode == 2
        and "unrecognized arguments: --kv-scheme turbo4" in result.stderr
    )
    notice = (
        "mlx-lm-turbo is inactive, --kv-scheme is not applied: mlx-lm-turbo is tested with mlx-lm "
        ">=0.32.2,<0.33, but mlx-lm 0.33.1 is installed."
    )
    assert result.stderr.count(notice) == 1, result.stderr
    by_env = probe(
        "0.31.0",
        "--model",
        path,
        "--prompt",
        "hi",
        "--max-tokens",
        2,
        run_main=True,
        env={"MLX_LM_TURBO_KV_SCHEME": "turbo4"},
    )
    assert by_env.returncode == 0, by_env.stderr[-2000:]
    assert (
        by_env.stderr.count("mlx-lm-turbo is inactive, --kv-scheme is not applied") == 1
    )
    assert "[mlx-lm-turbo]" not in by_env.stderr  # nothing compressed


def test_the_python_api_refuses_outside_the_range(monkeypatch):
    monkeypatch.setattr(compat, "installed_mlx_lm_version", lambda: "0.33.0")
    with pytest.raises(
        RuntimeError,
        match=r"tested with mlx-lm >=0.32.2,<0.33, but mlx-lm 0.33.0 is installed",
    ):
        install_attention_dispatch()
    with pytest.raises(RuntimeError, match="0.33.0"):
        register_cache_classes()


API_WITHOUT_HOOK = """
import mlx.core as mx
from mlx_lm.models import base
import mlx_lm_turbo
cache = mlx_lm_turbo.TurboQuantKVCache("turbo4")
x = mx.random.normal((1, 2, 40, 64)).astype(mx.float16)
keys, values = cache.update_and_fetch(x, x)
q = mx.random.normal((1, 4, 40, 64)).astype(mx.float16)
out = base.scaled_dot_product_attention(q, keys, values, cache=cache, scale=0.125, mask="causal")
print(out.shape)
"""


@pytest.mark.slow  # a subprocess
def test_python_api_caches_route_attention_without_the_start_up_hook():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LM_TURBO")}
    env["MLX_LM_TURBO_DISABLE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", API_WITHOUT_HOOK],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "(1, 4, 40, 64)"


def test_wrappers_pass_every_argument_through(tmp_path):
    """An mlx-lm that adds an argument keeps working with the plugin installed."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, save_prompt_cache

    saved = str(tmp_path / "cache.safetensors")  # a real file: loading checks it first
    kv = KVCache()
    kv.update_and_fetch(mx.zeros((1, 1, 2, 4)), mx.zeros((1, 1, 2, 4)))
    save_prompt_cache(saved, [kv])
    cache_module = types.ModuleType("mlx_lm.models.cache")
    cache_module.make_prompt_cache = (
        lambda model, max_kv_size=None, *, new_option=None: (
            model,
            max_kv_size,
            new_option,
        )
    )
    cache_module.load_prompt_cache = (
        lambda path, return_metadata=False, *, new_option=None: (path, new_option)
    )
    cache_module.save_prompt_cache = (
        lambda path, cache, metadata={}, *, new_option=None: (path, new_option)
    )
    command = types.ModuleType("mlx_lm.generate")
    command.main = lambda *args, **kwargs: (args, kwargs)
    attach(cache_module)
    attach(command)
    assert cache_module.make_prompt_cache("m", 8, new_option=1) == ("m", 8, 1)
    assert cache_module.load_prompt_cache(saved, new_option=2) == (saved, 2)
    assert cache_module.save_prompt_cache("f", [], new_option=4) == ("f", 4)
    assert command.main(["--x"], new_option=3) == ((["--x"],), {"new_option": 3})


def test_the_range_lives_in_compat_and_pyproject_repeats_it():
    pyproject = (ROOT / "pyproject.toml").read_text()
    requirements = re.findall(r'"mlx-lm(?:\[\w+\])?([<>=][^";]*)"', pyproject)
    assert requirements and set(requirements) == {compat.MLX_LM_RANGE}
    assert compat.LOWEST == (0, 32, 2) and compat.FIRST_UNTESTED == (0, 33, 0)
    sources = [
        p for p in (ROOT / "mlx_lm_turbo").rglob("*.py") if p.name != "compat.py"
    ]
    assert not [p.name for p in sources if re.search(r"0\.3[23]", p.read_text())]
