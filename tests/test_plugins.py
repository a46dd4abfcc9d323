"""Third-party plugins through the entry-point group, overrides from every source, doctor."""

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import run
from mlx_lm import load

import mlx_lm_turbo
import mlx_lm_turbo.plugin.manager as plugins
import mlx_lm_turbo.plugin.registry as registry_module
from mlx_lm_turbo import (
    Adapter,
    AdapterPlugin,
    Capabilities,
    OverrideRegistry,
    UnsupportedModelError,
    hookimpl,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "turbo-plugin-example"


@pytest.fixture(scope="module")
def example_plugin_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(EXAMPLE),
        ],
        check=True,
        capture_output=True,
    )
    return site


def with_path(site):
    return {
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    }


@pytest.mark.slow  # pip install and subprocesses
def test_example_plugin_override_takes_effect(example_plugin_site, tiny_model):
    path = tiny_model("qwen3")
    result = run(
        "mlx_lm.generate",
        "--model",
        path,
        "--prompt",
        "hi",
        "--max-tokens",
        4,
        "--kv-scheme",
        "turbo3",
        env=with_path(example_plugin_site),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "KV caches 2 x turbo8, 4 x turbo8v4" in result.stderr
    doctor = run(
        "mlx-lm-turbo",
        "doctor",
        "--model",
        path,
        "--kv-scheme",
        "turbo3",
        env=with_path(example_plugin_site),
    )
    assert "overrides applied: turbo-plugin-example" in doctor.stdout
    assert "| qwen3_override |" not in doctor.stdout  # it provides no adapter
    # other families are untouched
    result = run(
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--max-tokens",
        4,
        "--kv-scheme",
        "turbo3",
        env=with_path(example_plugin_site),
    )
    assert "KV caches 6 x turbo3" in result.stderr


@pytest.mark.slow  # a subprocess
def test_broken_plugin_warns_by_name_and_mlx_lm_still_works(tmp_path, tiny_model):
    dist = tmp_path / "broken_turbo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken-turbo-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[mlx_lm_turbo]\nbroken_family = broken_turbo_plugin\n"
    )
    (tmp_path / "broken_turbo_plugin.py").write_text(
        "raise RuntimeError('this plugin is broken')\n"
    )
    result = run(
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--max-tokens",
        4,
        "--kv-scheme",
        "turbo4",
        env=with_path(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "plugin 'broken_family' (broken_turbo_plugin) failed and is skipped"
        in result.stderr
    )
    assert "this plugin is broken" in result.stderr
    assert "[mlx-lm-turbo] llama: KV caches" in result.stderr


def test_registry_precedence_and_matching():
    registry = OverrideRegistry()
    registry.add(model_type="llama", scheme="turbo4", boundary_skip=1, source="plugin")
    registry.add(
        path="*/Llama-3*",
        scheme="turbo8v4",
        layer_schemes={"0": "turbo8"},
        source="toml",
    )
    assert registry.resolve("llama", "/models/mistral") == {
        "sources": ["plugin"],
        "scheme": "turbo4",
        "boundary_skip": 1,
    }
    merged = registry.resolve("llama", "/models/Llama-3-8B")
    assert (
        merged["scheme"] == "turbo8v4"
        and merged["boundary_skip"] == 1
        and merged["layer_schemes"] == {0: "turbo8"}
    )
    assert registry.resolve("qwen3", None) == {"sources": []}
    with pytest.raises(ValueError, match="Did you mean turbo5v3"):
        registry.add(model_type="x", scheme="turbo5")
    with pytest.raises(ValueError, match="exactly one"):
        registry.add(scheme="turbo4")


def test_python_override_and_per_layer_schemes(tiny_model, monkeypatch):
    from mlx_lm import load

    import mlx_lm_turbo.plugin.prompt_cache as prompt_cache_module
    import mlx_lm_turbo.plugin.registry as registry_module
    from mlx_lm_turbo import make_prompt_cache, register_override

    fresh = OverrideRegistry()  # keep the process-wide registry clean for other tests
    monkeypatch.setattr(registry_module, "registry", lambda: fresh)
    monkeypatch.setattr(prompt_cache_module, "registry", lambda: fresh)
    register_override(model_type="llama", layer_schemes={2: "turbo2"}, boundary_skip=0)
    model, _ = load(str(tiny_model("llama")))
    assert [c.scheme.name for c in make_prompt_cache(model, "turbo4")] == [
        "turbo4",
        "turbo4",
        "turbo2",
        "turbo4",
        "turbo4",
        "turbo4",
    ]


@pytest.mark.slow  # a subprocess
def test_doctor_reports_autoload_adapters_and_refused_modules(tiny_model):
    result = run("mlx-lm-turbo", "doctor")
    assert result.returncode == 0
    assert "auto-loading: active in this process" in result.stdout
    assert (
        "| plugin | adapter | model types | sliding-window layers | notes |"
        in result.stdout
    )
    assert (
        "| mlx_lm_turbo.gpt_oss | gpt_oss | gpt_oss | compressed | learned attention sinks honoured |"
        in result.stdout
    )
    on_cuda = mx.default_device() == mx.gpu and mx.cuda.is_available()
    expected = "available for head dims" if on_cuda else "not here: MLX runs on the CPU"
    assert f"fused kernels: {expected}" in result.stdout
    assert (
        "  plamo2: Attention.__call__ calls mx.fast.scaled_dot_product_attention itself"
        in result.stdout
    )
    result = run("mlx-lm-turbo", "doctor", env={"MLX_LM_TURBO_DISABLE": "1"})
    assert "auto-loading: off" in result.stdout


@pytest.mark.slow  # a subprocess
def test_python_api_example_runs(tiny_model):
    example = Path(__file__).resolve().parent.parent / "examples" / "python_api.py"
    result = subprocess.run(
        [
            sys.executable,
            str(example),
            "--model",
            str(tiny_model("llama")),
            "--max-tokens",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "KV cache:" in result.stdout and "saved" in result.stdout


def install_plugin(site, name, source, attribute=None):
    """A distribution on ``site`` publishing module ``name`` (or its ``attribute``) under the
    mlx_lm_turbo entry points."""
    dist = site / f"{name}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n"
    )
    target = f"{name}:{attribute}" if attribute else name
    (dist / "entry_points.txt").write_text(f"[mlx_lm_turbo]\n{name} = {target}\n")
    (site / f"{name}.py").write_text(source)


@pytest.fixture
def fresh_plugins(tmp_path, monkeypatch):
    """A site directory for test plugins; the plugin manager and registry are rebuilt with it
    and again after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.plugin_manager.cache_clear()
    registry_module.registry.cache_clear()
    yield tmp_path
    plugins.plugin_manager.cache_clear()
    registry_module.registry.cache_clear()


def test_the_example_plugin_through_an_entry_point(fresh_plugins, tiny_model):
    """examples/turbo-plugin-example's module, published under the entry-point group as
    its pyproject.toml publishes it (the slow test above pip-installs it)."""
    dist = fresh_plugins / "turbo_plugin_example-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: turbo-plugin-example\nVersion: 0.1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[mlx_lm_turbo]\nqwen3_override = turbo_plugin_example\n"
    )
    sys.path.insert(0, str(EXAMPLE))
    try:
        qwen3, _ = load(str(tiny_model("qwen3")))
        schemes = [
            c.scheme.name for c in mlx_lm_turbo.make_prompt_cache(qwen3, "turbo3")
        ]
        llama, _ = load(str(tiny_model("llama")))
        plain = [c.scheme.name for c in mlx_lm_turbo.make_prompt_cache(llama, "turbo3")]
    finally:
        sys.path.remove(str(EXAMPLE))
        sys.modules.pop("turbo_plugin_example", None)
    assert schemes == ["turbo8"] + ["turbo8v4"] * 4 + ["turbo8"]
    assert plain == ["turbo3"] * 6  # other families untouched


def test_the_plugin_api_is_exported_from_the_package():
    import mlx_lm_turbo.plugin.adapters as adapters
    import mlx_lm_turbo.plugin.hookspecs as hookspecs

    assert mlx_lm_turbo.hookimpl is hookspecs.hookimpl
    assert (Adapter, AdapterPlugin, Capabilities) == (
        adapters.Adapter,
        adapters.AdapterPlugin,
        adapters.Capabilities,
    )
    assert OverrideRegistry is registry_module.OverrideRegistry
    assert {
        "hookimpl",
        "Adapter",
        "AdapterPlugin",
        "Capabilities",
        "OverrideRegistry",
    } <= set(mlx_lm_turbo.__all__)


def test_an_installed_adapter_takes_over_the_built_in_one(fresh_plugins, tiny_model):
    # Named like the built-in module, as a replacement naturally would be.
    install_plugin(
        fresh_plugins,
        "qwen3_5",
        (
            "from mlx_lm_turbo import Adapter, AdapterPlugin\n"
            "plugin = AdapterPlugin(Adapter(name='my_qwen3_5', model_types=('qwen3_5',)))\n"
        ),
        attribute="plugin",
    )
    model, _ = load(str(tiny_model("qwen3_5")))
    assert plugins.adapter_for(model).name == "my_qwen3_5"
    listed = [(plugin, adapter.name) for plugin, adapter in plugins.all_adapters()]
    assert (
        listed[0] == ("qwen3_5", "my_qwen3_5")
        and ("mlx_lm_turbo.qwen3_5", "qwen3_5") in listed
    )
    llama, _ = load(str(tiny_model("llama")))
    assert plugins.adapter_for(llama).name == "kv_cache"  # other families untouched


class FewerArguments:
    """A valid pluggy implementation declaring only some of the spec's arguments."""

    adapter = Adapter(name="llama_only", model_types=("llama",))

    @hookimpl
    def mlx_lm_turbo_adapter(self, model_type):
        return self.adapter if model_type == "llama" else None


class Wrapper:
    def __init__(self):
        self.seen = []

    @hookimpl(wrapper=True)
    def mlx_lm_turbo_adapter(self, model):
        adapter = yield
        self.seen.append((type(model).__name__, adapter.name))
        return adapter


def test_hooks_are_called_through_pluggy_argument_matching_and_wrappers(
    fresh_plugins, tiny_model
):
    pm = plugins.plugin_manager()
    wrapper = Wrapper()
    pm.register(FewerArguments())
    pm.register(wrapper)
    llama, _ = load(str(tiny_model("llama")))
    qwen3, _ = load(str(tiny_model("qwen3")))
    assert plugins.adapter_for(llama).name == "llama_only"
    assert plugins.adapter_for(qwen3).name == "kv_cache"
    assert wrapper.seen == [("Model", "llama_only"), ("Model", "kv_cache")]


def test_a_broken_plugin_is_skipped_at_registration_with_one_warning(
    fresh_plugins, tiny_model
):
    install_plugin(
        fresh_plugins,
        "fails_to_import",
        "raise RuntimeError('this plugin is broken')\n",
    )
    install_plugin(
        fresh_plugins,
        "unknown_argument",
        (
            "from mlx_lm_turbo import hookimpl\n"
            "@hookimpl\ndef mlx_lm_turbo_adapter(model_type, tokenizer):\n    return None\n"
        ),
    )
    install_plugin(
        fresh_plugins,
        "misspelt_hook",
        (
            "from mlx_lm_turbo import hookimpl\n"
            "@hookimpl\ndef mlx_lm_turbo_adaptr(model_type):\n    return None\n"
        ),
    )
    install_plugin(fresh_plugins, "no_hooks", "plugin = object()\n")
    install_plugin(
        fresh_plugins,
        "working",
        (
            "from mlx_lm_turbo import hookimpl\n"
            "@hookimpl\ndef mlx_lm_turbo_register_overrides(registry):\n"
            "    registry.add(model_type='llama', scheme='turbo8', source='working')\n"
        ),
    )
    with pytest.warns(UserWarning) as warned:
        pm = plugins.plugin_manager()
    messages = sorted(str(w.message) for w in warned)
    assert len(messages) == 4, messages
    for name, why in [
        ("fails_to_import", "this plugin is broken"),
        ("misspelt_hook", "mlx_lm_turbo_adaptr"),
        ("unknown_argument", "tokenizer"),
        ("no_hooks", "implements none of the mlx_lm_turbo hooks"),
    ]:
        assert any(
            f"plugin {name!r} ({name}) failed and is skipped" in m and why in m
            for m in messages
        ), messages
    assert [n for n, _ in pm.list_name_plugin()][-1:] == ["working"]
    assert (
        registry_module.registry().resolve("llama")["scheme"] == "turbo8"
    )  # the working one counts
    llama, _ = load(str(tiny_model("llama")))
    assert plugins.adapter_for(llama).name == "kv_cache"


def test_an_adapter_without_sliding_windows_refuses_them(fresh_plugins, tiny_model):
    no_windows = Adapter(
        name="no_windows",
        model_types=("gpt_oss", "llama"),
        capabilities=Capabilities(supports_sliding_window=False),
    )
    plugins.plugin_manager().register(AdapterPlugin(no_windows))
    gpt_oss, _ = load(str(tiny_model("gpt_oss")))
    with pytest.raises(
        UnsupportedModelError,
        match="'gpt_oss': its layer 0 has a sliding window, which the "
        "no_windows adapter does not handle",
    ):
        mlx_lm_turbo.make_prompt_cache(gpt_oss, "turbo4")
    llama, _ = load(str(tiny_model("llama")))  # no sliding layers: served
    assert all(
        hasattr(c, "codec") for c in mlx_lm_turbo.make_prompt_cache(llama, "turbo4")
    )
