"""``--kv-scheme`` and friends on mlx-lm's own commands.

mlx-lm builds its parsers in different places (a module-level
``setup_arg_parser`` or inline in ``main``), so while a wrapped ``main`` runs,
the first ``ArgumentParser.parse_known_args`` call gets the TurboQuant options
added (they show in ``--help``) and its result validated into ``settings.active``.
"""

import argparse
import os
from contextlib import contextmanager

from . import settings
from .schemes import parse_scheme

ENV_SCHEME = "MLX_LM_TURBO_KV_SCHEME"


def add_options(parser):
    group = parser.add_argument_group("TurboQuant KV cache (mlx-lm-turbo)")
    group.add_argument(
        "--kv-scheme", default=os.environ.get(ENV_SCHEME),
        help="compress the KV cache with TurboQuant: turbo4, turbo3, turbo2, turbo8, turbo4v2 "
             "(4-bit keys, 2-bit values), turbo0v4 (fp16 keys), ... or none "
             f"(default: ${ENV_SCHEME}, else none)")
    group.add_argument(
        "--turbo-boundary-skip", type=int, default=2, metavar="N",
        help="keep the first and last N attention layers at 8 bits (default: 2)")
    group.add_argument(
        "--turbo-uncompressed-start", type=int, default=0, metavar="N",
        help="keep the first N tokens uncompressed before compression starts (default: 0)")


def apply_options(parser, args):
    """Validate the parsed options into ``settings.active``; usage errors exit via the parser."""
    try:
        scheme = parse_scheme(args.kv_scheme)
    except ValueError as error:
        parser.error(str(error))
    if scheme is None:
        settings.active = None
        return
    if getattr(args, "kv_bits", None) is not None:
        parser.error("--kv-scheme and --kv-bits both compress the KV cache; use one of them "
                     "(--kv-scheme turbo4 is more accurate than --kv-bits 4 at fewer bits per value).")
    if args.turbo_boundary_skip < 0 or args.turbo_uncompressed_start < 0:
        parser.error("--turbo-boundary-skip and --turbo-uncompressed-start must be >= 0.")
    try:
        from .compat import check_mlx_lm_version

        check_mlx_lm_version()
    except RuntimeError as error:
        parser.error(str(error))
    settings.active = settings.Settings(
        scheme=scheme, boundary_skip=args.turbo_boundary_skip,
        uncompressed_start=args.turbo_uncompressed_start, model_path=getattr(args, "model", None),
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
