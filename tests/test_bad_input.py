"""Bad input gets a clear error at the right moment (issue 12): usage errors exit 2 with a
message, never a traceback, a server that cannot serve, or silent garbage.

Commands run in-process (their ``main`` with ``sys.argv`` patched) where a subprocess
would behave the same; the server and the start-up hook need subprocesses.
"""

import sys

import pytest
from mlx_lm.utils import _get_classes

import mlx_lm_turbo.settings as settings
import tiny_models
from mlx_lm_turbo import parse_scheme
from mlx_lm_turbo.errors import UsageError
from test_cli import _free_port, run

LLAMA_HD16 = dict(tiny_models.CONFIGS["llama"], hidden_size=64, num_attention_heads=4, head_dim=16)
GEMMA2 = dict(model_type="gemma2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
              num_attention_heads=2, head_dim=32, rms_norm_eps=1e-6, vocab_size=tiny_models.VOCAB,
              num_key_value_heads=1)


def model_from_config(config):
    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict({"vocab_size": tiny_models.VOCAB, **config}))


def run_main(monkeypatch, module_name, *args):
    """A command's (plugin-wrapped) main in this process: (exit status, stderr)."""
    import importlib

    main = importlib.import_module(module_name).main if module_name.startswith("mlx_lm_turbo") \
        else sys.modules[module_name].main
    monkeypatch.setattr(sys, "argv", [module_name, *map(str, args)])
    try:
        status = main()
    except SystemExit as exit:
        status = exit.code
    return status or 0


@pytest.fixture
def overrides(tmp_path, monkeypatch):
    """overrides(text) -> path of an overrides file in force for this test."""
    from mlx_lm_turbo.registry import registry

    path = tmp_path / "overrides.toml"
    monkeypatch.setenv("MLX_LM_TURBO_OVERRIDES", str(path))
    registry.cache_clear()

    def write(text):
        path.write_text(text)
        registry.cache_clear()
        return path

    yield write
    registry.cache_clear()


# -- the server checks everything it can before serving ------------------------

@pytest.mark.parametrize("toml, message", [
    ('[[override]]\nmodel_type = "llama"\nopt_out = true\n', "turned off for model type 'llama'"),
    ('[[override]]\nmodel_type = "llama"\nscheme = "turbo9"\n', "Did you mean turbo8?"),
])
def test_server_refuses_before_serving(tiny_model, tmp_path, toml, message):
    path = tmp_path / "overrides.toml"
    path.write_text(toml)
    result = run("mlx_lm.server", "--model", tiny_model("llama"), "--port", _free_port(), "--kv-scheme", "turbo4",
                 env={"MLX_LM_TURBO_OVERRIDES": str(path)}, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr and "Starting httpd" not in result.stderr


@pytest.mark.parametrize("config, message", [
    (GEMMA2, "does not support model type 'gemma2'"),
    (LLAMA_HD16, "no codebook for head_dim=16"),
])
def test_start_up_check_traces_what_a_request_would_meet(config, message):
    from mlx_lm_turbo.preflight import check_model

    active = settings.Settings(parse_scheme("turbo4"))
    with pytest.raises(UsageError, match=message):
        check_model(model_from_config(config), active)
    check_model(model_from_config(dict(LLAMA_HD16, head_dim=32, hidden_size=128)), active)  # fine


def test_server_check_names_a_model_it_cannot_load(tmp_path):
    from types import SimpleNamespace

    from mlx_lm_turbo.preflight import check_server

    args = SimpleNamespace(model=str(tmp_path / "missing"), draft_model=None, trust_remote_code=False)
    with pytest.raises(UsageError, match="Cannot load model .*missing"):
        check_server(args, settings.Settings(parse_scheme("turbo4")))


def test_head_dim_without_codebook_is_a_usage_error(tiny_model, monkeypatch, capsys):
    monkeypatch.setitem(tiny_models.CONFIGS, "llama_hd16", LLAMA_HD16)
    status = run_main(monkeypatch, "mlx_lm.generate", "--model", tiny_model("llama_hd16"), "--prompt", "hi",
                      "--max-tokens", 2, "--kv-scheme", "turbo4")
    assert status == 2 and "no codebook for head_dim=16" in capsys.readouterr().err
