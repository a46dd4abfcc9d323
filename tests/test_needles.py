"""The needle benchmark on a tiny model: trials, pairing and the summary's arithmetic."""

import json
import math
import random

import pytest
from mlx_lm import load

from mlx_lm_turbo.tools import needles


def test_a_trial_hides_the_needle_and_ends_on_the_cue(tiny_model):
    _, tokenizer = load(str(tiny_model("llama")))
    for kind in needles.KINDS:
        answer = needles.answer_text(kind, random.Random(1))
        prompt, answer_tokens = needles.trial_tokens(
            tokenizer, kind, 200, answer, 0.5, 0.2
        )
        text = tokenizer.decode(prompt)
        needle, cue = needles.KINDS[kind]
        assert needle.format(answer=answer) in text
        assert text.endswith(cue) and 190 <= len(prompt) <= 210
        assert tokenizer.decode(prompt + answer_tokens).endswith(cue + " " + answer)
    assert needles.answer_text("passkey", random.Random(2)).isdigit()


def test_the_summary_pairs_each_cache_with_fp16():
    def trial(fp16, turbo, found=(True, True)):
        return {
            "kind": "phrase",
            "context": 64,
            "caches": {
                "fp16": {"logprob": fp16, "found": found[0]},
                "turbo4": {"logprob": turbo, "found": found[1]},
            },
        }

    trials = [
        trial(-1.0, -1.5),
        trial(-2.0, -2.1, (True, False)),
        trial(-0.5, -0.2, (False, True)),
        trial(-3.0, -3.0, (False, False)),
    ]
    (row,) = needles.summary(trials)
    assert row["loss"] == pytest.approx(0.075)  # of 0.5, 0.1, -0.3 and 0
    half = 1.959964 * 0.3304038 / 2  # the losses' standard deviation over sqrt(4)
    assert row["loss_high"] - row["loss"] == pytest.approx(half, rel=1e-5)
    assert row["loss"] - row["loss_low"] == pytest.approx(half, rel=1e-5)
    assert (row["fp16_found"], row["found"], row["retention"]) == (2, 2, 0.5)
    assert "| phrase | 64 | turbo4 | 4 | 2 (2) | 50.0% |" in needles.markdown([row])


def test_needles_command_runs_small(tiny_model, tmp_path, capsys):
    out = tmp_path / "needles.json"
    model = str(tiny_model("llama"))
    assert (
        needles.main(
            [
                "--model",
                model,
                "--caches",
                "turbo4",
                "turbo3",
                "--contexts",
                "96",
                "--trials",
                "2",
                "--boundary-skip",
                "0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    saved = json.loads(out.read_text())
    assert len(saved["trials"]) == 4  # two kinds, two trials
    assert {(r["kind"], r["cache"]) for r in saved["summary"]} == {
        (k, c) for k in needles.KINDS for c in ("turbo4", "turbo3")
    }
    assert all(math.isfinite(r["loss"]) and r["trials"] == 2 for r in saved["summary"])
    assert "log p loss vs fp16 (95% interval)" in capsys.readouterr().out


def test_needles_bad_options_are_usage_errors(capsys):
    for argv in (["--caches", "fp16"], ["--caches", "turbo5"], ["--trials", "0"]):
        with pytest.raises(SystemExit) as exit:
            needles.main(argv)
        assert exit.value.code == 2
