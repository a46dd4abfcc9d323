"""Two versions of the package side by side: ``decode_step_split.py`` in fresh processes,
the versions taking turns, one round each, so that a host's drift between runs (a fifth
and more on MLX-CUDA) falls on both alike.

A version is a directory holding an ``mlx_lm_turbo`` package (put first on
``PYTHONPATH``), or ``installed`` for the one installed. Everything after ``--`` goes to
``decode_step_split.py`` (its ``--rounds`` and ``--out`` are set here):

    git archive OLD mlx_lm_turbo | tar -x -C /tmp/old
    python benchmarks/ab_packages.py --versions /tmp/old installed --rounds 4 -- \\
        --model PATH --context 8000 --steps 64 --caches fp16 turbo4
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SPLIT = Path(__file__).parent / "decode_step_split.py"
COLUMNS = ("build us/step", "one step ms", "pipelined ms", "pipelined host CPU ms")


def table_rows(path):
    """{cache: (build us, one step ms, pipelined ms, pipelined host CPU ms)} from a
    decode_step_split table."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and cells[1].replace(".", "").isdigit():
            rows[cells[0]] = tuple(float(c) for c in (*cells[1:4], cells[6]))
    return rows


def version_env(version):
    """The environment a run of ``version`` gets; exits where another copy is imported
    (an editable install's finder comes before ``PYTHONPATH``)."""
    env = dict(os.environ)
    if version == "installed":
        return env
    folder = Path(version).resolve()
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(folder), env.get("PYTHONPATH")) if p
    )
    where = subprocess.run(  # not from here: ``-c`` puts the working directory first
        [sys.executable, "-c", "import mlx_lm_turbo; print(mlx_lm_turbo.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    ).stdout.strip()
    if not where.startswith(str(folder)):
        sys.exit(
            f"With {folder} first on PYTHONPATH this Python imports mlx_lm_turbo from "
            f"{where or 'nowhere'}: install the package from a wheel, not editable."
        )
    return env


def one_round(version, split_args, out):
    env = version_env(version)
    command = [sys.executable, str(SPLIT), *split_args, "--rounds", "1", "--out", out]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return table_rows(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs=2, required=True, metavar="DIR")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("split_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    split_args = [a for a in args.split_args if a != "--"]
    runs = {v: [] for v in args.versions}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for i, version in enumerate(args.versions):
                rows = one_round(version, split_args, f"{folder}/{r}_{i}.md")
                runs[version].append(rows)
                summary = ", ".join(
                    f"{cache} {ms[2]:.3f} ms (host CPU {ms[3]:.3f})"
                    for cache, ms in rows.items()
                )
                print(f"round {r + 1}, {version}: pipelined {summary}", flush=True)
    caches = list(runs[args.versions[0]][0])
    print()
    print(f"Medians of {args.rounds} rounds; vs first cache: the first cache's")
    print(
        "pipelined step (or its host CPU time) over this cache's, per round, then the"
    )
    print("median; rounds: the lowest and highest of those per-round ratios.")
    print()
    print(
        "| version | cache | "
        + " | ".join(COLUMNS)
        + " | vs first cache | rounds | host CPU vs first cache |"
    )
    print("|---|---|" + "---:|" * (len(COLUMNS) + 3))
    for version, rounds in runs.items():
        for cache in caches:
            values = [statistics.median(r[cache][k] for r in rounds) for k in range(4)]
            step, host = (
                [r[caches[0]][k] / r[cache][k] for r in rounds] for k in (2, 3)
            )
            cells = [f"{values[0]:.0f}", *(f"{v:.3f}" for v in values[1:])]
            cells += [
                f"{statistics.median(step):.2f}x",
                f"{min(step):.2f}-{max(step):.2f}x",
                f"{statistics.median(host):.2f}x",
            ]
            print(f"| {version} | {cache} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
