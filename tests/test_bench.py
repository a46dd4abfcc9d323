"""The benchmark's metrics and outputs on a tiny model (quality numbers need the real model)."""

import json

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from mlx_lm_turbo.tools import bench
from mlx_lm_turbo.tools.quality import compare, teacher_forced_logprobs


def run_bench(tiny_model, out, *options):
    """``mlx-lm-turbo bench`` on the tiny llama, boundary layers compressed like the
    rest; its results.json."""
    model = str(tiny_model("llama"))
    bench.main(["--model", model, *options, "--boundary-skip", "0", "--out", str(out)])
    return json.loads((out / "results.json").read_text())


def recorded_row(cache):
    """A row as a run records it: one context, an uncompressed cache's numbers."""
    return {
        "cache": cache,
        "context": 64,
        "kl": 0.0,
        "top1": 1.0,
        "ppl": 9.0,
        "ppl_reference": 9.0,
        "bits_per_value": 16,
        "bits_all_in": 16.0,
        "kv_bytes_per_token": 1024.0,
    }


def recorded_results(rows, **phases):
    """Results as a run records them, with ``rows`` and the given phases' lists."""
    return {
        "model": "m",
        "device": "cpu",
        "dtype": "float16",
        "decode_steps": 4,
        "boundary_skip": 2,
        "rows": rows,
        **phases,
    }


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
    assert metrics["ppl"] == pytest.approx(
        float(mx.exp(mx.array(nll)).item()), rel=1e-5
    )


def test_bench_end_to_end(tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    results = run_bench(
        tiny_model,
        out,
        *("--contexts", "48", "--decode", "6"),
        *("--needle-contexts", "120", "--needle-depths", "0.5"),
        *("--memory-context", "128"),
        *("--caches", "fp16", "affine4", "turbo8", "turbo2"),
    )
    rows = {r["cache"]: r for r in results["rows"]}
    assert (
        rows["fp16"]["kl"] == pytest.approx(0.0, abs=1e-6)
        and rows["fp16"]["bits_per_value"] == 16
    )
    assert rows["turbo8"]["kl"] < rows["turbo2"]["kl"]
    assert rows["turbo8"]["bits_per_value"] == pytest.approx(
        8.125
    )  # head_dim 128: 8 + 16/128
    assert rows["turbo2"]["bits_per_value"] == pytest.approx(2.125)
    assert rows["affine4"]["bits_per_value"] == 4.5
    assert rows["turbo2"]["kv_bytes_per_token"] == pytest.approx(
        rows["fp16"]["kv_bytes_per_token"] * 2.125 / 16
    )
    assert len(results["needle"]) == 4 and {
        n["cache"] for n in results["needle"]
    } == set(rows)
    assert [m["cache"] for m in results["peak_memory"]] == ["fp16", "turbo8", "turbo2"]
    for name in ("results.md", "kl_vs_bits.png", "memory_vs_context.png"):
        assert (out / name).stat().st_size > 0
    assert "| turbo2 | 2.125 |" in capsys.readouterr().out
    # the table and plots can be redone from the JSON alone
    again = tmp_path / "again"
    bench.main(["--from-json", str(out / "results.json"), "--out", str(again)])
    assert (again / "results.md").read_text() == (out / "results.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--caches", "fp16", "turbo5"],
            "--caches: Unknown KV scheme 'turbo5'. Did you mean turbo5v3?",
        ),
        (["--caches", "fp16", "affine7"], "affine caches are affine2/3/4/5/6/8"),
        (["--caches", "turbo4", "fp16"], "must start with fp16"),
        (["--decode", "0"], "--decode must be at least 1, got 0"),
        (["--contexts", "512", "-4"], "--contexts must be at least 1"),
        (["--needle-depths", "1.5"], "from 0 to 1"),
        (["--needle-trials", "9"], "--needle-trials must be 1 to 8, got 9."),
        (["--boundary-skip", "-1"], "--boundary-skip must be at least 0"),
        (["--speed-rounds", "0"], "--speed-rounds must be at least 1, got 0."),
        (
            ["--recent-exact", "0"],
            "--recent-exact: recent_exact must be an integer >= 1",
        ),
        (
            ["--from-json", "/nonexistent.json"],
            "--from-json: cannot read /nonexistent.json",
        ),
    ],
)
def test_bad_options_fail_before_loading(args, message, capsys):
    with pytest.raises(SystemExit) as exit:
        bench.main(["--model", "/nonexistent", *args])
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_without_matplotlib_no_plots_are_claimed(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    results = recorded_results([], needle=[], peak_memory=[])
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    bench.write(results, tmp_path)
    err = capsys.readouterr().err
    assert (
        "no plots" in err and f"wrote results.json and results.md in {tmp_path}" in err
    )
    assert "png" not in err and not list(tmp_path.glob("*.png"))


def test_bits_per_value_counts_the_tokens_a_sliding_window_holds(tiny_model):
    # A window holds at most max_size tokens: dividing its bytes by every token seen
    # would report fewer bits than the scheme stores.
    model, _ = load(str(tiny_model("gpt_oss")))
    kind = bench.CacheKind("turbo4", boundary_skip=0)
    cache = kind.make(model)
    model(mx.arange(100)[None] % 50, cache=cache)
    for t in range(4):  # single tokens: the ring is back to its size
        model(mx.array([[t]]), cache=cache)
    windows = [c for c in cache if getattr(c, "max_size", None)]
    assert windows and all(c.offset > c.max_size for c in windows)
    assert kind.bits_per_value(cache, 16) == pytest.approx(4.25, abs=0.01)


def test_all_in_bits_count_the_exact_tokens_a_cache_keeps(tiny_model):
    # The scheme's bits are the same with or without recent tokens kept exactly; all in,
    # W - 1 exact tokens per layer add (W - 1) x the model's bits over the tokens held,
    # and the exact sink tokens, their query energies and the key statistics are
    # counted at W = 1 already.
    model, _ = load(str(tiny_model("llama")))
    dtype_bits = 8 * model.layers[0].self_attn.k_proj.weight.dtype.size
    tokens = mx.random.randint(3, 262, (1, 100), key=mx.random.key(4))
    rows = {}
    for recent in (1, 9):
        kind = bench.CacheKind("turbo4", boundary_skip=0, recent_exact=recent)
        cache = kind.make(model)
        model(tokens, cache=cache)
        rows[recent] = (
            kind.name,
            kind.bits_per_value(cache, 16),
            kind.bits_all_in(cache),
        )
    assert rows[1][0] == "turbo4 r1" and rows[9][0] == "turbo4 r9"  # W 16: "turbo4"
    assert rows[1][1] == rows[9][1] == pytest.approx(4.125)  # head_dim 128
    sinks = 16 * dtype_bits / 100  # 16 exact first tokens of 100
    # a float32 mean and scale per key channel (center+query), and a float32 query
    # energy per pair of key channels for each sink token, over 256 values a token
    statistics = 2 * 128 * 32 / (100 * 256)
    energies = 16 * 64 * 32 / (100 * 256)
    assert rows[1][2] - rows[1][1] == pytest.approx(sinks + statistics + energies)
    assert rows[9][2] - rows[1][2] == pytest.approx(8 * dtype_bits / 100)


def test_bench_runs_each_turbo_cache_per_recent_width_without_speed(
    tiny_model, tmp_path
):
    out = tmp_path / "out"
    results = run_bench(
        tiny_model,
        out,
        *("--contexts", "48", "--decode", "4"),
        *("--needle-contexts", "--memory-context", "0"),
        *("--caches", "fp16", "affine4", "turbo2"),
        *("--recent-exact", "1", "8", "--no-speed"),
    )
    rows = {r["cache"]: r for r in results["rows"]}
    assert list(rows) == ["fp16", "affine4", "turbo2 r1", "turbo2 r8"]
    assert rows["fp16"]["bits_all_in"] == rows["fp16"]["bits_per_value"]
    assert rows["affine4"]["bits_all_in"] == 4.5
    assert rows["turbo2 r8"]["bits_all_in"] > rows["turbo2 r1"]["bits_all_in"]
    assert (
        rows["turbo2 r8"]["kl"] != rows["turbo2 r1"]["kl"]
    )  # the window reached the cache
    table = (out / "results.md").read_text()
    assert "| turbo2 r8 | 2.125 |" in table
    # each turbo row records its window, and the table says what a row without r reads
    assert [r.get("recent_exact") for r in rows.values()] == [None, None, 1, 8]
    assert "a turbo row without r: 15 (the default)" in table
    # --no-speed: no warm-up runs, so no speed ratios claimed
    assert all("decode_speed_vs_fp16" not in r for r in rows.values())
    assert table.count("| - | - |") == len(rows)


def test_affine_baseline_keeps_sliding_windows(tiny_model):
    # mlx-lm's affine caches quantize what the model gave; a sliding-window layer must
    # still see only its window afterwards. At 8 bits the affine rows stay next to
    # fp16; an unbounded cache there (what the baseline once built) reads past the
    # 16-token window and moves every distribution.
    from mlx_lm_turbo.tools.quality import affine_after_prefill

    model, _ = load(str(tiny_model("gpt_oss")))
    tokens = mx.random.randint(3, 262, (60,), key=mx.random.key(5))
    reference = teacher_forced_logprobs(model, tokens, mlx_make_prompt_cache(model), 40)
    affine = teacher_forced_logprobs(
        model, tokens, mlx_make_prompt_cache(model), 40, affine_after_prefill(8)
    )
    metrics = compare(reference, affine, tokens[40:])
    assert metrics["kl"] < 1e-4 and metrics["top1"] == 1.0


def test_book_slices_start_as_prompts_do():
    # A tokenizer that adds BOS (Gemma 3's) gets it, as mlx-lm's prompts do.
    class Tokenizer:
        def encode(self, text, add_special_tokens=True):
            return [2] * add_special_tokens + [ord(c) % 250 + 3 for c in text]

    tokens = bench.book_tokens(Tokenizer(), 6).tolist()
    assert len(tokens) == 6 and tokens[0] == 2 and 2 not in tokens[1:]


def test_uncompressed_bits_come_from_the_cache_not_the_parameters(tiny_model):
    # A quantized model's first float parameters (scales, an embedding) can be float16
    # while its keys and values are float32, as SmolLM2's are on CPU.
    model, _ = load(str(tiny_model("llama")))
    model.set_dtype(mx.float32)
    embedding = model.model.embed_tokens
    embedding.weight = embedding.weight.astype(mx.float16)
    dtype, per_token = bench.uncompressed_kv(model)
    assert dtype == mx.float32
    layers = model.layers
    attention = layers[0].self_attn
    kv_dims = attention.n_kv_heads * attention.head_dim * 2
    assert per_token == len(layers) * kv_dims


def test_all_in_bits_of_a_hybrid_model_count_only_keys_and_values(tiny_model):
    # qwen3_5 mixes recurrent layers (their state is not a KV cache) with attention.
    model, _ = load(str(tiny_model("qwen3_5")))
    tokens = mx.random.randint(3, 262, (1, 60), key=mx.random.key(6))
    fp16 = bench.CacheKind("fp16", boundary_skip=0)
    cache = fp16.make(model)
    model(tokens, cache=cache)
    dtype, _ = bench.uncompressed_kv(model)
    assert fp16.bits_all_in(cache) == 8 * dtype.size
    turbo = bench.CacheKind("turbo4", boundary_skip=0)
    cache = turbo.make(model)
    model(tokens, cache=cache)
    attention = [c for c in cache if hasattr(c, "codec")]
    assert 0 < len(attention) < len(cache)
    assert turbo.bits_all_in(cache) == turbo.bits_all_in(attention)


def test_a_run_cut_off_after_its_rows_still_renders(tmp_path):
    # The checkpoint a killed run leaves (rows measured, no needle or memory phase yet,
    # as runs before these keys were written at the start left it) gives its table.
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(recorded_results([recorded_row("fp16")])))
    bench.main(["--from-json", str(saved), "--out", str(tmp_path / "again")])
    table = (tmp_path / "again" / "results.md").read_text()
    assert (
        "| fp16 | 16.000 | 16.000 | 1024 | 0.0000 | 1.000 | 9.00 | - | - | - | - |"
        in table
    )


def test_auto_dtype_keeps_bfloat16_models_in_bfloat16_on_a_gpu(tiny_model, monkeypatch):
    model, _ = load(str(tiny_model("llama")))
    assert bench.activation_dtype(model, "model") is None
    assert bench.activation_dtype(model, "float32") == mx.float32
    if mx.default_device() != mx.gpu:
        assert bench.activation_dtype(model, "auto") is None  # CPU: as loaded
        monkeypatch.setattr(bench.mx, "default_device", lambda: mx.gpu)
    model.set_dtype(mx.float32)
    assert bench.activation_dtype(model, "auto") == mx.float16
    model.set_dtype(mx.bfloat16)  # trained in bfloat16: float16 could overflow
    assert bench.activation_dtype(model, "auto") == mx.bfloat16


def test_needle_trials_take_other_slices_and_passphrases(
    tiny_model, tmp_path, monkeypatch
):
    prompts = []
    monkeypatch.setattr(
        bench,
        "retrieve",
        lambda model, tokenizer, kind, prompt, word: (
            prompts.append((prompt, word)) or (True, -0.5)
        ),
    )
    results = run_bench(
        tiny_model,
        tmp_path,
        *("--caches", "fp16", "--contexts", "64", "--decode", "2", "--no-speed"),
        *("--needle-contexts", "200", "--needle-depths", "0.2", "0.8"),
        *("--needle-trials", "8", "--memory-context", "0"),
    )
    assert [(n["depth"], n["trial"]) for n in results["needle"]] == [
        (d, t) for t in range(8) for d in (0.2, 0.8)
    ]
    assert len({tuple(p) for p, _ in prompts}) == 16  # all different prompts
    assert len({w for _, w in prompts}) == len(bench.NEEDLE_WORDS)
    starts = {tuple(p[1:20]) for p, _ in prompts}  # the book slice each begins with
    assert len(starts) == 8


def test_needle_answer_logprob_is_the_models_after_the_whole_prompt(tiny_model):
    # The same number a plain mlx-lm cache's logits give for the passphrase's first
    # token after the cue, whatever the greedy answer was.
    model, tokenizer = load(str(tiny_model("llama")))
    word = "tangerine"
    token = bench.answer_token(tokenizer, word)
    assert word.startswith(tokenizer.decode([token]).strip())
    prompt = bench.needle_prompt(tokenizer, 200, 0.5, word)
    found, logprob = bench.retrieve(
        model, tokenizer, bench.CacheKind("fp16", 0), prompt, word
    )
    logits = model(mx.array(prompt)[None], cache=mlx_make_prompt_cache(model))[0, -1]
    expected = (logits[token] - mx.logsumexp(logits)).item()
    assert logprob == pytest.approx(expected, abs=1e-4) and logprob < 0
    assert isinstance(found, bool)


def test_needle_log_p_column_pairs_each_cache_with_the_first():
    # Each cache's mean, and its mean difference from the first cache's on the prompts
    # both answered (a prompt only one of them reached is left out of the difference),
    # with that mean's standard error: differences -0.5 and -0.25.
    needle = [
        ("fp16", 0, -1.0),
        ("turbo4", 0, -1.5),
        ("fp16", 1, -3.0),
        ("turbo4", 1, -3.25),
        ("turbo4", 2, -8.0),
    ]
    results = recorded_results(
        [recorded_row("fp16"), recorded_row("turbo4")],
        needle=[
            {"cache": c, "context": 512, "depth": 0.5, "trial": t, "found": True}
            | {"answer_logprob": p}
            for c, t, p in needle
        ],
        peak_memory=[],
    )
    table = bench.markdown(results)
    assert "| 2/2 | -2.00 | - | - |" in table
    assert "| 3/3 | -4.25 (-0.38 ± 0.12) | - | - |" in table


def test_speed_rounds_time_every_cache_in_turn_and_give_the_median(
    tiny_model, tmp_path, capsys
):
    # Round 1 is the quality run's timing; each further round times every cache again
    # in turn, and a row's speed is the median of its rounds' ratios to fp16's.
    out = tmp_path / "out"
    results = run_bench(
        tiny_model,
        out,
        *("--caches", "fp16", "turbo4", "--contexts", "48", "--decode", "4"),
        *("--speed-rounds", "3", "--needle-contexts", "--memory-context", "0"),
    )
    fp16, turbo4 = results["rows"]
    for phase in ("prefill", "decode"):
        assert fp16[f"{phase}_speed_rounds"] == [1.0, 1.0, 1.0]
        rounds = turbo4[f"{phase}_speed_rounds"]
        assert len(rounds) == 3 and len(set(rounds)) > 1  # each round timed anew
        assert turbo4[f"{phase}_speed_vs_fp16"] == sorted(rounds)[1]
    table = (out / "results.md").read_text()
    assert "the median over 3 rounds" in table
    low, high = min(turbo4["decode_speed_rounds"]), max(turbo4["decode_speed_rounds"])
    assert f"{turbo4['decode_speed_vs_fp16']:.2f}x ({low:.2f}-{high:.2f}) |" in table
    # the progress shows every round's ratios, the first included
    progress = capsys.readouterr().err
    for i, ratio in enumerate(turbo4["decode_speed_rounds"], 1):
        assert f"speed round {i}: decode fp16 1.00x turbo4 {ratio:.2f}x" in progress
