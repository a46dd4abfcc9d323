"""``mlx-lm-turbo bench``: quality, memory and speed of KV caches on a real model.

For every cache it measures, side by side in one run against an fp16 cache:
bits per value and KV bytes per token; KL divergence of next-token
distributions, perplexity and top-1 agreement (a book slice of each context
length prefilled, then decoded one token at a time, teacher-forced); needle
retrieval at several depths and context lengths (found or not, and the
log-probability of the passphrase's first token, a margin that a few trials'
hits and misses hide); prefill and decode speed as
ratios to fp16 (``--speed-rounds N``: the median of N rounds of every cache timed in
turn); and peak memory while prefilling the longest context. It writes
results.json, results.md, kl_vs_bits.png and memory_vs_context.png.

Two bit counts per cache: the scheme's (codes and norms, what each further token
costs) and all in (every array the cache holds after the run, as a saved file holds
it: exact sink tokens, exact recent tokens, key statistics, uncompressed layers),
divided by the values held. ``--recent-exact W ...`` runs each turbo cache once per
W; a row ``turbo3 r32`` is turbo3 with each query also reading the 31 tokens before
it exactly (``--turbo-recent-exact 32`` of the mlx-lm commands).

The affine rows are mlx-lm's ``--kv-bits`` quantization (group 64) applied after
an fp16 prefill, attended in dequantized form (same error; runs on every
backend), so their memory is computed from their storage format, not measured.
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from ..defaults import DEFAULT_BOUNDARY_SKIP, DEFAULT_RECENT_EXACT
from .gguf import add_model_argument
from .quality import affine_after_prefill, compare, teacher_forced_logprobs

BOOK = Path(__file__).with_name("data") / "pride-and-prejudice.txt"
DEFAULT_CACHES = (
    "fp16",
    "affine8",
    "affine4",
    "affine3",
    "affine2",
    "turbo8",
    "turbo4",
    "turbo3",
    "turbo2",
    "turbo4v2",
    "turbo4v3",
    "turbo8v4",
    "turbo0v4",
    "turbo0v2",
)
AFFINE_GROUP = 64
AFFINE_BITS = ("2", "3", "4", "5", "6", "8")  # what mx.quantize takes
NEEDLE = "The secret passphrase is {word}."
NEEDLE_WORDS = (
    "tangerine",
    "lighthouse",
    "marmalade",
    "saxophone",
    "avalanche",
    "porcupine",
)
# Completion, not a chat question: a 135M model retrieves by copying from context
# (which is what compressed keys can break), not by following instructions.
CUE = "\n\nAs mentioned above, the secret passphrase is"
# Where each needle trial's book slice starts (fractions of the book): a 32K-token
# slice from each still ends inside it (checked with both known models' tokenizers).
# The first four were all there were before: a run of 8 trials repeats their prompts.
NEEDLE_TRIAL_STARTS = (0.1, 0.25, 0.4, 0.55, 0.175, 0.3, 0.475, 0.625)


def say(message):
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def book_tokens(tokenizer, n, start=0.1):
    """The first ``n`` tokens of a book slice from ``start`` (a fraction of the book;
    0.1: past the front matter), led by the tokenizer's BOS where it adds one, as a
    prompt is (Gemma 3 without it: twice the perplexity, and another model to
    compress)."""
    text = BOOK.read_text()
    at = int(len(text) * start)
    tokens = tokenizer.encode(text[at : at + 8 * n])
    if len(tokens) < n:
        raise ValueError(f"The book has fewer than {n} tokens after its front matter.")
    return mx.array(tokens[:n])


class CacheKind:
    """One row of the benchmark: how to build the cache, and what it stores per value."""

    def __init__(self, name, boundary_skip, recent_exact=DEFAULT_RECENT_EXACT):
        from ..cache.common import check_recent_exact
        from ..codec.schemes import parse_scheme

        self.name, self.boundary_skip = name, boundary_skip
        self.recent_exact = check_recent_exact(recent_exact)
        self.affine_bits = None
        if name.startswith("affine"):
            if name[6:] not in AFFINE_BITS:
                raise ValueError(
                    f"Unknown cache {name!r}: affine caches are affine{'/'.join(AFFINE_BITS)}."
                )
            self.affine_bits = int(name[6:])
        self.scheme = None if name == "fp16" or self.affine_bits else parse_scheme(name)
        if self.scheme is not None and recent_exact != DEFAULT_RECENT_EXACT:
            self.name = f"{name} r{recent_exact}"

    def make(self, model):
        from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

        from ..plugin.prompt_cache import make_prompt_cache

        if self.scheme is None:
            return mlx_make_prompt_cache(model)
        return make_prompt_cache(
            model,
            self.scheme,
            boundary_skip=self.boundary_skip,
            recent_exact=self.recent_exact,
        )

    @property
    def after_prefill(self):
        return (
            affine_after_prefill(self.affine_bits, AFFINE_GROUP)
            if self.affine_bits
            else None
        )

    def bits_per_value(self, cache, dtype_bits):
        if self.affine_bits:
            return (
                self.affine_bits + 2 * 16 / AFFINE_GROUP
            )  # fp16 scale and bias per group
        if self.scheme is None:
            return dtype_bits
        stored = values = 0
        for c in cache:
            if hasattr(c, "codec"):
                arrays = c._stored_slice()
                stored += sum(a.nbytes for a in arrays)
                values += _values_held(c, arrays)
        return 8 * stored / values

    def bits_all_in(self, cache):
        """Bits per value held, counting every array the cache keeps (as ``state``
        saves it: sink and recent tokens, key statistics, uncompressed layers)."""
        if self.affine_bits:  # mlx-lm quantizes every token, nothing kept aside
            return self.bits_per_value(cache, None)
        held = values = 0
        for c in cache:
            if not hasattr(c, "codec") and getattr(c, "keys", None) is None:
                continue  # a recurrent layer's state (hybrid models): no keys, no values
            arrays = [a for a in c.state if isinstance(a, mx.array)]
            held += sum(a.nbytes for a in arrays)
            values += _values_held(c, arrays)
        return 8 * held / values


def _values_held(c, state_arrays):
    """K and V values of the tokens one layer's cache holds (a sliding window holds
    at most its size)."""
    if not hasattr(c, "codec"):  # mlx-lm's caches: state is (keys, values)
        return sum(a.size for a in state_arrays[:2])
    if c.codec is None:  # a turbo cache still uncompressed, or empty
        return (
            0
            if c.uncompressed is None
            else sum(c.uncompressed.state[i].size for i in (0, 1))
        )
    tokens = c._stored_slice()[0]
    heads = c.codec.n_kv_heads
    return (
        tokens.shape[0]
        * tokens.shape[2]
        * heads
        * (c.codec.key_dim + c.codec.value_dim)
    )


def add_recent_exact_argument(parser):
    """``--recent-exact W ...``, which ``cache_kinds`` reads."""
    parser.add_argument(
        "--recent-exact",
        type=int,
        nargs="+",
        default=[DEFAULT_RECENT_EXACT],
        metavar="W",
        help="run each turbo cache with each query also reading the W - 1 tokens "
        f"before it exactly, once per W (default: {DEFAULT_RECENT_EXACT})",
    )


def cache_kinds(args):
    """The benchmark's rows: each turbo cache once per ``--recent-exact`` width."""
    kinds = []
    for name in args.caches:
        turbo = CacheKind(name, args.boundary_skip).scheme is not None
        widths = dict.fromkeys(args.recent_exact) if turbo else [DEFAULT_RECENT_EXACT]
        kinds += [CacheKind(name, args.boundary_skip, w) for w in widths]
    return kinds


def uncompressed_kv(model):
    """(dtype, K and V values one token adds across all KV layers), read off an fp16
    cache: the dtype the model's keys and values come in, which a quantized model's
    parameters (float16 scales, float32 norms) do not tell."""
    from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

    cache = mlx_make_prompt_cache(model)
    model(mx.array([[1, 2]]), cache=cache)
    layers = [c for c in cache if getattr(c, "keys", None) is not None]
    per_token = sum(
        c.keys.shape[1] * (c.keys.shape[3] + c.values.shape[3]) for c in layers
    )
    return layers[0].keys.dtype, per_token


def needle_prompt(tokenizer, context, depth, word, start=0.1):
    """A book slice (from ``start``, as ``book_tokens``) of about ``context`` tokens with
    the needle sentence at ``depth``, then the cue."""

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    needle, cue = encode(" " + NEEDLE.format(word=word) + " "), encode(CUE)
    haystack = book_tokens(
        tokenizer, max(context - len(needle) - len(cue), 16), start
    ).tolist()
    at = int(depth * len(haystack))
    return haystack[:at] + needle + haystack[at:] + cue


def answer_token(tokenizer, word):
    """The passphrase's first token as it follows the cue: the first where the cue's
    tokens and those of the cue with the passphrase differ (a tokenizer may merge
    across the space)."""
    cue = tokenizer.encode(CUE, add_special_tokens=False)
    answer = tokenizer.encode(CUE + " " + word, add_special_tokens=False)
    shared = next((i for i, (a, b) in enumerate(zip(cue, answer)) if a != b), len(cue))
    return answer[shared]


def retrieve(model, tokenizer, kind, prompt, word, max_tokens=6):
    """(whether the greedy answer holds the passphrase, the log-probability the model
    gives the passphrase's first token right after the cue): the second tells how
    near a found needle was to being lost, or a lost one to being found."""
    from mlx_lm import stream_generate

    cache = kind.make(model)
    if kind.affine_bits:  # prefill in fp16, then quantize, as --kv-bits does
        model(mx.array(prompt[:-1])[None], cache=cache)
        cache = kind.after_prefill(cache)
        prompt = prompt[-1:]
    responses = list(
        stream_generate(
            model, tokenizer, prompt, max_tokens=max_tokens, prompt_cache=cache
        )
    )
    text = "".join(r.text for r in responses)
    logprob = responses[0].logprobs[answer_token(tokenizer, word)].item()
    return word in text.lower(), logprob


def timed_round(model, tokens, context, kinds, rows):
    """One more round of ``rows``' caches timed in turn on the same tokens: each row
    gains its ratios to the first cache's times in this round, and its speeds become
    the medians of its rounds' (the host's speed moves between and within runs)."""
    times = []
    for kind in kinds:
        timings = {}
        teacher_forced_logprobs(
            model, tokens, kind.make(model), context, kind.after_prefill, timings
        )
        times.append(timings)
    for row, timings in zip(rows, times):
        for phase in ("prefill", "decode"):
            ratios = row[f"{phase}_speed_rounds"]
            ratios.append(times[0][f"{phase}_seconds"] / timings[f"{phase}_seconds"])
            row[f"{phase}_speed_vs_fp16"] = statistics.median(ratios)


def peak_prefill_memory(model, kind, tokens, chunk=512):
    """Peak memory above what was in use before, prefilling ``tokens`` in chunks."""
    cache = kind.make(model)
    mx.clear_cache()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    for start in range(0, tokens.size, chunk):
        model(tokens[None, start : start + chunk], cache=cache)
        mx.eval([c.state for c in cache])
    return mx.get_peak_memory() - base


def activation_dtype(model, choice):
    """The dtype ``--dtype choice`` runs the model in; None: as it was loaded.

    ``auto``: as loaded on CPU; on a GPU 16-bit, bfloat16 where the model holds bfloat16
    weights (models trained in it, Gemma's among them, can overflow float16's range),
    else float16."""
    if choice == "model" or (choice == "auto" and mx.default_device() != mx.gpu):
        return None
    if choice != "auto":
        return getattr(mx, choice)
    held = {v.dtype for _, v in tree_flatten(model.parameters())}
    return mx.bfloat16 if mx.bfloat16 in held else mx.float16


def run(args, checkpoint=lambda results: None):
    from ..attach.preflight import load_model
    from ..plugin.prompt_cache import plan
    from .gguf import resolve_model

    model_path = resolve_model(args.model)
    model, tokenizer = load_model(model_path)
    dtype = activation_dtype(model, args.dtype)
    if dtype is not None:
        model.set_dtype(dtype)
    kinds = cache_kinds(args)
    for kind in kinds:  # a refused model or scheme fails before anything is measured
        if kind.scheme is not None:
            plan(
                model,
                kind.scheme,
                boundary_skip=args.boundary_skip,
                model_path=model_path,
            )
    dtype, per_token = uncompressed_kv(model)
    results = {
        "model": model_path,
        "device": str(mx.default_device()),
        "dtype": str(dtype).split(".")[-1],
        "decode_steps": args.decode,
        "boundary_skip": args.boundary_skip,
        "rows": [],
        "needle": [],
        "peak_memory": [],
    }
    started = time.perf_counter()
    for context in args.contexts:
        tokens = book_tokens(tokenizer, context + args.decode)
        targets = tokens[context:]
        # Run every cache once at this length untimed: the first run of a kernel
        # at a new shape pays its JIT, which would skew the speed ratios.
        for kind in kinds if args.speed else []:
            teacher_forced_logprobs(
                model,
                tokens[: context + 2],
                kind.make(model),
                context,
                kind.after_prefill,
            )
        reference = None
        for kind in kinds:
            timings = {}
            cache = kind.make(model)
            logprobs = teacher_forced_logprobs(
                model, tokens, cache, context, kind.after_prefill, timings
            )
            if reference is None:
                reference, ref_timings = logprobs, timings
            row = {
                "cache": kind.name,
                "context": context,
                **compare(reference, logprobs, targets),
                "bits_per_value": kind.bits_per_value(cache, 8 * dtype.size),
                "bits_all_in": kind.bits_all_in(cache),
            }
            if kind.scheme is not None:
                row["recent_exact"] = kind.recent_exact
            if args.speed:
                for phase in ("prefill", "decode"):
                    row[f"{phase}_speed_rounds"] = [
                        ref_timings[f"{phase}_seconds"] / timings[f"{phase}_seconds"]
                    ]
                    row[f"{phase}_speed_vs_fp16"] = row[f"{phase}_speed_rounds"][0]
            row["kv_bytes_per_token"] = row["bits_per_value"] / 8 * per_token
            results["rows"].append(row)
            say(
                f"{context:>6} tokens  {kind.name:<9} KL {row['kl']:.4f}  top-1 {row['top1']:.3f}  "
                f"ppl {row['ppl']:.2f}  ({time.perf_counter() - started:.0f}s)"
            )
            checkpoint(results)
        rows = results["rows"][-len(kinds) :]
        # round 1 is the quality runs' own timing; later rounds time every cache again
        for round_ in range(1, args.speed_rounds + 1 if args.speed else 0):
            if round_ > 1:
                timed_round(model, tokens, context, kinds, rows)
            say(
                f"{context:>6} tokens  speed round {round_}: decode "
                + " ".join(
                    f"{r['cache']} {r['decode_speed_rounds'][-1]:.2f}x" for r in rows
                )
            )
            checkpoint(results)

    depths = args.needle_depths
    trials = [(t, d) for t in range(args.needle_trials) for d in enumerate(depths)]
    for context in args.needle_contexts:
        for trial, (i, depth) in trials:
            # each trial: another slice of the book, other passphrases
            word = NEEDLE_WORDS[(i + trial * len(depths)) % len(NEEDLE_WORDS)]
            start = NEEDLE_TRIAL_STARTS[trial]
            prompt = needle_prompt(tokenizer, context, depth, word, start)
            for kind in kinds:
                found, logprob = retrieve(model, tokenizer, kind, prompt, word)
                results["needle"].append(
                    {
                        "cache": kind.name,
                        "context": context,
                        "depth": depth,
                        "trial": trial,
                        "found": found,
                        "answer_logprob": logprob,
                    }
                )
            checkpoint(results)
            say(
                f"needle {context} tokens at depth {depth:.2f} (trial {trial + 1}): "
                + " ".join(
                    f"{k.name}={'Y' if r['found'] else 'n'} ({r['answer_logprob']:.2f})"
                    for k, r in zip(kinds, results["needle"][-len(kinds) :])
                )
            )

    if args.memory_context:
        tokens = book_tokens(tokenizer, args.memory_context)
        for kind in kinds:
            if kind.affine_bits:
                continue
            peak = peak_prefill_memory(model, kind, tokens)
            results["peak_memory"].append(
                {"cache": kind.name, "context": args.memory_context, "bytes": peak}
            )
            say(
                f"peak memory prefilling {args.memory_context} tokens, {kind.name}: {peak / 2**20:.1f} MiB"
            )
    results["values_per_token"] = per_token
    return results


def _fmt_needle(results, name):
    hits = [r["found"] for r in results["needle"] if r["cache"] == name]
    return f"{sum(hits)}/{len(hits)}" if hits else "-"


def _fmt_answer_logprob(results, name, reference):
    """The mean log-probability of the passphrase's first token and, beside it, the
    mean difference from ``reference``'s on the same prompts with its standard error
    ("-" in results from before it was recorded)."""

    def by_prompt(cache):
        return {
            (r["context"], r["depth"], r["trial"]): r["answer_logprob"]
            for r in results["needle"]
            if r["cache"] == cache and "answer_logprob" in r
        }

    mine, theirs = by_prompt(name), by_prompt(reference)
    if not mine:
        return "-"
    text = f"{statistics.fmean(mine.values()):.2f}"
    shared = mine.keys() & theirs.keys()
    if name != reference and shared:
        deltas = [mine[k] - theirs[k] for k in shared]
        text += f" ({statistics.fmean(deltas):+.2f}"
        if len(deltas) > 1:
            text += f" ± {statistics.stdev(deltas) / math.sqrt(len(deltas)):.2f}"
        text += ")"
    return text


def _fmt_speed(row, phase):
    speed = row.get(f"{phase}_speed_vs_fp16")  # absent in a --no-speed run
    if speed is None:
        return "-"
    rounds = row.get(f"{phase}_speed_rounds", [])
    if len(rounds) < 2:
        return f"{speed:.2f}x"
    return f"{speed:.2f}x ({min(rounds):.2f}-{max(rounds):.2f})"


def markdown(results):
    # results from before the rows recorded their window (--from-json) had W 1 unnamed
    default_window = (
        f"; a turbo row without r: {DEFAULT_RECENT_EXACT - 1} (the default)"
        if any("recent_exact" in r for r in results["rows"])
        else ""
    )
    lines = [
        f"Model `{results['model']}` on {results['device']}, {results['dtype']} keys and values uncompressed; "
        f"{results['decode_steps']} teacher-forced decode steps after each context; "
        f"boundary skip {results['boundary_skip']}. bits/value: the scheme's codes "
        "and norms; all in: every array the cache holds after the longest context "
        "and its decode steps, per value held (exact sink and recent tokens "
        "included). A row `turbo3 r32`: each query also reads the 31 tokens before "
        f"it exactly (--recent-exact){default_window}.",
        "",
    ]
    rounds = max(
        (len(r.get("decode_speed_rounds", [])) for r in results["rows"]), default=0
    )
    if rounds > 1:
        lines[-1:-1] = [
            f"Speeds: the median over {rounds} rounds of every cache timed in turn of "
            "each round's ratio to fp16, the rounds' lowest and highest in brackets.",
        ]
    contexts = sorted({r["context"] for r in results["rows"]})
    header = "| cache | bits/value | all in | KV bytes/token |"
    for c in contexts:
        header += f" KL @{c} | top-1 @{c} | ppl @{c} |"
    header += " needle | needle log p | prefill vs fp16 | decode vs fp16 |"
    lines += [header, "|---" * (header.count("|") - 1) + "|"]
    names = list(dict.fromkeys(r["cache"] for r in results["rows"]))
    for name in names:
        rows = {r["context"]: r for r in results["rows"] if r["cache"] == name}
        last = rows[contexts[-1]]
        all_in = f"{last['bits_all_in']:.3f}" if "bits_all_in" in last else "-"
        line = (
            f"| {name} | {last['bits_per_value']:.3f} | {all_in} |"
            f" {last['kv_bytes_per_token']:.0f} |"
        )
        for c in contexts:
            line += (
                f" {rows[c]['kl']:.4f} | {rows[c]['top1']:.3f} | {rows[c]['ppl']:.2f} |"
            )
        line += (
            f" {_fmt_needle(results, name)} |"
            f" {_fmt_answer_logprob(results, name, names[0])} |"
            f" {_fmt_speed(last, 'prefill')} |"
            f" {_fmt_speed(last, 'decode')} |"
        )
        lines.append(line)
    if results["peak_memory"]:
        fp16 = next(m["bytes"] for m in results["peak_memory"] if m["cache"] == "fp16")
        lines += [
            "",
            f"Peak memory above the model while prefilling {results['peak_memory'][0]['context']} tokens:",
            "",
            "| cache | peak (MiB) | vs fp16 |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {m['cache']} | {m['bytes'] / 2**20:.1f} | {m['bytes'] / fp16:.2f}x |"
            for m in results["peak_memory"]
        ]
    return "\n".join(lines) + "\n"


def _finish(plt, fig, ax, path, xlabel, ylabel):
    """Log-scale y, labels, grid and legend, then save and close the figure."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a run of fp16 alone plots nothing
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plots(results, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    context = max(r["context"] for r in results["rows"])
    rows = [
        r for r in results["rows"] if r["context"] == context and r["cache"] != "fp16"
    ]
    # all in where the run counted it (results.json files before it did not)
    bits = "bits_all_in" if all("bits_all_in" in r for r in rows) else "bits_per_value"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for family, marker in (("turbo", "o"), ("affine", "s")):
        pts = sorted(
            (r[bits], max(r["kl"], 1e-6), r["cache"])
            for r in rows
            if r["cache"].startswith(family)
        )
        if pts:
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker=marker,
                linestyle="-" if family == "affine" else "",
                label=f"{family} (mlx-lm --kv-bits)"
                if family == "affine"
                else "TurboQuant",
            )
            for x, y, name in pts:
                ax.annotate(
                    name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7
                )
    _finish(
        plt,
        fig,
        ax,
        out_dir / "kl_vs_bits.png",
        "bits per value" + (", all in" if bits == "bits_all_in" else ""),
        f"KL vs fp16 cache (nats/token), {context}-token context",
    )

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lengths = [2**k for k in range(10, 18)]
    per_row = {
        r["cache"]: r["kv_bytes_per_token"]
        for r in results["rows"]
        if r["context"] == context
    }
    for name in ("fp16", "affine8", "affine4", "turbo8", "turbo4", "turbo3", "turbo2"):
        if name in per_row:
            ax.plot(
                lengths,
                [per_row[name] * n / 2**30 for n in lengths],
                marker=".",
                label=name,
            )
    for m in results["peak_memory"]:
        ax.scatter([m["context"]], [m["bytes"] / 2**30], marker="x", color="black")
    ax.set_xscale("log", base=2)
    _finish(
        plt,
        fig,
        ax,
        out_dir / "memory_vs_context.png",
        "context length (tokens)",
        "KV cache (GiB); x = measured peak prefill memory",
    )


def write(results, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    (out_dir / "results.md").write_text(markdown(results))
    try:
        plots(results, out_dir)
        wrote = "results.json, results.md, kl_vs_bits.png and memory_vs_context.png"
    except ImportError:
        say('matplotlib is not installed: no plots (pip install "mlx-lm-turbo[bench]")')
        wrote = "results.json and results.md"
    say(f"wrote {wrote} in {out_dir}")


def _check_options(parser, args):
    """Bad options fail here, before the model loads."""
    from ..cache.common import check_recent_exact

    try:
        for name in args.caches:
            CacheKind(name, args.boundary_skip)
    except ValueError as error:
        parser.error(f"--caches: {error}")
    try:
        for recent in args.recent_exact:
            check_recent_exact(recent)
    except ValueError as error:
        parser.error(f"--recent-exact: {error}")
    if args.caches[0] != "fp16":
        parser.error(
            "--caches must start with fp16: every ratio is measured against it."
        )
    for option, values, least in [
        ("--contexts", args.contexts, 1),
        ("--decode", [args.decode], 1),
        ("--needle-contexts", args.needle_contexts, 1),
        ("--memory-context", [args.memory_context], 0),
        ("--boundary-skip", [args.boundary_skip], 0),
        ("--speed-rounds", [args.speed_rounds], 1),
    ]:
        if any(v < least for v in values):
            parser.error(
                f"{option} must be at least {least}, got {' '.join(map(str, values))}."
            )
    if any(not 0 <= d <= 1 for d in args.needle_depths):
        parser.error("--needle-depths are fractions of the context, from 0 to 1.")
    if not 1 <= args.needle_trials <= len(NEEDLE_TRIAL_STARTS):
        parser.error(
            f"--needle-trials must be 1 to {len(NEEDLE_TRIAL_STARTS)}, "
            f"got {args.needle_trials}."
        )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mlx-lm-turbo bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_argument(parser)
    parser.add_argument(
        "--caches",
        nargs="+",
        default=list(DEFAULT_CACHES),
        help="fp16 first, then affine<bits> and turbo schemes",
    )
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument(
        "--decode",
        type=int,
        default=256,
        help="teacher-forced decode steps per context",
    )
    parser.add_argument("--needle-contexts", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument(
        "--needle-depths", type=float, nargs="*", default=[0.1, 0.5, 0.9]
    )
    parser.add_argument(
        "--needle-trials",
        type=int,
        default=1,
        help="trials per needle context and depth, each on another slice of the book "
        f"with other passphrases (1 to {len(NEEDLE_TRIAL_STARTS)}; default: 1)",
    )
    parser.add_argument(
        "--memory-context",
        type=int,
        default=8192,
        help="0 to skip the peak-memory runs",
    )
    parser.add_argument("--boundary-skip", type=int, default=DEFAULT_BOUNDARY_SKIP)
    add_recent_exact_argument(parser)
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "model", "float16", "bfloat16", "float32"],
        help="activations' dtype; auto: the model's own on CPU, on a GPU bfloat16 for "
        "a model holding bfloat16 weights, else float16",
    )
    parser.add_argument(
        "--speed-rounds",
        type=int,
        default=1,
        help="time every cache this many times in turn at each context (the first "
        "round is the quality run's) and give the median of each round's ratio to "
        "fp16 (default: 1)",
    )
    parser.add_argument(
        "--no-speed",
        dest="speed",
        action="store_false",
        help="quality and memory only: no untimed warm-up run per cache and context "
        "(halves the time where prefill dominates, e.g. on CPU), no speed columns",
    )
    parser.add_argument("--out", default="bench-out")
    parser.add_argument(
        "--from-json",
        help="only rewrite the table and plots from an earlier results.json",
    )
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        parser.error(
            f"--out {args.out} is a file: give a directory (made if it is missing)."
        )
    if args.from_json:
        try:
            results = json.loads(Path(args.from_json).read_text())
        except (OSError, ValueError) as error:
            parser.error(f"--from-json: cannot read {args.from_json}: {error}")
        if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
            parser.error(
                f"--from-json: {args.from_json} holds no rows; give the results.json "
                "an earlier bench run wrote."
            )
        for phase in ("needle", "peak_memory"):  # a run cut off before these phases
            results.setdefault(phase, [])
        write(results, out_dir)
        return 0
    _check_options(parser, args)
    out_dir.mkdir(parents=True, exist_ok=True)
    # a long run killed half-way still leaves what it measured
    results = run(
        args,
        lambda partial: (out_dir / "results.json").write_text(
            json.dumps(partial, indent=1)
        ),
    )
    write(results, out_dir)
    print(markdown(results))
    return 0
