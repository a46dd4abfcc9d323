"""Where a kernel's instructions and stalls go, from an Nsight Compute source page.

Reads the CSV that ``ncu --import R.ncu-rep --page source --csv --print-source sass``
writes (plain or gzipped) and prints the runs of consecutive SASS instructions that
execute equally often (a loop body, a straight stretch of code) and hold at least
``--min`` percent of the executed instructions or of the stall samples, with their
shared-memory wavefronts against the ideal (more: bank conflicts) where the page has
them.

    python benchmarks/ncu_regions.py benchmarks/results/ncu/turbo4_131072_sass.csv.gz
"""

import argparse
import csv
import gzip
import io


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    header = next(i for i, r in enumerate(rows) if "Source" in r)
    names = {name: i for i, name in enumerate(rows[header])}
    return names, [r for r in rows[header + 1 :] if len(r) == len(names)]


def runs(executed):
    """(first, last) index of each run of equal execution counts."""
    start = 0
    for i in range(1, len(executed) + 1):
        if i == len(executed) or executed[i] != executed[start]:
            yield start, i - 1
            start = i


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--min", type=float, default=0.5, help="percent")
    args = parser.parse_args()
    names, rows = read(args.csv)

    def column(name):
        return [int(r[names[name]].replace(",", "") or 0) for r in rows]

    executed = column("Instructions Executed")
    samples = column("Warp Stall Sampling (All Samples)")
    shared = "L1 Wavefronts Shared" in names
    wavefronts = column("L1 Wavefronts Shared") if shared else []
    ideal = column("L1 Wavefronts Shared Ideal") if shared else []
    total, total_samples = sum(executed), sum(samples)
    print(f"{total:,} warp instructions executed, {total_samples:,} stall samples")
    if shared:
        print(
            f"{sum(wavefronts):,} shared-memory wavefronts, "
            f"{sum(ideal):,} without bank conflicts"
        )
    print(
        "\n| SASS lines | instructions | each runs | share of instructions "
        "| share of stalls | shared wavefronts a run: actual / ideal | first instruction |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    for first, last in runs(executed):
        share = executed[first] * (last - first + 1) / total * 100
        stalls = sum(samples[first : last + 1]) / total_samples * 100
        if share >= args.min or stalls >= args.min:
            text = rows[first][names["Source"]].strip()[:48]
            runs_of = max(executed[first], 1)
            waves = (
                f"{sum(wavefronts[first : last + 1]) / runs_of:.0f} / "
                f"{sum(ideal[first : last + 1]) / runs_of:.0f}"
                if shared
                else "-"
            )
            print(
                f"| {first}-{last} | {last - first + 1} | {executed[first]:,} "
                f"| {share:.1f}% | {stalls:.1f}% | {waves} | `{text}` |"
            )


if __name__ == "__main__":
    main()
