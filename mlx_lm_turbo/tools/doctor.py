"""``mlx-lm-turbo doctor``: is the plugin attached, what adapters exist, and what a model would get.

mlx-lm-turbo doctor                              # auto-loading, adapters, overrides file
mlx-lm-turbo doctor --model DIR --kv-scheme turbo3   # plus the per-layer plan for that model
"""

import argparse
import os
import sys
from pathlib import Path

from ..defaults import DEFAULT_BOUNDARY_SKIP


def _autoload_status():
    try:
        from mlx_lm_turbo_autoload import DISABLE, disabled
    except ImportError:
        return "NOT installed: the start-up module mlx_lm_turbo_autoload is missing (reinstall the package)"
    if disabled():
        return f"off ({DISABLE}={os.environ[DISABLE]!r})"
    pth = [Path(p) / "mlx_lm_turbo_autoload.pth" for p in sys.path if p]
    found = next((p for p in pth if p.exists()), None)
    if found is None:
        return "NOT installed: no mlx_lm_turbo_autoload.pth on sys.path (reinstall the package)"
    active = any(
        type(f).__name__ == "_Finder" and type(f).__module__ == "mlx_lm_turbo_autoload"
        for f in sys.meta_path
    )
    state = (
        "active in this process"
        if active
        else "installed but not active (python -S / -I?)"
    )
    return f"{state} ({found})"


def _check_options(parser, args):
    """The scheme --kv-scheme names; a bad option is a usage error."""
    from ..codec.schemes import parse_scheme

    try:
        scheme = parse_scheme(args.kv_scheme)
    except ValueError as error:
        parser.error(f"--kv-scheme: {error}")
    if scheme is None:
        parser.error("--kv-scheme: give the TurboQuant scheme to plan for, not 'none'.")
    if args.turbo_boundary_skip < 0:
        parser.error(
            f"--turbo-boundary-skip must be >= 0, got {args.turbo_boundary_skip}."
        )
    return scheme


def _report_settings():
    """Print the plugin's environment variables and the overrides file, each checked; False if one is bad."""
    from ..attach.options import ENV_SCHEME
    from ..codec.schemes import parse_scheme
    from ..errors import OverridesFileError
    from ..kernels.dispatch import KERNEL_ENV, kernel_mode
    from ..plugin.registry import registry, user_overrides_file

    ok = True
    checks = {
        ENV_SCHEME: lambda: (
            f"{parse_scheme(os.environ[ENV_SCHEME]) or 'none'}, the default of --kv-scheme"
        ),
        KERNEL_ENV: kernel_mode,
    }
    for name, check in checks.items():
        if os.environ.get(name) is not None:
            try:
                state = check()
            except ValueError as error:
                state, ok = f"INVALID: {error}", False
            print(f"{name}: {state}")
    overrides = user_overrides_file()
    try:
        registry()
        state = "present, valid" if overrides.exists() else "absent"
    except OverridesFileError as error:
        state, ok = f"INVALID: {error}", False
    print(f"user overrides file: {overrides} ({state})")
    return ok


def _kernel_status():
    """Where the fused kernels run on this machine, and what MLX_LM_TURBO_KERNEL asks."""
    from ..kernels.dispatch import (
        HEAD_DIMS,
        KERNEL_ENV,
        gpu_backend,
        kernel_mode,
        layer_support,
    )

    try:
        mode = kernel_mode()
    except ValueError:
        return "see the invalid setting above"
    reason = layer_support(HEAD_DIMS[0], HEAD_DIMS[0])
    dims = ", ".join(map(str, HEAD_DIMS))
    if reason is not None:
        where = f"not here: {reason}"
    elif gpu_backend() == "metal":
        where = (
            f"the Metal decode kernel, UNVERIFIED on Apple GPUs, for head dims {dims} "
            "(decode: 1-8 query tokens; prefill blockwise)"
        )
    else:
        where = (
            f"available for head dims {dims} (decode: 1-8 query tokens; longer prefill "
            "chunks go to MLX's fused attention over the history dequantized while it "
            "fits, else blockwise)"
        )
    return f"{where}; {KERNEL_ENV}={mode}"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mlx-lm-turbo doctor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", help="an mlx-lm model directory or repo id to plan for"
    )
    parser.add_argument(
        "--kv-scheme", default="turbo4", help="the scheme to plan for (default: turbo4)"
    )
    parser.add_argument(
        "--turbo-boundary-skip", type=int, default=DEFAULT_BOUNDARY_SKIP
    )
    args = parser.parse_args(argv)
    scheme = _check_options(parser, args)

    from mlx_lm import __version__ as mlx_lm_version

    from ..compat import MLX_LM_RANGE, supported
    from ..plugin.adapters import model_module_verdicts
    from ..plugin.manager import all_adapters

    version_note = (
        "tested"
        if supported()
        else f"NOT tested (the plugin needs {MLX_LM_RANGE}; it patches nothing and refuses --kv-scheme)"
    )
    print(f"mlx-lm {mlx_lm_version}: {version_note}")
    print(f"auto-loading: {_autoload_status()}")
    settings_ok = _report_settings()
    print(f"fused kernels: {_kernel_status()}")
    print()

    # In the order plugins are asked: the first adapter listing a model type serves it.
    print("| plugin | adapter | model types | sliding-window layers | notes |")
    print("|---|---|---|---|---|")
    for plugin, adapter in all_adapters():
        c = adapter.capabilities
        print(
            f"| {plugin} | {adapter.name} | {', '.join(adapter.model_types)} | "
            f"{'compressed' if c.supports_sliding_window else 'refused'} | {c.notes} |"
        )

    verdicts = model_module_verdicts()
    refused = {name: why for name, why in verdicts.items() if why}
    print(
        f"\nmlx-lm {mlx_lm_version} model modules: {len(verdicts) - len(refused)} served, "
        f"{len(refused)} refused (read from their source):"
    )
    for name, why in refused.items():
        print(f"  {name}: {why}")

    if args.model:
        from ..attach.preflight import load_model
        from ..errors import UsageError
        from ..plugin.adapters import model_type_of
        from ..plugin.prompt_cache import plan

        try:
            model, _ = load_model(args.model, lazy=True)  # planning reads no weights
        except UsageError as error:
            parser.error(str(error))
        print(
            f"\nplan for {args.model} (model type {model_type_of(model)!r}), {args.kv_scheme}:"
        )
        try:
            adapter, _, layers, override = plan(
                model,
                scheme,
                boundary_skip=args.turbo_boundary_skip,
                model_path=args.model,
            )
        except UsageError as error:
            print(f"  refused: {error}")
            return 1
        print(
            f"  adapter: {adapter.name}; overrides applied: {', '.join(override['sources']) or 'none'}\n"
        )
        from ..kernels.dispatch import layer_support
        from ..plugin.adapters import head_dims

        dims = head_dims(model) or [None] * len(layers)
        print("| cache entry | kind | scheme | why | decode attention |")
        print("|---:|---|---|---|---|")
        for p in layers:
            path = "-"
            if p.scheme is not None and dims[p.index] is not None:
                why_not = layer_support(*dims[p.index][1:])
                path = f"portable: {why_not}" if why_not else "fused kernel"
            print(
                f"| {p.index} | {p.kind} | {p.scheme.name if p.scheme else '-'} | {p.reason} | {path} |"
            )
    return 0 if settings_ok else 1
