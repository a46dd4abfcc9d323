"""mlx-lm's own console scripts with the plugin auto-loaded (subprocesses)."""

import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from helpers import BIN, free_port, run
from mlx_lm import load, stream_generate
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache
from tiny_models import ARCHITECTURES

from mlx_lm_turbo import make_prompt_cache

pytestmark = pytest.mark.slow  # subprocesses: the quick loop is pytest -m 'not slow'

SCHEMES = ("turbo4", "turbo3", "turbo4v2", "turbo0v4")


def model_type(path):
    import json

    return json.loads((Path(path) / "config.json").read_text())["model_type"]


# Each architecture through the command with one of the schemes in turn (a subprocess
# each); tests/test_architectures.py runs every architecture with the other widths.
@pytest.mark.parametrize(
    "arch, scheme",
    [(arch, SCHEMES[i % len(SCHEMES)]) for i, arch in enumerate(ARCHITECTURES)],
)
def test_generate_every_architecture(arch, scheme, tiny_model):
    path = tiny_model(arch)
    result = run(
        "mlx_lm.generate",
        "--model",
        path,
        "--prompt",
        "hello there",
        "--max-tokens",
        6,
        "--kv-scheme",
        scheme,
        "--turbo-boundary-skip",
        1,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"[mlx-lm-turbo] {model_type(path)}: KV caches" in result.stderr
    assert "Generation: " in result.stdout


def test_mlx_lm_subcommand_form_and_env_default(tiny_model):
    result = run(
        "mlx_lm",
        "generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--max-tokens",
        4,
        env={"MLX_LM_TURBO_KV_SCHEME": "turbo3"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # the defaults: no boundary layers, a window of 16
    assert "KV caches 6 x turbo3" in result.stderr
    assert "each query also reads the 15 tokens before it exactly" in result.stderr


@pytest.mark.parametrize(
    "command", ["generate", "chat", "cache_prompt", "server", "benchmark", "perplexity"]
)
def test_help_shows_the_options(command):
    result = run(f"mlx_lm.{command}", "--help")
    assert result.returncode == 0
    for option in (
        "--kv-scheme",
        "--turbo-boundary-skip",
        "--turbo-uncompressed-start",
    ):
        assert option in result.stdout


def test_bad_scheme_is_a_usage_error(tiny_model):
    result = run(
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--kv-scheme",
        "turbo5",
    )
    assert result.returncode == 2
    assert "Unknown KV scheme 'turbo5'. Did you mean turbo5v3?" in result.stderr
    assert "Traceback" not in result.stderr


def test_kv_bits_conflict_is_a_usage_error(tiny_model):
    result = run(
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--kv-scheme",
        "turbo4",
        "--kv-bits",
        4,
    )
    assert (
        result.returncode == 2
        and "--kv-scheme turbo4 and --kv-bits both" in result.stderr
    )


def generate_with_overrides(tiny_model, overrides, toml):
    overrides.write_text(toml)
    return run(
        "mlx_lm.generate",
        "--model",
        tiny_model("llama"),
        "--prompt",
        "hi",
        "--kv-scheme",
        "turbo4",
        env={"MLX_LM_TURBO_OVERRIDES": str(overrides)},
    )


def test_opted_out_model_is_refused_clearly(tiny_model, tmp_path):
    result = generate_with_overrides(
        tiny_model,
        tmp_path / "overrides.toml",
        '[[override]]\nmodel_type = "llama"\nopt_out = true\n',
    )
    assert result.returncode == 2
    assert "turned off for model type 'llama' by an override" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_overrides_file_is_reported_not_a_traceback(tiny_model, tmp_path):
    overrides = tmp_path / "overrides.toml"
    result = generate_with_overrides(
        tiny_model, overrides, '[[override]]\nmodel_type = "llama"\nscheme = "turbo9"\n'
    )
    assert result.returncode == 2
    assert (
        f"Bad entry 0 in {overrides}" in result.stderr
        and "Did you mean turbo8" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_chat_with_scripted_input(tiny_model):
    result = run(
        "mlx_lm.chat",
        "--model",
        tiny_model("qwen3"),
        "--max-tokens",
        5,
        "--kv-scheme",
        "turbo4",
        stdin="hello\nr\nagain\nq\n",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[mlx-lm-turbo] qwen3: KV caches" in result.stderr


def test_benchmark(tiny_model):
    result = run(
        "mlx_lm.benchmark",
        "--model",
        tiny_model("llama"),
        "-p",
        32,
        "-g",
        8,
        "-n",
        1,
        "--kv-scheme",
        "turbo4",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[mlx-lm-turbo] llama: KV caches" in result.stderr


def test_cache_prompt_file_is_small_and_generate_continues_from_it(
    tiny_model, tmp_path
):
    path = tiny_model("llama")
    prompt = " ".join(["hello there"] * 50)  # 400 tokens
    files = {}
    for scheme in ("turbo4", "none"):
        files[scheme] = tmp_path / f"{scheme}.safetensors"
        result = run(
            "mlx_lm.cache_prompt",
            "--model",
            path,
            "--prompt",
            prompt,
            "--prompt-cache-file",
            files[scheme],
            "--kv-scheme",
            scheme,
            "--turbo-boundary-skip",
            0,
        )
        assert result.returncode == 0, result.stderr[-2000:]
    assert files["turbo4"].stat().st_size <= 0.3 * files["none"].stat().st_size
    # generate needs no --kv-scheme to read a turbo file
    result = run(
        "mlx_lm.generate",
        "--model",
        path,
        "--prompt-cache-file",
        files["turbo4"],
        "--prompt",
        "and",
        "--max-tokens",
        5,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_saved_cache_continues_exactly_like_the_one_in_memory(tiny_model, tmp_path):
    model, tokenizer = load(str(tiny_model("llama")))
    cache = make_prompt_cache(model, "turbo4", boundary_skip=0)
    prompt = tokenizer.encode(" ".join(["hello there"] * 40))  # 320 tokens
    for _ in stream_generate(
        model, tokenizer, prompt, max_tokens=1, prompt_cache=cache
    ):
        pass
    save_prompt_cache(str(tmp_path / "c.safetensors"), cache)

    def continuation(c):
        return [
            r.token
            for r in stream_generate(
                model, tokenizer, tokenizer.encode(" and"), max_tokens=8, prompt_cache=c
            )
        ]

    assert continuation(copy.deepcopy(cache)) == continuation(
        load_prompt_cache(str(tmp_path / "c.safetensors"))
    )


def _mask_timings(text):
    # Speeds vary run to run, and so does their padding (cache_prompt pads the speed
    # to six places and each progress line to the longest so far): mask both.
    text = re.sub(r" *[0-9.]+ (tokens-per-sec|GB|tok/s)", " N", text)
    return re.sub(r" +(?=[\r\n]|$)", "", text)


@pytest.mark.parametrize(
    "command, args, stdin",
    [
        ("mlx_lm.generate", ("--prompt", "hello", "--max-tokens", 8), None),
        ("mlx_lm.chat", ("--max-tokens", 6), "hello\nq\n"),
        (
            "mlx_lm.cache_prompt",
            ("--prompt", "hello there", "--prompt-cache-file", "{tmp}/c.safetensors"),
            None,
        ),
    ],
)
@pytest.mark.parametrize("arch", ["llama", "gpt_oss"])
def test_without_kv_scheme_output_is_identical_to_plain_mlx_lm(
    arch, command, args, stdin, tiny_model, tmp_path
):
    args = [str(a).format(tmp=tmp_path) for a in args]
    with_plugin = run(command, "--model", tiny_model(arch), *args, stdin=stdin)
    without = run(
        command,
        "--model",
        tiny_model(arch),
        *args,
        stdin=stdin,
        env={"MLX_LM_TURBO_DISABLE": "1"},
    )
    assert with_plugin.returncode == without.returncode == 0, with_plugin.stderr[-2000:]
    assert _mask_timings(with_plugin.stdout) == _mask_timings(without.stdout)
    assert _mask_timings(with_plugin.stderr) == _mask_timings(without.stderr)


def test_disabled_plugin_adds_no_options():
    disabled_help = run("mlx_lm.generate", "--help", env={"MLX_LM_TURBO_DISABLE": "1"})
    assert disabled_help.returncode == 0 and "--kv-scheme" not in disabled_help.stdout


def test_perplexity_runs_through_the_compressed_cache(tiny_model, monkeypatch, capsys):
    import mlx_lm.perplexity as perplexity

    data = mx.random.randint(3, 262, (2, 96), key=mx.random.key(1))
    monkeypatch.setattr(perplexity, "load_data", lambda *a, **k: data)
    results = {}
    for scheme in ("none", "turbo8", "turbo2"):
        monkeypatch.setattr(
            sys,
            "argv",
            [
                "mlx_lm.perplexity",
                "--model",
                str(tiny_model("llama")),
                "--kv-scheme",
                scheme,
                "--turbo-boundary-skip",
                "0",
                "--batch-size",
                "2",
            ],
        )
        perplexity.main()
        out = capsys.readouterr().out
        results[scheme] = float(re.search(r"Perplexity: ([0-9.]+)", out).group(1))
        assert ("evaluating through" in out) == (scheme != "none")
    assert results["turbo8"] == pytest.approx(results["none"], rel=1e-2)
    # turbo2's figure is the one the compressed cache gives, fed in 32-token chunks
    model, _ = load(str(tiny_model("llama")))
    cache, inputs = make_prompt_cache(model, "turbo2", boundary_skip=0), data[:, :-1]
    logits = mx.concatenate(
        [
            model(inputs[:, s : s + 32], cache=cache)
            for s in range(0, inputs.shape[1], 32)
        ],
        axis=1,
    )
    losses = nn.losses.cross_entropy(
        logits.astype(mx.float32), data[:, 1:], reduction="none"
    )
    assert results["turbo2"] == pytest.approx(
        math.exp(losses.mean().item()), abs=1e-3
    )  # printed to 3 decimals
    assert abs(results["turbo2"] - results["none"]) > 10 * abs(
        results["turbo8"] - results["none"]
    )


def test_server_serves_with_compressed_caches(tiny_model):
    import json
    import time
    import urllib.request

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LM_TURBO")}
    server = subprocess.Popen(
        [
            str(BIN / "mlx_lm.server"),
            "--model",
            str(tiny_model("qwen3")),
            "--port",
            str(port),
            "--kv-scheme",
            "turbo4",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        body = json.dumps(
            {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}
        ).encode()
        deadline = time.time() + 60
        while True:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=30) as response:
                    reply = json.loads(response.read())
                break
            except (ConnectionError, urllib.error.URLError):
                if time.time() > deadline:
                    raise
                time.sleep(0.3)
        assert reply["usage"]["completion_tokens"] == 6
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert "[mlx-lm-turbo] qwen3: KV caches" in err


def test_server_with_a_bad_scheme_exits_at_once(tiny_model):
    result = run(
        "mlx_lm.server",
        "--model",
        tiny_model("qwen3"),
        "--port",
        free_port(),
        "--kv-scheme",
        "turbo7",
        timeout=60,
    )
    assert result.returncode == 2 and "Did you mean turbo6v2?" in result.stderr
