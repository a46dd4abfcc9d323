"""Start-up cost of the auto-loaded plugin, measured side by side in one run.

Times fresh interpreters (alternating, so machine noise hits both alike) with the
plugin active and with MLX_LM_TURBO_DISABLE=1, for a bare ``python -c pass`` (the
.pth hook alone) and for ``import mlx_lm.generate`` (the hook attaching to mlx-lm),
plus ``-X importtime`` self-reported import cost of the plugin's modules.

    python benchmarks/startup.py [--runs 15]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

CASES = {"python -c pass": "pass", "import mlx_lm.generate": "import mlx_lm.generate"}


def wall(code, disabled):
    env = dict(os.environ)
    env.pop("MLX_LM_TURBO_DISABLE", None)
    if disabled:
        env["MLX_LM_TURBO_DISABLE"] = "1"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - start


def plugin_import_ms(code):
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True
    ).stderr
    total = 0
    for line in err.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s+(.*)", line)
        if match and "mlx_lm_turbo" in match.group(2):
            total += int(match.group(1))
    return total / 1000


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(
        "| command | plugin on, best / median (ms) | plugin off, best / median (ms) | difference of bests (ms) | plugin's own imports (ms) |"
    )
    print("|---|---:|---:|---:|---:|")
    for label, code in CASES.items():
        on, off = [], []
        for _ in range(args.runs):
            on.append(wall(code, False))
            off.append(wall(code, True))
        # The best run is the least disturbed by the machine's noise; the median is shown too.
        print(
            f"| `{label}` | {1000 * min(on):.1f} / {1000 * statistics.median(on):.1f} | "
            f"{1000 * min(off):.1f} / {1000 * statistics.median(off):.1f} | "
            f"{1000 * (min(on) - min(off)):+.1f} | {plugin_import_ms(code):.2f} |"
        )


if __name__ == "__main__":
    main()
