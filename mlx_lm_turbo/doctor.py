"""``mlx-lm-turbo doctor``: is the plugin attached, what adapters exist, and what a model would get.

    mlx-lm-turbo doctor                              # auto-loading, adapters, overrides file
    mlx-lm-turbo doctor --model DIR --kv-scheme turbo3   # plus the per-layer plan for that model
"""

import argparse
import os
import sys
from pathlib import Path


def _autoload_status():
    if os.environ.get("MLX_LM_TURBO_DISABLE", "") not in ("", "0"):
        return "off (MLX_LM_TURBO_DISABLE is set)"
    pth = [Path(p) / "mlx_lm_turbo_autoload.pth" for p in sys.path if p]
    found = next((p for p in pth if p.exists()), None)
    if found is None:
        return "NOT installed: no mlx_lm_turbo_autoload.pth on sys.path (reinstall the package)"
    active = any(type(f).__name__ == "_Finder" and type(f).__module__ == "mlx_lm_turbo_autoload"
                 for f in sys.meta_path)
    state = "active in this process" if active else "installed but not active (python -S / -I?)"
    return f"{state} ({found})"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mlx-lm-turbo doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="an mlx-lm model directory or repo id to plan for")
    parser.add_argument("--kv-scheme", default="turbo4")
    parser.add_argument("--turbo-boundary-skip", type=int, default=2)
    args = parser.parse_args(argv)

    from mlx_lm import __version__ as mlx_lm_version

    from .adapters import model_module_verdicts
    from .compat import MLX_LM_RANGE, supported
    from .plugins import all_adapters
    from .registry import user_overrides_file

    version_note = ("tested" if supported() else
                    f"NOT tested (the plugin needs {MLX_LM_RANGE}; it patches nothing and refuses --kv-scheme)")
    print(f"mlx-lm {mlx_lm_version}: {version_note}")
    print(f"auto-loading: {_autoload_status()}")
    overrides = user_overrides_file()
    print(f"user overrides file: {overrides} ({'present' if overrides.exists() else 'absent'})\n")

    # In the order plugins are asked: the first adapter listing a model type serves it.
    print("| plugin | adapter | model types | sliding-window layers | notes |")
    print("|---|---|---|---|---|")
    for plugin, adapter in all_adapters():
        c = adapter.capabilities
        print(f"| {plugin} | {adapter.name} | {', '.join(adapter.model_types)} | "
              f"{'compressed' if c.supports_sliding_window else 'refused'} | {c.notes} |")

    verdicts = model_module_verdicts()
    refused = {name: why for name, why in verdicts.items() if why}
    print(f"\nmlx-lm {mlx_lm_version} model modules: {len(verdicts) - len(refused)} served, "
          f"{len(refused)} refused (read from their source):")
    for name, why in refused.items():
        print(f"  {name}: {why}")

    if args.model:
        from mlx_lm import load

        from .adapters import model_type_of
        from .errors import UnsupportedModelError
        from .prompt_cache import plan

        model, _ = load(args.model)
        print(f"\nplan for {args.model} (model type {model_type_of(model)!r}), {args.kv_scheme}:")
        try:
            adapter, _, layers, override = plan(model, args.kv_scheme, boundary_skip=args.turbo_boundary_skip,
                                                model_path=args.model)
        except UnsupportedModelError as error:
            print(f"  refused: {error}")
            return 1
        print(f"  adapter: {adapter.name}; overrides applied: {', '.join(override['sources']) or 'none'}\n")
        print("| cache entry | kind | scheme | why |")
        print("|---:|---|---|---|")
        for p in layers:
            print(f"| {p.index} | {p.kind} | {p.scheme.name if p.scheme else '-'} | {p.reason} |")
    return 0
