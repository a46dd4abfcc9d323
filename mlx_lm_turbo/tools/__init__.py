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
