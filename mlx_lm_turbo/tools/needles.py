"""``mlx-lm-turbo needles``: needle retrieval measured closely enough to tell caches apart.

Each trial hides a needle in a slice of Pride and Prejudice, at a random depth of a
random slice, and ends the prompt with a cue: a passphrase (``phrase``: a word) or a
numeric passkey (``passkey``: five digits). The answer's tokens are then fed one at a
time after the prompt, as decoding runs (teacher-forced), under an fp16 cache and each
compared cache, on the same prompts. Per trial:

- the answer's log-probability, summed over its tokens; a cache's loss is fp16's
  minus its own on the same prompt (paired), reported as the mean with its 95%
  interval (normal approximation: meant for the 200 or more trials that can tell);
- found: greedy decoding would give the answer (each of its tokens the most likely);
  retention is the share of the needles fp16 finds that the cache finds too.

Small on CPU (``--contexts 256 --trials 20``), full on a GPU (``--contexts 8192 16384
--trials 200``).
"""

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

import mlx.core as mx

from ..defaults import DEFAULT_BOUNDARY_SKIP
from . import add_recent_exact_option
from .bench import CacheKind, activation_dtype, book_tokens
from .gguf import add_model_argument, resolve_model
from .quality import teacher_forced_logprobs

# Completion, not a chat question: a small model retrieves by copying from context
# (which is what compressed keys can break), not by following instructions.
KINDS = {
    "phrase": (
        "The secret passphrase is {answer}.",
        "\n\nAs mentioned above, the secret passphrase is",
    ),
    "passkey": (
        "The pass key is {answer}. Remember it. {answer} is the pass key.",
        "\n\nWhat is the pass key? The pass key is",
    ),
}
WORDS = (
    "tangerine lighthouse marmalade saxophone avalanche porcupine harpsichord "
    "cinnamon telescope kangaroo blueberry volcano chameleon accordion dandelion "
    "hurricane pineapple trampoline submarine butterscotch"
).split()
Z_95 = 1.959964


def answer_text(kind, rng):
    return rng.choice(WORDS) if kind == "phrase" else str(rng.randrange(10000, 100000))


def trial_tokens(tokenizer, kind, context, answer, depth, start):
    """(prompt, answer tokens): about ``context`` tokens of the book from ``start`` with
    the needle at ``depth``, the cue; the answer's tokens as they follow the cue (from
    the first where the cue alone and the cue with the answer differ: a tokenizer may
    merge across the space)."""

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    needle_text, cue_text = KINDS[kind]
    needle = encode(" " + needle_text.format(answer=answer) + " ")
    cue, full = encode(cue_text), encode(cue_text + " " + answer)
    shared = next((i for i, (a, b) in enumerate(zip(cue, full)) if a != b), len(cue))
    size = max(context - len(needle) - len(cue), 16)
    haystack = book_tokens(tokenizer, size, start).tolist()
    at = int(depth * len(haystack))
    return haystack[:at] + needle + haystack[at:] + cue[:shared], full[shared:]


def score(model, kind, prompt, answer):
    """(the answer's log-probability, whether greedy decoding gives it)."""
    tokens = mx.array(prompt + answer)
    logprobs = teacher_forced_logprobs(
        model, tokens, kind.make(model), len(prompt), kind.after_prefill
    )
    targets = mx.array(answer)
    picked = mx.take_along_axis(logprobs, targets[:, None], axis=-1)
    found = mx.all(logprobs.argmax(axis=-1) == targets).item()
    return picked.sum().item(), bool(found)


def run(args, checkpoint=lambda trials: None):
    from ..attach.preflight import load_model

    args.model = resolve_model(args.model)
    model, tokenizer = load_model(args.model)
    dtype = activation_dtype(model, "auto")
    if dtype is not None:
        model.set_dtype(dtype)
    kinds = [CacheKind("fp16", args.boundary_skip)] + [
        CacheKind(name, args.boundary_skip, args.recent_exact) for name in args.caches
    ]
    rng = random.Random(args.seed)
    trials = []
    for context in args.contexts:
        for needle in args.kinds:
            for trial in range(args.trials):
                answer = answer_text(needle, rng)
                depth, start = rng.uniform(0.05, 0.95), rng.uniform(0.05, 0.6)
                prompt, answer_tokens = trial_tokens(
                    tokenizer, needle, context, answer, depth, start
                )
                row = {
                    "kind": needle,
                    "context": context,
                    "trial": trial,
                    "depth": depth,
                    "start": start,
                    "answer": answer,
                    "caches": {},
                }
                for kind in kinds:
                    logprob, found = score(model, kind, prompt, answer_tokens)
                    row["caches"][kind.name] = {"logprob": logprob, "found": found}
                trials.append(row)
                checkpoint(trials)
                print(
                    f"[needles] {needle} {context} tokens, trial {trial + 1}: "
                    + " ".join(
                        f"{name}={'Y' if r['found'] else 'n'} ({r['logprob']:.2f})"
                        for name, r in row["caches"].items()
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    return trials


def summary(trials):
    """One row per (needle kind, context, cache): trials, fp16's finds, the cache's,
    retention, the mean loss against fp16 and its 95% interval."""
    rows = []
    groups = {}
    for t in trials:
        groups.setdefault((t["kind"], t["context"]), []).append(t["caches"])
    for (kind, context), runs in groups.items():
        for name in list(runs[0])[1:]:
            losses = [r["fp16"]["logprob"] - r[name]["logprob"] for r in runs]
            mean = statistics.fmean(losses)
            half = (
                Z_95 * statistics.stdev(losses) / math.sqrt(len(losses))
                if len(losses) > 1
                else math.inf
            )
            reference = sum(r["fp16"]["found"] for r in runs)
            both = sum(r["fp16"]["found"] and r[name]["found"] for r in runs)
            rows.append(
                {
                    "kind": kind,
                    "context": context,
                    "cache": name,
                    "trials": len(runs),
                    "fp16_found": reference,
                    "found": sum(r[name]["found"] for r in runs),
                    "retention": both / reference if reference else math.nan,
                    "loss": mean,
                    "loss_low": mean - half,
                    "loss_high": mean + half,
                }
            )
    return rows


def markdown(rows):
    lines = [
        "| needle | context | cache | trials | found (fp16) | retention | "
        "log p loss vs fp16 (95% interval) |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['context']} | {r['cache']} | {r['trials']} | "
            f"{r['found']} ({r['fp16_found']}) | {r['retention']:.1%} | "
            f"{r['loss']:+.3f} ({r['loss_low']:+.3f}, {r['loss_high']:+.3f}) |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mlx-lm-turbo needles",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_argument(parser)
    parser.add_argument(
        "--caches",
        nargs="+",
        default=["turbo4"],
        help="caches compared with fp16: turbo schemes, affine<bits> (default: turbo4)",
    )
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024])
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument(
        "--trials", type=int, default=200, help="per needle kind and context"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--boundary-skip", type=int, default=DEFAULT_BOUNDARY_SKIP)
    add_recent_exact_option(parser)
    parser.add_argument("--out", help="write every trial and the summary here (JSON)")
    args = parser.parse_args(argv)
    try:
        for name in args.caches:
            if CacheKind(name, args.boundary_skip).name == "fp16":
                parser.error("--caches: fp16 is the reference; list the others.")
    except ValueError as error:
        parser.error(f"--caches: {error}")
    if args.trials < 1 or min(args.contexts) < 64:
        parser.error("--trials must be at least 1 and --contexts at least 64.")

    out = Path(args.out) if args.out else None

    def checkpoint(trials):
        if out is not None:
            out.write_text(json.dumps({"trials": trials}, indent=1))

    trials = run(args, checkpoint)
    rows = summary(trials)
    if out is not None:
        record = {"options": vars(args), "device": str(mx.default_device())}
        out.write_text(json.dumps({**record, "summary": rows, "trials": trials}))
    print(markdown(rows))
    return 0
