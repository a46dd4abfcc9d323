"""Where a real model's decode step goes: the host's graph building against the whole step.

For each cache, a book slice of ``--context`` tokens is prefilled, then decode steps
run three ways, side by side in one run:

- build: host microseconds to build one step's graph (the model's Python, the caches'
  updates, every op's graph node; nothing evaluated);
- one step: ms per step evaluated alone (build, the host's scheduling and the GPU's
  work in series);
- pipelined: ms per step as mlx_lm.generate runs decode (the next step's graph built
  and queued while this one runs): max(host, GPU) when they overlap; split into the
  host's building, its queueing (``mx.async_eval``: MLX's work per op) and its waiting
  for the step before; and the host's CPU time of building and queueing (the thread's
  own: what the host's work costs without the time other processes took from it).

Where build is most of a pipelined step the host bounds decode speed; where the
pipelined step is much longer than the build, the GPU (or the host's scheduling in
``mx.eval``) does. Step times on MLX-CUDA move by a fifth between runs of one process,
so the caches take turns for ``--rounds`` rounds (each a fresh cache and prefill) and
the table gives medians. ``--profile N`` also prints, per cache, the N functions that
take most of the build's host time (cProfile over the one-step runs of every round; it
slows the Python down, so the table's build column is then not comparable).
``--stub-kernels`` replaces the custom kernels by stand-ins returning zeroed outputs
(``kernel_host_cost.stub_kernels``), so the fused path's Python and graph building can
be timed on any machine (wrong outputs; the build column is what it is for).

    python benchmarks/decode_step_split.py --model PATH [--context 8000] [--steps 64]
        [--caches fp16 turbo4 turbo2] [--recent-exact 1 32] [--rounds 5] [--profile 25]
        [--stub-kernels] [--out results.md]
"""

import argparse
import cProfile
import datetime
import gc
import io
import platform
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load

from mlx_lm_turbo.settings import DEFAULT_BOUNDARY_SKIP
from mlx_lm_turbo.tools.bench import add_recent_exact_argument, book_tokens, cache_kinds

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import pipelined_seconds  # noqa: E402


def decode_split(model, kind, tokens, context, steps, profiler=None):
    """(build seconds per step, one-step seconds, pipelined seconds, and its build,
    queue and wait seconds and the host's CPU seconds) for one cache;
    ``profiler`` (a cProfile.Profile) records the one-step runs' building."""
    gc.collect()
    mx.clear_cache()
    cache = kind.make(model)
    model(tokens[None, :context], cache=cache)
    mx.eval([c.state for c in cache])
    inputs = [tokens[None, context + i : context + i + 1] for i in range(2 * steps + 2)]

    def build(x, profiler=None):
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        logits = model(x, cache=cache)
        if profiler is not None:
            profiler.disable()
        return logits, time.perf_counter() - start

    mx.eval(build(inputs[0])[0])  # warm-up: compile at this shape
    building = 0.0
    start = time.perf_counter()
    for x in inputs[1 : steps + 1]:
        logits, built = build(x, profiler)
        building += built
        mx.eval(logits)
    one_step = (time.perf_counter() - start) / steps
    parts = {}
    pipelined = pipelined_seconds(
        lambda x: build(x)[0], inputs[steps + 1 : 2 * steps + 1], parts
    )
    return building / steps, one_step, pipelined, *parts.values()  # build ... cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an mlx-lm model directory")
    parser.add_argument("--context", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--caches", nargs="+", default=["fp16", "turbo4", "turbo2"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--boundary-skip", type=int, default=DEFAULT_BOUNDARY_SKIP)
    add_recent_exact_argument(parser)
    parser.add_argument(
        "--profile", type=int, default=0, help="print the N costliest functions"
    )
    parser.add_argument("--stub-kernels", action="store_true")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    if args.stub_kernels:
        from kernel_host_cost import stub_kernels

        stub_kernels()
    model, tokenizer = load(args.model)
    tokens = book_tokens(tokenizer, args.context + 2 * args.steps + 3)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"{datetime.date.today()}, {mx.default_device()} on {platform.node()}, "
        f"commit {commit or 'unknown'}, MLX {mx.__version__}; {args.model}, "
        f"{args.context}-token prompt, {args.steps} steps, medians of {args.rounds} "
        "rounds",
        "",
        "| cache | build us/step | one step ms | pipelined ms | pipelined vs fp16 "
        "| pipelined: build / queue / wait ms | pipelined: host CPU ms | vs fp16 |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    kinds = cache_kinds(args)
    runs = {kind.name: [] for kind in kinds}
    profilers = {
        kind.name: cProfile.Profile() if args.profile else None for kind in kinds
    }
    for _ in range(args.rounds):
        for kind in kinds:
            runs[kind.name].append(
                decode_split(
                    model, kind, tokens, args.context, args.steps, profilers[kind.name]
                )
            )
    reference = reference_cpu = None
    for kind in kinds:
        build, one_step, pipelined, *parts, cpu = map(
            statistics.median, zip(*runs[kind.name])
        )
        reference, reference_cpu = reference or pipelined, reference_cpu or cpu
        line = (
            f"| {kind.name} | {build * 1e6:.0f} | {one_step * 1e3:.3f} | "
            f"{pipelined * 1e3:.3f} | {reference / pipelined:.2f}x | "
            + " / ".join(f"{p * 1e3:.3f}" for p in parts)
            + f" | {cpu * 1e3:.3f} | {reference_cpu / cpu:.2f}x |"
        )
        lines.append(line)
        print(line, flush=True)
    for name, profiler in profilers.items():
        if profiler is not None:
            text = io.StringIO()
            calls = args.rounds * args.steps
            stats = pstats.Stats(profiler, stream=text).strip_dirs()
            stats.sort_stats("tottime").print_stats(args.profile)
            lines += ["", f"{name}: build profile over {calls} steps", "```"]
            lines += [text.getvalue().strip(), "```"]
            print("\n".join(lines[-4:]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
