"""Third-party plugins through the entry-point group, overrides from every source, doctor."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_lm_turbo.registry import OverrideRegistry
from test_cli import run

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "turbo-plugin-example"


@pytest.fixture(scope="module")
def example_plugin_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(EXAMPLE)], check=True, capture_output=True)
    return site


def with_path(site):
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_example_plugin_override_takes_effect(example_plugin_site, tiny_model):
    path = tiny_model("qwen3")
    result = run("mlx_lm.generate", "--model", path, "--prompt", "hi", "--max-tokens", 4, "--kv-scheme", "turbo3",
                 env=with_path(example_plugin_site))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "KV caches 2 x turbo8, 4 x turbo8v4" in result.stderr
    doctor = run("mlx-lm-turbo", "doctor", "--model", path, "--kv-scheme", "turbo3", env=with_path(example_plugin_site))
    assert "overrides applied: turbo-plugin-example" in doctor.stdout
    assert "| qwen3_override |" not in doctor.stdout  # it provides no adapter
    # other families are untouched
    result = run("mlx_lm.generate", "--model", tiny_model("llama"), "--prompt", "hi", "--max-tokens", 4,
                 "--kv-scheme", "turbo3", env=with_path(example_plugin_site))
    assert "4 x turbo8, 2 x turbo3" in result.stderr


def test_broken_plugin_warns_by_name_and_mlx_lm_still_works(tmp_path, tiny_model):
    dist = tmp_path / "broken_turbo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-turbo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mlx_lm_turbo]\nbroken_family = broken_turbo_plugin\n")
    (tmp_path / "broken_turbo_plugin.py").write_text("raise RuntimeError('this plugin is broken')\n")
    result = run("mlx_lm.generate", "--model", tiny_model("llama"), "--prompt", "hi", "--max-tokens", 4,
                 "--kv-scheme", "turbo4", env=with_path(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "plugin 'broken_family (broken_turbo_plugin)' failed and is skipped" in result.stderr
    assert "this plugin is broken" in result.stderr
    assert "[mlx-lm-turbo] llama: KV caches" in result.stderr


def test_registry_precedence_and_matching():
    registry = OverrideRegistry()
    registry.add(model_type="llama", scheme="turbo4", boundary_skip=1, source="plugin")
    registry.add(path="*/Llama-3*", scheme="turbo8v4", layer_schemes={"0": "turbo8"}, source="toml")
    assert registry.resolve("llama", "/models/mistral") == {"sources": ["plugin"], "scheme": "turbo4", "boundary_skip": 1}
    merged = registry.resolve("llama", "/models/Llama-3-8B")
    assert merged["scheme"] == "turbo8v4" and merged["boundary_skip"] == 1 and merged["layer_schemes"] == {0: "turbo8"}
    assert registry.resolve("qwen3", None) == {"sources": []}
    with pytest.raises(ValueError, match="Did you mean turbo4"):
        registry.add(model_type="x", scheme="turbo5")
    with pytest.raises(ValueError, match="exactly one"):
        registry.add(scheme="turbo4")


def test_python_override_and_per_layer_schemes(tiny_model, monkeypatch):
    from mlx_lm import load

    import mlx_lm_turbo.registry as registry_module
    from mlx_lm_turbo import make_prompt_cache, register_override

    import mlx_lm_turbo.prompt_cache as prompt_cache_module

    fresh = OverrideRegistry()  # keep the process-wide registry clean for other tests
    monkeypatch.setattr(registry_module, "registry", lambda: fresh)
    monkeypatch.setattr(prompt_cache_module, "registry", lambda: fresh)
    register_override(model_type="llama", layer_schemes={2: "turbo2"}, boundary_skip=0)
    model, _ = load(str(tiny_model("llama")))
    assert [c.scheme.name for c in make_prompt_cache(model, "turbo4")] == ["turbo4", "turbo4", "turbo2", "turbo4", "turbo4", "turbo4"]


def test_doctor_reports_autoload_and_unsupported(tiny_model):
    result = run("mlx-lm-turbo", "doctor")
    assert result.returncode == 0
    assert "auto-loading: active in this process" in result.stdout
    assert "| gpt_oss | gpt_oss | gpt_oss | yes | yes | yes |" in result.stdout
    result = run("mlx-lm-turbo", "doctor", env={"MLX_LM_TURBO_DISABLE": "1"})
    assert "auto-loading: off" in result.stdout


def test_python_api_example_runs(tiny_model):
    example = Path(__file__).resolve().parent.parent / "examples" / "python_api.py"
    result = subprocess.run([sys.executable, str(example), "--model", str(tiny_model("llama")), "--max-tokens", "5"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "KV cache:" in result.stdout and "saved" in result.stdout
