"""The benchmark's metrics and outputs on a tiny model (quality numbers need the real model)."""

import json

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from mlx_lm_turbo import bench
from mlx_lm_turbo.quality import compare, teacher_forced_logprobs


def test_metrics_of_identical_caches(tiny_model):
    model, _ = load(str(tiny_model("llama")))
    tokens = mx.random.randint(3, 262, (40,), key=mx.random.key(2))
    a = teacher_forced_logprobs(model, tokens, mlx_make_prompt_cache(model), 30)
    b = teacher_forced_logprobs(model, tokens, mlx_make_prompt_cache(model), 30)
    metrics = compare(a, b, tokens[30:])
    assert a.shape == (10, 262)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6) and metrics["top1"] == 1.0
    assert metrics["ppl"] == pytest.approx(metrics["ppl_reference"])
    # perplexity agrees with the mean negative log-likelihood computed directly
    nll = -mx.take_along_axis(a, tokens[30:, None], axis=-1).mean().item()
    assert metrics["ppl"] == pytest.approx(float(mx.exp(mx.array(nll)).item()), rel=1e-5)


def test_bench_end_to_end(tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    bench.main(["--model", str(tiny_model("llama")), "--contexts", "48", "--decode", "6",
                "--needle-contexts", "120", "--needle-depths", "0.5", "--memory-context", "128",
                "--caches", "fp16", "affine4", "turbo8", "turbo2", "--boundary-skip", "0", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    rows = {r["cache"]: r for r in results["rows"]}
    assert rows["fp16"]["kl"] == pytest.approx(0.0, abs=1e-6) and rows["fp16"]["bits_per_value"] == 16
    assert rows["turbo8"]["kl"] < rows["turbo2"]["kl"]
    assert rows["turbo8"]["bits_per_value"] == pytest.approx(8.125)  # head_dim 128: 8 + 16/128
    assert rows["turbo2"]["bits_per_value"] == pytest.approx(2.125)
    assert rows["affine4"]["bits_per_value"] == 4.5
    assert rows["turbo2"]["kv_bytes_per_token"] == pytest.approx(rows["fp16"]["kv_bytes_per_token"] * 2.125 / 16)
    assert len(results["needle"]) == 4 and {n["cache"] for n in results["needle"]} == set(rows)
    assert [m["cache"] for m in results["peak_memory"]] == ["fp16", "turbo8", "turbo2"]
    for name in ("results.md", "kl_vs_bits.png", "memory_vs_context.png"):
        assert (out / name).stat().st_size > 0
    assert "| turbo2 | 2.125 |" in capsys.readouterr().out
    # the table and plots can be redone from the JSON alone
    again = tmp_path / "again"
    bench.main(["--from-json", str(out / "results.json"), "--out", str(again)])
    assert (again / "results.md").read_text() == (out / "results.md").read_text()


def test_bad_cache_name_fails_before_loading():
    with pytest.raises(ValueError, match="Did you mean turbo4"):
        bench.main(["--model", "/nonexistent", "--caches", "fp16", "turbo5"])
