"""The ``mlx-lm-turbo`` command's tools: demo, bench, questions, doctor, the GGUF converter."""

import argparse

from ..codec.schemes import parse_scheme
from ..defaults import DEFAULT_RECENT_EXACT


class _Window(argparse.Action):
    def __call__(self, parser, namespace, value, option_string=None):
        if value < 1:
            parser.error(f"--recent-exact must be at least 1, got {value}.")
        setattr(namespace, self.dest, value)


def add_recent_exact_option(group):
    """``--recent-exact W`` for the caches a tool builds, as the commands'
    ``--turbo-recent-exact``; below 1 is a usage error."""
    group.add_argument(
        "--recent-exact",
        type=int,
        default=DEFAULT_RECENT_EXACT,
        metavar="W",
        action=_Window,
        help="each query also reads the W - 1 tokens before it exactly "
        f"(--turbo-recent-exact; default: {DEFAULT_RECENT_EXACT})",
    )


def compared_schemes(parser, names, baseline):
    """The TurboQuant schemes a tool compares with ``baseline``; a bad name or 'none' is a
    usage error (exit 2) before any model loads."""
    try:
        schemes = [parse_scheme(name) for name in names]
    except ValueError as error:
        parser.error(f"--schemes: {error}")
    if None in schemes:
        parser.error(
            f"--schemes lists TurboQuant schemes to compare with {baseline}; drop 'none'."
        )
    return schemes


def generate(model, tokenizer, prompt, cache, max_tokens):
    """Greedy generation through mlx-lm's ``stream_generate``: (text, token ids, the
    last response, which carries the speeds)."""
    from mlx_lm.generate import stream_generate  # the tools that generate pay for it

    text, tokens, last = "", [], None
    for last in stream_generate(
        model, tokenizer, prompt, max_tokens=max_tokens, prompt_cache=cache
    ):
        text += last.text
        tokens.append(last.token)
    return text, tokens, last


def leading_equal(reference, other):
    """How many leading tokens two generations share."""
    n = 0
    for a, b in zip(reference, other):
        if a != b:
            break
        n += 1
    return n
