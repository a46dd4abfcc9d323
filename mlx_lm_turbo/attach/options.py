"""``--kv-scheme`` and friends on mlx-lm's own commands.

mlx-lm builds its parsers in different places (a module-level
``setup_arg_parser`` or inline in ``main``), so while a wrapped ``main`` runs,
the first ``ArgumentParser.parse_known_args`` call gets the TurboQuant options
added (they show in ``--help``) and its result validated into ``settings.active``.
"""

import argparse
import os
import sys
from contextlib import contextmanager

from .. import defaults, settings
from ..codec.schemes import parse_scheme

ENV_SCHEME = "MLX_LM_TURBO_KV_SCHEME"


def add_options(parser):
    group = parser.add_argument_group("TurboQuant KV cache (mlx-lm-turbo)")
    # Defaults are None so that apply_options knows what was typed and what came from the environment.
    group.add_argument(
        "--kv-scheme",
        help="compress the KV cache with TurboQuant: turbo4, turbo3, turbo2, turbo8, turbo4v2 "
        "(4-bit keys, 2-bit values), turbo5v3 (turbo4's bits, less error), turbo0v4 "
        "(fp16 keys), ... or none "
        f"(default: ${ENV_SCHEME}, else none)",
    )
    group.add_argument(
        "--turbo-boundary-skip",
        type=int,
        metavar="N",
        help="keep the first and last N attention layers at 8 bits (default: "
        f"{defaults.DEFAULT_BOUNDARY_SKIP}; {defaults.SPECULATIVE_BOUNDARY_SKIP} with a draft model)",
    )
    group.add_argument(
        "--turbo-uncompressed-start",
        type=int,
        metavar="N",
        help="keep the first N tokens uncompressed before compression starts (default: 0)",
    )
    group.add_argument(
        "--turbo-recent-exact",
        type=int,
        metavar="W",
        help="each query reads itself and the W - 1 tokens before it exactly, besides "
        "the first tokens (exact copies of the last W - 1 tokens are kept; such caches "
        "cannot be trimmed, so not above 1 with --draft-model) (default: "
        f"{defaults.DEFAULT_RECENT_EXACT}; {defaults.SPECULATIVE_RECENT_EXACT} with a draft model)",
    )


def requested_scheme(typed=None):
    """(scheme or None, where it came from): ``--kv-scheme`` when typed, else ``$MLX_LM_TURBO_KV_SCHEME``.

    A bad value raises ValueError naming its source.
    """
    source, text = (
        ("--kv-scheme", typed)
        if typed is not None
        else (f"${ENV_SCHEME}", os.environ.get(ENV_SCHEME))
    )
    if typed is not None and not typed.strip():  # else it would mean none, unseen
        raise ValueError(
            "--kv-scheme: give a scheme (turbo4, turbo3, ... or none), not an empty one."
        )
    try:
        return parse_scheme(text), source
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None


def apply_options(parser, args):
    """Validate the parsed options into ``settings.active``; usage errors exit via the parser."""
    settings.speculative = bool(getattr(args, "draft_model", None))
    try:
        scheme, source = requested_scheme(args.kv_scheme)
    except ValueError as error:
        parser.error(str(error))
    tuning = {
        "--turbo-boundary-skip": args.turbo_boundary_skip,
        "--turbo-uncompressed-start": args.turbo_uncompressed_start,
    }
    for option, value in tuning.items():
        if value is not None and value < 0:
            parser.error(f"{option} must be >= 0, got {value}.")
    recent_exact = args.turbo_recent_exact
    if recent_exact is not None and recent_exact < 1:
        parser.error(
            f"--turbo-recent-exact must be >= 1 (1: each query reads only itself exactly), "
            f"got {recent_exact}."
        )
    if recent_exact is not None:
        tuning["--turbo-recent-exact"] = recent_exact
    if scheme is None:
        settings.active = None
        typed = [
            f"{option} {value}" for option, value in tuning.items() if value is not None
        ]
        if typed:
            verb = "has" if len(typed) == 1 else "have"
            print(
                f"[mlx-lm-turbo] {' and '.join(typed)} {verb} no effect without --kv-scheme "
                "(the KV cache is not compressed).",
                file=sys.stderr,
            )
        return
    if getattr(args, "kv_bits", None) is not None:
        hint = (
            f" (unset {ENV_SCHEME} to use --kv-bits)" if source != "--kv-scheme" else ""
        )
        given = (
            f"{source} {scheme.name}"
            if source == "--kv-scheme"
            else f"{source}={scheme.name}"
        )
        parser.error(
            f"{given} and --kv-bits both compress the KV cache; use one of them"
            f"{hint}. --kv-scheme turbo4 is more accurate than --kv-bits 4 at fewer bits per value."
        )
    try:
        from ..compat import check_mlx_lm_version
        from ..kernels.dispatch import KERNEL_ENV, gpu_backend, kernel_mode

        check_mlx_lm_version()
        # a bad MLX_LM_TURBO_KERNEL fails now, not at the first attention
        if kernel_mode() == "on" and gpu_backend() == "metal":
            from ..cache.kernel_check import check_decode_kernel

            why_not = check_decode_kernel("metal")
            if why_not:
                parser.error(
                    f"{KERNEL_ENV}=on turns on the Metal decode kernel, which has not "
                    f"been verified on Apple GPUs, and on this machine {why_not}. Unset "
                    f"{KERNEL_ENV} (the portable path then serves), and please report it."
                )
    except (RuntimeError, ValueError) as error:
        parser.error(str(error))
    if (recent_exact or 1) > 1 and getattr(args, "draft_model", None):
        parser.error(
            f"--turbo-recent-exact {recent_exact} keeps exact copies of the last tokens only, "
            "so its caches cannot be trimmed, and speculative decoding (--draft-model) "
            "trims them: use --turbo-recent-exact 1 with --draft-model."
        )
    settings.active = settings.Settings(
        scheme=scheme,
        boundary_skip=args.turbo_boundary_skip,
        uncompressed_start=args.turbo_uncompressed_start or 0,
        recent_exact=recent_exact,
        model_path=getattr(args, "model", None),
    )


@contextmanager
def options_on_first_parser():
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        argparse.ArgumentParser.parse_known_args = original  # one shot
        if not any("--kv-scheme" in a.option_strings for a in self._actions):
            add_options(self)
        parsed, extra = original(self, args, namespace)
        apply_options(self, parsed)
        return parsed, extra

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original
