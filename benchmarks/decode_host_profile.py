"""Where the host's time goes in a real model's pipelined decode, down to MLX's C++.

``decode_step_split.py`` splits a pipelined step into building, queueing
(``mx.async_eval``) and waiting; cProfile sees only the building's Python. This runs
the same pipelined decode (the next step's graph built and queued while this one runs,
as mlx_lm.generate does) for ``--seconds`` under a sampling profiler that also reads
native stacks (py-spy), then sums the samples of the decode loop by phase and by the
functions they were in:

    py-spy record --native --rate 250 --format raw --output CACHE.txt -- \\
        python benchmarks/decode_host_profile.py --model PATH --cache turbo4
    python benchmarks/decode_host_profile.py --summarize fp16.txt turbo4.txt [--top 25]

Sampling pauses the process, so the shares matter, not the step times it runs at.
"""

import argparse
import collections
import time

LOOP = "pipelined_decode_loop"
# A sample's phase: the first of these its stack holds, read from the loop outwards.
PHASES = (("async_eval", "queue"), ("eval", "wait"))


def pipelined_decode_loop(model, cache, tokens, seconds):
    """Decode steps of one token each, as mlx_lm.generate runs them, for ``seconds``."""
    import mlx.core as mx

    running, steps, start = None, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x = tokens[None, steps % len(tokens)][:, None]
        logits = model(x, cache=cache)
        mx.async_eval(logits)
        if running is not None:
            mx.eval(running)
        running, steps = logits, steps + 1
    mx.eval(running)
    return steps / (time.perf_counter() - start)


def warm_up(model, cache, tokens, steps=16):
    import mlx.core as mx

    for i in range(steps):
        mx.eval(model(tokens[None, i][:, None], cache=cache))


def run(args):
    import mlx.core as mx
    from mlx_lm.utils import load

    from mlx_lm_turbo.settings import DEFAULT_BOUNDARY_SKIP
    from mlx_lm_turbo.tools.bench import CacheKind, book_tokens

    model, tokenizer = load(args.model)
    tokens = book_tokens(tokenizer, args.context + 256)
    cache = CacheKind(args.cache, DEFAULT_BOUNDARY_SKIP).make(model)
    model(tokens[None, : args.context], cache=cache)
    mx.eval([c.state for c in cache])
    # Outside the sampled loop: the first steps compile kernels (NVRTC, on a fresh
    # machine) and fill MLX's caches.
    warm_up(model, cache, tokens[args.context :])
    steps_per_second = pipelined_decode_loop(
        model, cache, tokens[args.context :], args.seconds
    )
    print(f"{args.cache}: {1e3 / steps_per_second:.3f} ms a step while sampled")


def frame_name(frame):
    """A frame of py-spy's raw output without its file and line."""
    return frame.split(" (")[0].strip()


def loop_samples(path):
    """(frames from the loop inwards, count) of each stack that ran the decode loop."""
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        names = [frame_name(f) for f in frames]
        if LOOP in names:
            yield names[names.index(LOOP) + 1 :], int(count)


def phase(frames):
    for frame in frames[:3]:  # the loop's own call: model(...), async_eval or eval
        for key, name in PHASES:
            if frame.split("::")[-1].endswith(key) or frame == key:
                return name
    return "build"


def summarize(path, top):
    phases = collections.Counter()
    inclusive = {name: collections.Counter() for _, name in (*PHASES, (0, "build"))}
    leaves = {name: collections.Counter() for name in inclusive}
    total = 0
    for frames, count in loop_samples(path):
        name = phase(frames)
        total += count
        phases[name] += count
        for frame in set(frames):
            inclusive[name][frame] += count
        if frames:
            leaves[name][frames[-1]] += count
    print(f"## {path}: {total} samples of the decode loop")
    print()
    print("| phase | share |")
    print("|---|---:|")
    for name, count in phases.most_common():
        print(f"| {name} | {100 * count / total:.1f}% |")
    for name in ("build", "queue"):
        print()
        print(
            f"{name}: the {top} functions most samples were in (share of all samples)"
        )
        print()
        print("| function | inclusive | innermost |")
        print("|---|---:|---:|")
        for frame, count in inclusive[name].most_common(top):
            own = leaves[name][frame]
            print(
                f"| `{frame[:90]}` | {100 * count / total:.1f}% | "
                f"{100 * own / total:.1f}% |"
            )
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an mlx-lm model directory")
    parser.add_argument("--cache", default="turbo4", help="a bench cache name")
    parser.add_argument("--context", type=int, default=8000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--summarize", nargs="+", metavar="RAW", help="py-spy files")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if args.summarize:
        for path in args.summarize:
            summarize(path, args.top)
        return
    if not args.model:
        parser.error("--model is required to run the decode loop")
    run(args)


if __name__ == "__main__":
    main()
