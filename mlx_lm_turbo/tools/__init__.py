"""The ``mlx-lm-turbo`` command's tools: demo, bench, questions, doctor, the GGUF converter."""

from ..codec.schemes import parse_scheme


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
