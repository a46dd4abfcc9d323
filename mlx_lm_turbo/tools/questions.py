"""``mlx-lm-turbo questions``: short factual questions, answered greedily with an
uncompressed cache and with TurboQuant caches; per scheme, how many answers are
correct and how many are the uncompressed answer word for word.

With no arguments it asks the embedded demo model (SmolLM2-135M-Instruct) the set
in ``tools/data/questions.json``, through the model's chat template. An answer is
correct when it contains one of the question's accepted answers as a whole word
(case ignored).
The measurement options (--sink-tokens, --exact-layers, ...) change only the caches
this command builds, to find what flips an answer.
"""

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from ..attach.preflight import load_model
from ..codec.codec import KEY_CALIBRATIONS
from ..defaults import DEFAULT_BOUNDARY_SKIP
from ..errors import UsageError
from ..plugin.prompt_cache import make_prompt_cache, plan
from . import add_recent_exact_option, compared_schemes, generate, leading_equal

QUESTIONS = Path(__file__).with_name("data") / "questions.json"
DEFAULT_SCHEMES = ("turbo4", "turbo3", "turbo4v2", "turbo8")
DEFAULT_MAX_TOKENS = 24


def say(message):
    print(f"[questions] {message}", file=sys.stderr, flush=True)


def load_questions(path):
    """[{"question": str, "answers": [str, ...]}, ...] from a questions file."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise UsageError(
            f"Cannot read questions file {str(path)!r}: {error}."
        ) from None
    except json.JSONDecodeError as error:
        raise UsageError(
            f"Questions file {str(path)!r} is not JSON: {error}."
        ) from None
    items = data.get("questions") if isinstance(data, dict) else None
    if not items or not all(
        isinstance(q, dict)
        and isinstance(q.get("question"), str)
        and isinstance(q.get("answers"), list)
        and q["answers"]
        and all(isinstance(a, str) and a for a in q["answers"])
        for q in items
    ):
        raise UsageError(
            f'Questions file {str(path)!r} needs a non-empty list under "questions", each '
            '{"question": "...", "answers": ["accepted substring", ...]}.'
        )
    return items


def is_correct(text, answers):
    """Whether an accepted answer appears as a whole word (case ignored): "Au" is not
    found in "because"."""
    return any(
        re.search(rf"(?<!\w){re.escape(a)}(?!\w)", text, re.IGNORECASE) for a in answers
    )


def prompt_tokens(tokenizer, question):
    """The question through the chat template, tokenized as ``stream_generate`` does a
    text prompt."""
    prompt = question
    if tokenizer.chat_template is not None:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=False,
        )
    bos = tokenizer.bos_token
    return tokenizer.encode(
        prompt, add_special_tokens=bos is None or not prompt.startswith(bos)
    )


def ask(model, tokenizer, question, cache, max_tokens):
    """Greedy answer to one question: (text, token ids)."""
    prompt = prompt_tokens(tokenizer, question)
    text, tokens, _ = generate(model, tokenizer, prompt, cache, max_tokens)
    return text.strip(), tokens


def build_cache(model, scheme, args):
    """The cache one answer runs with: mlx-lm's for ``scheme`` None, else a turbo one
    with this command's measurement options applied."""
    if scheme is None:
        return mlx_make_prompt_cache(model)
    cache = make_prompt_cache(
        model,
        scheme,
        boundary_skip=args.boundary_skip,
        key_calibration=args.key_calibration,
        recent_exact=args.recent_exact,
        model_path=args.model,
    )
    uncompressed = mlx_make_prompt_cache(model)
    for i in args.exact_layers:
        cache[i] = uncompressed[i]
    if args.sink_tokens is not None:
        for c in cache:
            if hasattr(c, "sink_tokens"):
                c.sink_tokens = args.sink_tokens
    return cache


def run_questions(model, tokenizer, questions, schemes, args):
    """Every question with the uncompressed cache, then with each scheme."""
    results = []
    for n, item in enumerate(questions, 1):
        text, tokens = ask(
            model,
            tokenizer,
            item["question"],
            build_cache(model, None, args),
            args.max_tokens,
        )
        row = {
            **item,
            "reference": {
                "text": text,
                "correct": is_correct(text, item["answers"]),
                "tokens": tokens,
            },
            "schemes": {},
        }
        marks = [f"uncompressed {'ok' if row['reference']['correct'] else 'WRONG'}"]
        for scheme in schemes:
            answer, answer_tokens = ask(
                model,
                tokenizer,
                item["question"],
                build_cache(model, scheme, args),
                args.max_tokens,
            )
            row["schemes"][scheme.name] = {
                "text": answer,
                "correct": is_correct(answer, item["answers"]),
                "identical": answer_tokens == tokens,
                "leading_tokens_equal": leading_equal(tokens, answer_tokens),
                "reference_tokens": len(tokens),
                "tokens": answer_tokens,
            }
            r = row["schemes"][scheme.name]
            mark = "same" if r["identical"] else ("ok" if r["correct"] else "WRONG")
            marks.append(f"{scheme.name} {mark}")
        say(f"{n}/{len(questions)} {item['question']!r}: {', '.join(marks)}")
        results.append(row)
        mx.clear_cache()
    return results


def logit_gap(model, ids, cache, ours, theirs):
    """Logit of token ``ours`` minus that of ``theirs`` for the token after ``ids``.

    The ids go in as one chunk and then the last one: a turbo cache reads every key
    but a query's own and the sink tokens compressed, whatever the chunking, so this
    is the step greedy decoding took (up to rounding)."""
    x = mx.array(ids)[None]
    model(x[:, :-1], cache=cache)
    logits = model(x[:, -1:], cache=cache)[0, -1].astype(mx.float32)
    return (logits[ours] - logits[theirs]).item()


def explain_variants(n_caches, args, group):
    """(label, options) of the caches an answer flip is measured with: as run, each
    group of ``group`` cache entries exact, only that group compressed, and other
    boundary/sink settings."""

    def changed(**options):
        return argparse.Namespace(**{**vars(args), **options})

    groups = [range(i, min(i + group, n_caches)) for i in range(0, n_caches, group)]
    return [
        ("as run", args),
        *(
            (
                f"L{g[0]}-{g[-1]} exact",
                changed(exact_layers=sorted({*args.exact_layers, *g})),
            )
            for g in groups
        ),
        *(
            (
                f"only L{g[0]}-{g[-1]} turbo",
                changed(exact_layers=[i for i in range(n_caches) if i not in g]),
            )
            for g in groups
        ),
        ("boundary 0", changed(boundary_skip=0)),
        ("boundary 4", changed(boundary_skip=4)),
        ("sinks 0", changed(sink_tokens=0)),
        ("sinks 64", changed(sink_tokens=64)),
    ]


def explain(model, tokenizer, results, schemes, args):
    """Where each answer that turned wrong left the uncompressed cache's: the logit gap
    between the uncompressed answer's token and the scheme's there (> 0: the
    uncompressed answer's token wins), under each cache variant."""
    eos = tokenizer.eos_token_id
    n_caches = len(mlx_make_prompt_cache(model))
    flips = [
        (row, scheme)
        for row in results
        for scheme in schemes
        if row["reference"]["correct"] and not row["schemes"][scheme.name]["correct"]
    ]
    explained = []
    for n, (row, scheme) in enumerate(flips, 1):
        answer = row["schemes"][scheme.name]
        ref, got = row["reference"]["tokens"], answer["tokens"]
        at = answer["leading_tokens_equal"]
        ours = ref[at] if at < len(ref) else eos
        theirs = got[at] if at < len(got) else eos
        ids = prompt_tokens(tokenizer, row["question"]) + ref[:at]
        gaps = {
            "uncompressed": logit_gap(
                model, ids, build_cache(model, None, args), ours, theirs
            )
        }
        for label, options in explain_variants(n_caches, args, args.explain_group):
            cache = build_cache(model, scheme, options)
            gaps[label] = logit_gap(model, ids, cache, ours, theirs)
        explained.append(
            {
                "question": row["question"],
                "scheme": scheme.name,
                "at_token": at,
                "reference_token": tokenizer.decode([ours]),
                "scheme_token": tokenizer.decode([theirs]),
                "gaps": gaps,
            }
        )
        say(f"explained {n}/{len(flips)}: {row['question']!r} with {scheme.name}")
    return explained


def summarize(results, schemes):
    """Per scheme: counts over the questions the uncompressed cache answered correctly."""
    kept = [r for r in results if r["reference"]["correct"]]
    summary = {}
    for scheme in schemes:
        answers = [r["schemes"][scheme.name] for r in kept]
        summary[scheme.name] = {
            "questions": len(kept),
            "correct": sum(a["correct"] for a in answers),
            "identical": sum(a["identical"] for a in answers),
            "leading_tokens_equal": sum(a["leading_tokens_equal"] for a in answers),
            "reference_tokens": sum(a["reference_tokens"] for a in answers),
        }
    return summary


def report(record, show):
    """The results as text a person reads (markdown)."""
    results, summary = record["results"], record["summary"]
    reference_ok = sum(r["reference"]["correct"] for r in results)
    lines = [
        f"command: {record['command']}",
        f"date: {record['date']}  commit: {record['commit']}",
        f"model: {record['model']}  reference cache: {record['reference_cache']}",
        f"options: {json.dumps(record['options'])}",
        "",
        f"The uncompressed cache answers {reference_ok} of {len(results)} questions "
        "correctly; the counts below are over those questions.",
        "",
        "| scheme | correct | identical text | leading tokens equal |",
        "|---|---:|---:|---:|",
    ]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['correct']}/{s['questions']} | {s['identical']}/{s['questions']} | "
            f"{s['leading_tokens_equal']}/{s['reference_tokens']} |"
        )
    wrong_reference = [r["question"] for r in results if not r["reference"]["correct"]]
    if wrong_reference:
        lines += ["", "Answered wrongly with the uncompressed cache (not counted):"]
        lines += [f"- {q!r}" for q in wrong_reference]
    kept = [r for r in results if r["reference"]["correct"]]
    for name in summary:
        differing = [r for r in kept if not r["schemes"][name]["identical"]]
        # Wrong answers first: they are what a user would notice.
        differing.sort(key=lambda r: r["schemes"][name]["correct"])
        lines += [
            "",
            f"### {name}: {len(differing)} of {len(kept)} answers differ from the uncompressed cache's",
        ]
        for r in differing[:show]:
            a = r["schemes"][name]
            lines += [
                f"- {r['question']!r} ({'correct' if a['correct'] else 'WRONG'}, "
                f"{a['leading_tokens_equal']} leading tokens equal)",
                f"  - uncompressed: {r['reference']['text']!r}",
                f"  - {name}: {a['text']!r}",
            ]
        if len(differing) > show:
            lines.append(
                f"- ... {len(differing) - show} more (all answers: --out FILE)"
            )
    for e in record.get("explained", []):
        if e is record["explained"][0]:
            lines += [
                "",
                "### Why answers turned wrong",
                "Logit of the uncompressed answer's token minus the scheme's where the answers "
                "part, the same prefix forced (> 0: the uncompressed answer's token wins; "
                "Lx-y: cache entries):",
            ]
        lines += [
            "",
            f"{e['scheme']}, {e['question']!r}, answer token {e['at_token']}: "
            f"uncompressed {e['reference_token']!r}, {e['scheme']} {e['scheme_token']!r}",
            "",
            "| " + " | ".join(e["gaps"]) + " |",
            "|" + "---:|" * len(e["gaps"]),
            "| " + " | ".join(f"{g:+.2f}" for g in e["gaps"].values()) + " |",
        ]
    return "\n".join(lines)


def _commit():
    """This checkout's commit (+ "-dirty"), or "unknown" outside a git checkout."""
    here = Path(__file__).resolve().parent

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(here), *args], capture_output=True, text=True
        )

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _layer_list(text):
    try:
        return sorted({int(i) for i in text.split(",") if i.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer numbers, got {text!r}"
        ) from None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mlx-lm-turbo questions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", help="mlx-lm model directory (default: the embedded demo model)"
    )
    parser.add_argument(
        "--schemes",
        nargs="+",
        default=list(DEFAULT_SCHEMES),
        help=f"TurboQuant schemes to compare with the uncompressed cache (default: {' '.join(DEFAULT_SCHEMES)})",
    )
    parser.add_argument(
        "--questions",
        default=str(QUESTIONS),
        help="questions file (default: the set shipped with the package)",
    )
    parser.add_argument("--out", help="write every answer and the counts as JSON here")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"longest answer in tokens (default: {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--show",
        type=int,
        default=5,
        help="differing answers printed per scheme (default: 5)",
    )
    measure = parser.add_argument_group(
        "measurement options (change only the caches this command builds)"
    )
    measure.add_argument(
        "--boundary-skip",
        type=int,
        default=DEFAULT_BOUNDARY_SKIP,
        help=f"first/last N attention layers kept at 8 bits (default: {DEFAULT_BOUNDARY_SKIP})",
    )
    measure.add_argument(
        "--sink-tokens",
        type=int,
        help="first tokens kept exact in each turbo cache (default: the cache's own)",
    )
    add_recent_exact_option(measure)
    measure.add_argument(
        "--key-calibration",
        choices=KEY_CALIBRATIONS,
        help="key calibration of the turbo caches (default: the codec's)",
    )
    measure.add_argument(
        "--exact-layers",
        type=_layer_list,
        default=[],
        metavar="I,J,...",
        help="cache entries given mlx-lm's uncompressed cache instead of a turbo one",
    )
    measure.add_argument(
        "--explain",
        action="store_true",
        help="for each answer that turned wrong, the logit gap where it left the uncompressed one "
        "under other cache variants (layer groups exact, boundary, sinks)",
    )
    measure.add_argument(
        "--explain-group",
        type=int,
        default=5,
        metavar="N",
        help="cache entries per layer group in --explain (default: 5)",
    )
    args = parser.parse_args(argv)
    schemes = compared_schemes(parser, args.schemes, "the uncompressed cache")
    if args.max_tokens < 1:
        parser.error(f"--max-tokens must be at least 1, got {args.max_tokens}.")
    if args.show < 0:
        parser.error(f"--show must be >= 0, got {args.show}.")
    if args.boundary_skip < 0:
        parser.error(f"--boundary-skip must be >= 0, got {args.boundary_skip}.")
    if args.explain_group < 1:
        parser.error(f"--explain-group must be at least 1, got {args.explain_group}.")
    if args.sink_tokens is not None and args.sink_tokens < 0:
        parser.error(f"--sink-tokens must be >= 0, got {args.sink_tokens}.")
    questions = load_questions(args.questions)

    if args.model is None:
        from .gguf import demo_model_path

        args.model = str(demo_model_path())
    model, tokenizer = load_model(args.model)
    for scheme in schemes:  # a refused model or scheme fails before anything runs
        plan(model, scheme, boundary_skip=args.boundary_skip, model_path=args.model)
    reference = mlx_make_prompt_cache(model)
    if any(i >= len(reference) for i in args.exact_layers):
        raise UsageError(
            f"--exact-layers names entries beyond the model's {len(reference)} caches "
            f"(0-{len(reference) - 1})."
        )
    reference_cache = "uncompressed"
    if hasattr(reference[0], "keys"):
        # mlx-lm allocates its buffer on the first update: one token shows the dtype.
        model(mx.array([[0]]), cache=reference)
        reference_cache += f" ({str(reference[0].keys.dtype).split('.')[-1]})"

    say(
        f"{len(questions)} questions, uncompressed and {' '.join(s.name for s in schemes)}"
    )
    # Taken before the run: the code that runs is the code checked out now.
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = _commit()
    results = run_questions(model, tokenizer, questions, schemes, args)
    record = {
        "command": " ".join(["mlx-lm-turbo questions", *(argv or sys.argv[1:])]),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "model": args.model,
        "reference_cache": reference_cache,
        "options": {
            "max_tokens": args.max_tokens,
            "boundary_skip": args.boundary_skip,
            "sink_tokens": args.sink_tokens,
            "key_calibration": args.key_calibration,
            "recent_exact": args.recent_exact,
            "exact_layers": args.exact_layers,
        },
        "summary": summarize(results, schemes),
        "results": results,
    }
    if args.explain:
        record["explained"] = explain(model, tokenizer, results, schemes, args)
    print(report(record, args.show))
    if args.out:
        Path(args.out).write_text(
            json.dumps(record, indent=1, ensure_ascii=False) + "\n"
        )
        say(f"every answer written to {args.out}")
    return 0
