"""``mlx-lm-turbo questions`` on a tiny random model: the command's mechanics, not the
model's knowledge (random weights answer nonsense)."""

import json

import pytest
from helpers import exit_status

from mlx_lm_turbo import parse_scheme
from mlx_lm_turbo.tools import questions

SCHEMES = ["turbo4", "turbo2"]


def write_questions(path, items):
    path.write_text(json.dumps({"notes": "test", "questions": items}))
    return path


@pytest.fixture
def two_questions(tmp_path):
    return write_questions(
        tmp_path / "q.json",
        [
            {"question": "hello", "answers": ["x"]},
            {"question": "hell hello", "answers": ["y", "z"]},
        ],
    )


def run(model, questions_file, tmp_path, *extra):
    out = tmp_path / "answers.json"
    status = questions.main(
        [
            "--model",
            model,
            "--questions",
            str(questions_file),
            "--schemes",
            *SCHEMES,
            "--max-tokens",
            "6",
            "--boundary-skip",
            "0",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert status == 0
    return json.loads(out.read_text())


def test_every_question_with_every_scheme(tiny_model, two_questions, tmp_path, capsys):
    record = run(str(tiny_model("llama")), two_questions, tmp_path)
    captured = capsys.readouterr()
    assert [r["question"] for r in record["results"]] == ["hello", "hell hello"]
    for row in record["results"]:
        reference = row["reference"]
        assert reference["correct"] == questions.is_correct(
            reference["text"], row["answers"]
        )
        assert list(row["schemes"]) == SCHEMES
        for answer in row["schemes"].values():
            assert answer["correct"] == questions.is_correct(
                answer["text"], row["answers"]
            )
            assert answer["identical"] == (
                answer["text"] == reference["text"]
                and answer["leading_tokens_equal"] == answer["reference_tokens"]
            )
    kept = [r for r in record["results"] if r["reference"]["correct"]]
    for name in SCHEMES:
        assert record["summary"][name]["questions"] == len(kept)
        assert record["summary"][name]["identical"] == sum(
            r["schemes"][name]["identical"] for r in kept
        )
    assert record["command"].startswith("mlx-lm-turbo questions --model")
    assert record["commit"] and record["date"].endswith("UTC")
    # Readable report on stdout, one progress line per question on stderr.
    assert "| scheme | correct | identical text |" in captured.out
    assert all(f"| {name} |" in captured.out for name in SCHEMES)
    assert captured.err.count("[questions] 1/2") == 1
    assert captured.err.count("[questions] 2/2") == 1


def test_counts_and_report(monkeypatch, capsys):
    """Scripted answers: only questions fp16 gets right count; wrong answers are listed
    first among the differing ones."""
    items = [
        {"question": "a", "answers": ["paris"]},
        {"question": "b", "answers": ["tokyo"]},
        {"question": "c", "answers": ["rome"]},
    ]
    scripted = {
        (None, "a"): "Paris.",
        ("turbo4", "a"): "Paris.",
        (None, "b"): "Tokyo, Japan.",
        ("turbo4", "b"): "Tokyo, is it.",  # correct, not identical
        (None, "c"): "Milan.",  # fp16 wrong: not counted
        ("turbo4", "c"): "Rome.",
    }

    def fake_ask(model, tokenizer, question, cache, max_tokens):
        text = scripted[(cache, question)]
        return text, text.split()

    monkeypatch.setattr(questions, "ask", fake_ask)
    monkeypatch.setattr(
        questions,
        "build_cache",
        lambda model, scheme, args: scheme and scheme.name,
    )

    class Args:
        max_tokens = 4

    scheme = parse_scheme("turbo4")
    results = questions.run_questions(None, None, items, [scheme], Args)
    summary = questions.summarize(results, [scheme])
    assert summary["turbo4"] == {
        "questions": 2,
        "correct": 2,
        "identical": 1,
        "leading_tokens_equal": 1 + 1,
        "reference_tokens": 1 + 2,
    }
    record = {
        "command": "c",
        "date": "d",
        "commit": "x",
        "model": "m",
        "reference_cache": "uncompressed",
        "options": {},
        "results": results,
        "summary": summary,
    }
    text = questions.report(record, show=5)
    assert "| turbo4 | 2/2 | 1/2 | 2/3 |" in text
    assert "correctly; the counts below" in text and "- 'c'" in text
    assert "turbo4: 1 of 2 answers differ" in text and "'Tokyo, is it.'" in text


def test_exact_layers_everywhere_gives_fp16_answers(
    tiny_model, two_questions, tmp_path
):
    record = run(
        str(tiny_model("llama")),
        two_questions,
        tmp_path,
        "--exact-layers",
        "0,1,2,3,4,5",
    )
    for row in record["results"]:
        for answer in row["schemes"].values():
            assert answer["text"] == row["reference"]["text"]
            assert answer["leading_tokens_equal"] == answer["reference_tokens"]


def built_caches(monkeypatch):
    """Every cache list the command builds, as it builds them."""
    built = []
    original = questions.build_cache

    def spy(model, scheme, args):
        cache = original(model, scheme, args)
        built.append(cache)
        return cache

    monkeypatch.setattr(questions, "build_cache", spy)
    return built


@pytest.mark.parametrize(
    "option, attribute",
    [("--sink-tokens", "sink_tokens"), ("--recent-exact", "recent_exact")],
)
def test_cache_options_reach_the_caches(
    tiny_model, two_questions, tmp_path, monkeypatch, option, attribute
):
    built = built_caches(monkeypatch)
    record = run(str(tiny_model("llama")), two_questions, tmp_path, option, "3")
    turbo = [c for cache in built for c in cache if hasattr(c, attribute)]
    assert turbo and all(getattr(c, attribute) == 3 for c in turbo)
    assert record["options"][attribute] == 3


def test_accepted_answers_match_whole_words():
    assert questions.is_correct("The symbol is Au.", ["Au"])
    assert questions.is_correct("It is the Pacific Ocean", ["pacific"])
    assert not questions.is_correct("because it is gold", ["Au"])
    assert questions.is_correct("about 100.0 degrees", ["100"])
    assert not questions.is_correct("1000 degrees", ["100"])


def test_shipped_set_is_well_formed():
    items = questions.load_questions(questions.QUESTIONS)
    assert len(items) >= 20
    assert len({q["question"] for q in items}) == len(items)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--schemes", "turbo5"], "--schemes: Unknown KV scheme 'turbo5'"),
        (["--schemes", "none"], "drop 'none'"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--sink-tokens", "-1"], "--sink-tokens must be >= 0"),
        (["--recent-exact", "0"], "--recent-exact must be at least 1"),
        (["--exact-layers", "1,a"], "expected comma-separated layer numbers"),
        (["--questions", "/nonexistent.json"], "Cannot read questions file"),
        ([], "Model '/nonexistent' not found"),
    ],
)
def test_bad_input_is_a_usage_error(args, message, capsys):
    assert exit_status(["questions", "--model", "/nonexistent", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_malformed_questions_file(tmp_path, capsys):
    bad = write_questions(tmp_path / "bad.json", [{"question": "q", "answers": []}])
    assert exit_status(["questions", "--questions", str(bad)]) == 2
    assert "needs a non-empty list" in capsys.readouterr().err


def test_exact_layers_beyond_the_model(tiny_model, two_questions, capsys):
    status = exit_status(
        [
            "questions",
            "--model",
            str(tiny_model("llama")),
            "--questions",
            str(two_questions),
            "--exact-layers",
            "99",
        ]
    )
    assert status == 2
    assert "--exact-layers names entries beyond" in capsys.readouterr().err


def test_explain_measures_where_an_answer_turned_wrong(
    tiny_model, two_questions, tmp_path
):
    """Accept only fp16's own answers, so every answer that differs turns wrong; the
    forced-prefix logit gap must then favour fp16's token with the fp16 cache and the
    scheme's token with the cache as run (the step greedy decoding took)."""
    model = str(tiny_model("llama"))
    # W 1: with the default window these short prompts are read almost exactly
    first = run(model, two_questions, tmp_path, "--recent-exact", "1")
    items = [
        {"question": r["question"], "answers": [r["reference"]["text"]]}
        for r in first["results"]
    ]
    own = write_questions(tmp_path / "own.json", items)
    record = run(
        model, own, tmp_path, "--recent-exact", "1", "--explain", "--explain-group", "4"
    )
    wrong = [
        (r["question"], name)
        for r in record["results"]
        for name, a in r["schemes"].items()
        if not a["correct"]
    ]
    assert wrong, "turbo2 on a random model should change some answer"
    assert [(e["question"], e["scheme"]) for e in record["explained"]] == wrong
    for e in record["explained"]:
        gaps = e["gaps"]
        assert list(gaps)[:2] == ["uncompressed", "as run"]
        assert {"L0-3 exact", "L4-5 exact", "only L4-5 turbo", "sinks 64"} <= set(gaps)
        assert gaps["uncompressed"] > 0 > gaps["as run"]
