"""benchmarks/model_speed.py on its tiny shape on the CPU: the whole-model benchmark runs
through mlx-lm's generation for one sequence and for a batch, and writes what it measured."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "model_speed.py"


@pytest.fixture(scope="module")
def model_speed():
    spec = importlib.util.spec_from_file_location("model_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(model_speed, tmp_path, context, *options):
    out = tmp_path / "speed.json"
    model_speed.main(
        ["--shape", "tiny", "--contexts", str(context), "--decode-tokens", "4"]
        + ["--rounds", "1", "--schemes", "turbo4", "--json", str(out), *options]
    )
    return json.loads(out.read_text())


def check(results, speeds):
    assert results["device"]["name"] and results["versions"]["mlx_lm"]
    assert results["command"].startswith(
        "python benchmarks/model_speed.py --shape tiny"
    )
    assert len(results["runs"]) == 2  # fp16 and turbo4, one round
    fp16, turbo4 = results["medians"]
    assert (fp16["cache"], turbo4["cache"]) == ("fp16", "turbo4")
    for row in (fp16, turbo4):
        assert all(row[key] > 0 for key in speeds + ("kv_bytes", "peak_bytes"))
    assert turbo4["kv_bytes"] < fp16["kv_bytes"]
    assert "prefill_vs_fp16" not in fp16
    for key in ("prefill_vs_fp16", "decode_vs_fp16", "kv_bytes_vs_fp16"):
        assert turbo4[key] > 0
    assert turbo4["kv_bytes_vs_fp16"] < 1


def test_one_sequence(model_speed, tmp_path, capsys):
    results = run(model_speed, tmp_path, 64)
    check(results, ("ttft_s", "prefill_tps", "decode_tps"))
    assert results["config"]["batch"] == 1
    table = capsys.readouterr().out
    assert "turbo4" in table and "TTFT s" in table


def test_ragged_batch(model_speed, tmp_path):
    results = run(model_speed, tmp_path, 96, "--batch", "2", "--ragged")
    check(results, ("prefill_tps", "decode_tps"))
    # the last prompt token of each sequence is its first decode step's input
    assert results["runs"][0]["prefill_tokens"] == 96 + 72 - 2
    assert results["runs"][0]["decode_tokens"] == 2 * (1 + 4)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--shape", "llama-9b"], "invalid choice: 'llama-9b'"),
        (["--schemes", "turbo9"], "argument --schemes"),
        (["--schemes", "none"], "fp16 (no scheme) is always run"),
        (["--contexts", "0"], "must be at least 1"),
        (["--ragged"], "--ragged needs --batch 2 or more"),
    ],
)
def test_usage_errors_exit_2(model_speed, capsys, options, message):
    with pytest.raises(SystemExit) as exit:
        model_speed.main(["--shape", "tiny", *options])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_list_shapes(model_speed, capsys):
    model_speed.main(["--list-shapes"])
    shapes = capsys.readouterr().out
    for name in ("tiny", "llama-3.1-8b", "qwen3-8b", "gemma3-12b"):
        assert f"{name}: " in shapes
    assert "sliding window 1024" in shapes
