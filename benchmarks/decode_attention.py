"""Attention over a stack of layers: fp16 cache vs the portable turbo path, decode and prefill.

Decode: each step appends one token to every layer's cache and attends through
mlx-lm's ``scaled_dot_product_attention`` (the turbo path reads the compressed
history in blocks), each layer's output the next one's query; the stack is
evaluated together, as a model's decode step is. Prints, side by side in one
run, ms per step, its ratio to fp16, the caches' bytes and the peak memory above
the caches (also as a multiple of the caches' bytes); then the same pipelined, as
mlx_lm.generate runs decode, with the host's time per step split into building the
graph and queueing it (``mx.async_eval``: MLX's own work per op).

Prefill: a prompt of ``--prefill`` tokens fed in ``--chunk`` token chunks through
the same layer stack (queries = keys = values = the chunk), peak memory above
what was allocated before the first chunk (caches included, as they grow).

    python benchmarks/decode_attention.py [--contexts 4096 16384 65536] [--layers 8]
        [--schemes turbo4] [--steps 4] [--prefill 16384 --chunk 2048]
        [--blocks 512 1024 2048 4096] [--recent-exact 1 32] [--rounds 5]
        [--count-ops] [--host-idle-ms 1 [--host-idle-spin]] [--out results.md]

A scheme written ``NAME:MODE`` runs with MLX_LM_TURBO_KERNEL=MODE (``turbo4:off``:
the portable path where the fused kernel would run, in the same run); ``NAME@dynamic``
or ``NAME@static`` with its widths in or out of the CUDA kernel's DYNAMIC_WIDTHS (its
pair table and two staging buffers in dynamic shared memory, or one buffer in static:
``turbo4v2@dynamic turbo4v2@static`` compares both in one run). ``--recent-exact``
runs each scheme with each window of exactly read recent tokens (``recent_exact``; shown
as ``NAME W32`` where above 1).
"""

import argparse
import cProfile
import datetime
import io
import os
import platform
import pstats
import statistics
import subprocess
import time

import mlx.core as mx
import mlx_lm.models.base as mlx_base
from mlx_lm.models.cache import KVCache

import mlx_lm_turbo.cache.attention as attention
from mlx_lm_turbo import TurboQuantKVCache
from mlx_lm_turbo.attach.attention import install_attention_dispatch
from mlx_lm_turbo.codec.schemes import parse_scheme
from mlx_lm_turbo.kernels import KERNEL_ENV, decode_attention
from mlx_lm_turbo.tools.bench import add_recent_exact_argument

# The keys', values' and queries' dtype (``--dtype``): float16, as GPU models run; CPU
# models run in float32 (mlx-lm's CPU attention is slow in float16).
DTYPE = mx.float16
# ``--host-idle-ms`` and ``--host-idle-spin``: what the host does before building each
# step taken one at a time (seconds; True: busy-wait instead of sleeping).
HOST_IDLE = 0.0
HOST_IDLE_SPIN = False
# The package's choice, which runs without a layout keep.
DEFAULT_DYNAMIC_WIDTHS = frozenset(decode_attention.DYNAMIC_WIDTHS)
LAYOUTS = ("dynamic", "static")


def host_idle():
    """Wait HOST_IDLE seconds, sleeping or spinning. At long contexts the host waits in
    ``mx.eval`` for the GPU between steps and then builds the next step more slowly
    (turbo4 0.27 -> 0.46 ms, fp16 0.15 -> 0.22 ms from 4K to 128K tokens, a graph of
    the same ops): a short context with an idle wait tells whether waiting alone does it."""
    if HOST_IDLE_SPIN:
        end = time.perf_counter() + HOST_IDLE
        while time.perf_counter() < end:
            pass
    elif HOST_IDLE:
        time.sleep(HOST_IDLE)


def filled_caches(make, layers, context, kv_heads, head_dim):
    caches = [make() for _ in range(layers)]
    for c in caches:
        for start in range(0, context, 4096):  # in chunks, as a prefill fills them
            kv = mx.random.normal(
                (1, kv_heads, min(4096, context - start), head_dim)
            ).astype(DTYPE)
            c.update_and_fetch(kv, kv)
            mx.eval([a for a in c.state if isinstance(a, mx.array)])
    return caches


def chained_step(caches, query, token, head_dim):
    """One decode step's graph over the layers' caches, chained as a model's layers
    are (each layer's output the next one's query: one layer's K/V in flight at a
    time)."""
    x = query
    for c in caches:
        x = mlx_base.scaled_dot_product_attention(
            x,
            *c.update_and_fetch(token, token),
            cache=c,
            scale=head_dim**-0.5,
            mask=None,
        )
    return x


# What --prefill-blocks sets, in its order.
PREFILL_SETTINGS = (
    "PREFILL_BLOCK_SCORES",
    "PREFILL_BLOCK_TOKENS",
    "PREFILL_QUERY_ROWS",
)


def prefill_blocks(parser, spec):
    """--prefill-blocks' SCORES:TOKENS:ROWS (log2, count, log2) as the three settings."""
    try:
        scores, tokens, rows = (int(part) for part in spec.split(":"))
        if not (0 <= scores < 40 and tokens > 0 and 0 <= rows < 40):
            raise ValueError
    except ValueError:
        parser.error(
            f"--prefill-blocks: {spec!r} is not SCORES:TOKENS:ROWS, e.g. 23:512:14 "
            "(log2 of the score elements, keys a block, log2 of the query rows)"
        )
    return 1 << scores, tokens, 1 << rows


def cache_bytes(caches):
    return sum(c.nbytes for c in caches)


def pipelined_seconds(build, inputs, parts=None):
    """Seconds per step of ``build(x)`` for each x, run as mlx_lm.generate runs decode:
    the next step's graph built and queued while this one runs. ``parts`` (a dict), if
    given, gets the seconds per step spent building, queueing (``mx.async_eval``: MLX's
    host work per op) and waiting for the step before: where the host waits, the
    device (or a stall) bounds the step; and ``cpu``, the calling thread's CPU seconds
    building and queueing (both run in it): the host's work without the time it lost
    to other processes, which on a shared host moves wall times between runs."""
    spent = dict.fromkeys(("build", "queue", "wait", "cpu"), 0.0)
    start = time.perf_counter()
    running = None
    for x in inputs:
        c0, t0 = time.thread_time(), time.perf_counter()
        queued = build(x)
        t1 = time.perf_counter()
        mx.async_eval(queued)
        t2, c2 = time.perf_counter(), time.thread_time()
        if running is not None:
            mx.eval(running)
        spent["build"] += t1 - t0
        spent["queue"] += t2 - t1
        spent["wait"] += time.perf_counter() - t2
        spent["cpu"] += c2 - c0
        running = queued
    t0 = time.perf_counter()
    mx.eval(running)
    spent["wait"] += time.perf_counter() - t0
    if parts is not None:
        parts.update({k: v / len(inputs) for k, v in spent.items()})
    return (time.perf_counter() - start) / len(inputs)


def ops_per_layer(cache, q_heads, kv_heads, head_dim):
    """Ops (graph nodes: MLX primitives, views included) one decode step builds for one
    layer: its cache update and attention, as ``mx.export_to_dot`` lists them."""
    token = mx.random.normal((1, kv_heads, 1, head_dim)).astype(DTYPE)
    query = mx.random.normal((1, q_heads, 1, head_dim)).astype(DTYPE)
    mx.eval(token, query)
    out = mlx_base.scaled_dot_product_attention(
        query,
        *cache.update_and_fetch(token, token),
        cache=cache,
        scale=head_dim**-0.5,
        mask=None,
    )
    graph = io.StringIO()
    mx.export_to_dot(graph, out, *[a for a in cache.state if isinstance(a, mx.array)])
    mx.eval(out, [a for a in cache.state if isinstance(a, mx.array)])
    return graph.getvalue().count("shape=rectangle")


def decode_steps(caches, steps, q_heads, kv_heads, head_dim):
    """Seconds per step evaluated one at a time, seconds of it spent building the step's
    graph on the host (before the GPU runs anything) and peak memory (bytes) above what
    the caches held before; then seconds per step and peak memory pipelined as
    mlx_lm.generate runs them (the next step's graph built and queued while this one
    runs: on MLX-CUDA a cache update then finds its buffer still held by the running
    step and copies it, for fp16 and turbo caches alike)."""
    tokens = [
        mx.random.normal((1, kv_heads, 1, head_dim)).astype(DTYPE)
        for _ in range(2 * steps + 1)
    ]
    query = mx.random.normal((1, q_heads, 1, head_dim)).astype(DTYPE)
    mx.eval(tokens, query)

    def build(token):
        return chained_step(caches, query, token, head_dim)

    idle = 0.0  # the host's idle waits, taken out of the step times

    def step(token):
        nonlocal idle
        start = time.perf_counter()
        host_idle()
        idle += time.perf_counter() - start
        start = time.perf_counter()
        x = build(token)
        built = time.perf_counter() - start
        mx.eval(x)
        return built

    step(tokens[0])  # warm-up: compile at this shape
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    idle = 0.0
    start = time.perf_counter()
    building = sum(step(token) for token in tokens[1 : steps + 1])
    seconds = (time.perf_counter() - start - idle) / steps
    peak = mx.get_peak_memory() - before
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    parts = {}
    pipelined = pipelined_seconds(build, tokens[steps + 1 :], parts)
    pipelined_peak = mx.get_peak_memory() - before
    return (
        seconds,
        building / steps,
        peak,
        pipelined,
        pipelined_peak,
        parts["build"],
        parts["queue"],
    )


def host_profile(caches, args, steps=32):
    """cProfile's top entries over building and running ``steps`` decode steps."""
    profile = cProfile.Profile()
    profile.enable()
    decode_steps(caches, steps, args.q_heads, args.kv_heads, args.head_dim)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    return text.getvalue().strip()


def prefill(make, layers, prompt, chunk, q_heads, kv_heads, head_dim, warm_up=True):
    """Seconds and peak memory (bytes, caches included) of a chunked prefill through the
    stack, after the same prefill once: MLX-CUDA compiles a kernel on its first use and
    cuDNN builds its attention plan for each new shape, so without it the first row to
    meet a chunk's shapes pays for every row after it."""
    if warm_up:
        prefill(make, layers, prompt, chunk, q_heads, kv_heads, head_dim, False)
    caches = [make() for _ in range(layers)]
    group = q_heads // kv_heads
    chunks = [
        mx.random.normal((1, kv_heads, min(chunk, prompt - s), head_dim)).astype(DTYPE)
        for s in range(0, prompt, chunk)
    ]
    mx.eval(chunks)
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    start = time.perf_counter()
    for kv in chunks:
        x = mx.repeat(kv, group, axis=1)
        for c in caches:
            x = mlx_base.scaled_dot_product_attention(
                x,
                *c.update_and_fetch(kv, kv),
                cache=c,
                scale=head_dim**-0.5,
                mask="causal",
            )
        mx.eval(x, [a for c in caches for a in c.state if isinstance(a, mx.array)])
        mx.clear_cache()
    return (
        time.perf_counter() - start,
        mx.get_peak_memory() - before,
        cache_bytes(caches),
    )


def round_medians(rounds):
    """``decode_steps``' results over rounds: the median of each time, the largest of
    each peak."""
    seconds, host, peak, pipelined, pipelined_peak, built, queued = zip(*rounds)
    return (
        statistics.median(seconds),
        statistics.median(host),
        max(peak),
        statistics.median(pipelined),
        max(pipelined_peak),
        statistics.median(built),
        statistics.median(queued),
    )


def cache_maker(name):
    """What builds one layer's cache for a run named ``fp16`` or
    ``SCHEME[:MODE][@LAYOUT][ WN]`` (sets the kernel mode and layout for the run)."""
    name, _, window = name.partition(" W")
    name, _, layout = name.partition("@")
    scheme, _, mode = name.partition(":")
    os.environ[KERNEL_ENV] = mode or "auto"
    set_kernel_layout(scheme, layout)
    if scheme == "fp16":
        return KVCache
    return lambda: TurboQuantKVCache(scheme, recent_exact=int(window or 1))


def layout_error(spec):
    """Why a ``--schemes`` entry's ``@LAYOUT`` cannot run, or None."""
    name, _, layout = spec.partition("@")
    if not layout:
        return None
    if layout not in LAYOUTS:
        return "a layout is dynamic or static"
    try:
        scheme = parse_scheme(name.partition(":")[0])
    except ValueError as error:
        return str(error)
    return None if scheme is not None else "a layout needs a turbo scheme"


def set_kernel_layout(scheme, layout):
    """The decode kernel's shared-memory layout for a run: ``dynamic`` puts the scheme's
    widths into ``decode_attention.DYNAMIC_WIDTHS``, ``static`` takes them out, ``""``
    keeps the package's choice. The kernels and launch plans built under another choice
    are dropped, so a run builds its own (in its warm-up step)."""
    widths = set(DEFAULT_DYNAMIC_WIDTHS)
    if layout:
        parsed = parse_scheme(scheme)
        bits = {(parsed.key_bits, parsed.value_bits)}
        widths = widths | bits if layout == "dynamic" else widths - bits
    if widths != decode_attention.DYNAMIC_WIDTHS:
        decode_attention.DYNAMIC_WIDTHS = widths
        decode_attention.forget_kernels()


def header():
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, commit {commit}"
        f"{' (uncommitted changes)' if dirty else ''}, {mx.default_device()}, {platform.machine()}, "
        f"mlx {mx.__version__}"
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--contexts", type=int, nargs="*", default=[4096, 16384, 65536])
    parser.add_argument("--schemes", nargs="+", default=["turbo4"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument(
        "--prefill",
        type=int,
        default=16384,
        help="prompt tokens (0: skip the prefill table)",
    )
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument(
        "--prefill-blocks",
        nargs="*",
        default=[],
        metavar="SCORES:TOKENS:ROWS",
        help="prefill block settings to compare, as log2 of PREFILL_BLOCK_SCORES, "
        "PREFILL_BLOCK_TOKENS, log2 of PREFILL_QUERY_ROWS (default: the library's)",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        nargs="*",
        default=[],
        help="decode key-block sizes to compare (default: the library's)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile the host side of each cache's steps at the last context",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="decode rounds per cache, the caches taking turns (medians reported): "
        "one step at a time, a step's time follows the host's, which drifts",
    )
    add_recent_exact_argument(parser)
    parser.add_argument(
        "--dtype",
        choices=("float16", "bfloat16", "float32"),
        default="float16",
        help="keys, values and queries (default float16)",
    )
    parser.add_argument(
        "--count-ops",
        action="store_true",
        help="also count the ops one decode step builds for a layer (after the timing)",
    )
    parser.add_argument(
        "--host-idle-ms",
        type=float,
        default=0.0,
        help="steps one at a time: the host sleeps this long before building each "
        "(does a host that waited build more slowly?)",
    )
    parser.add_argument(
        "--host-idle-spin",
        action="store_true",
        help="with --host-idle-ms: busy-wait instead of sleeping",
    )
    parser.add_argument("--out", help="also write the tables to this file")
    args = parser.parse_args()
    if args.host_idle_ms < 0 or (args.host_idle_spin and not args.host_idle_ms):
        parser.error("--host-idle-ms takes a duration >= 0; --host-idle-spin needs one")
    global DTYPE, HOST_IDLE, HOST_IDLE_SPIN
    DTYPE = getattr(mx, args.dtype)
    HOST_IDLE, HOST_IDLE_SPIN = args.host_idle_ms / 1e3, args.host_idle_spin
    prefill_settings = [prefill_blocks(parser, spec) for spec in args.prefill_blocks]
    for spec in args.schemes:
        if error := layout_error(spec):
            parser.error(f"--schemes {spec}: {error}")
    schemes = [
        f"{s} W{w}" if w > 1 else s for s in args.schemes for w in args.recent_exact
    ]
    install_attention_dispatch()
    lines = []

    def emit(line=""):
        print(line, flush=True)
        lines.append(line)

    emit(header())
    emit(
        f"{args.layers} layers, {args.q_heads} query / {args.kv_heads} KV heads, head_dim {args.head_dim}, "
        f"{args.dtype}, "
        + (
            f"host {'spinning' if HOST_IDLE_SPIN else 'asleep'} {args.host_idle_ms:g} ms "
            "before building each step (one at a time), "
            if HOST_IDLE
            else ""
        )
        + f"decode block {attention.DECODE_BLOCK_TOKENS} tokens, prefill block "
        f"{attention.PREFILL_BLOCK_SCORES} scores"
    )
    default_block = attention.DECODE_BLOCK_TOKENS

    def start_run(name, block):
        """A run's cache maker, with its kernel mode and decode block in force."""
        attention.DECODE_BLOCK_TOKENS = block or default_block
        return cache_maker(name)

    if args.contexts:
        emit()
        emit(
            f"Decode ({args.steps} steps after a warm-up"
            + (f"; medians of {args.rounds} rounds" if args.rounds > 1 else "")
            + ")"
        )
        emit()
        emit(
            "| cache | context | block | ms/step | speed vs fp16 | host ms/step | "
            "cache MiB | peak MiB above caches | peak / cache | "
            "pipelined ms/step | pipelined vs fp16 | pipelined peak MiB above caches | "
            "pipelined: build / queue ms |"
            + (" ops a layer |" if args.count_ops else "")
        )
        emit(
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            + ("---:|" if args.count_ops else "")
        )
    profiles = []
    for context in args.contexts:
        runs = [("fp16", None)] + [
            (s, b) for s in schemes for b in (args.blocks or [default_block])
        ]
        caches = {}
        for name, block in runs:
            caches[name, block] = filled_caches(
                start_run(name, block),
                args.layers,
                context,
                args.kv_heads,
                args.head_dim,
            )
        results = {run: [] for run in runs}
        for round_ in range(args.rounds):
            # each round starts one cache later, so none always runs first
            for name, block in runs[round_ % len(runs) :] + runs[: round_ % len(runs)]:
                start_run(name, block)
                results[name, block].append(
                    decode_steps(
                        caches[name, block],
                        args.steps,
                        args.q_heads,
                        args.kv_heads,
                        args.head_dim,
                    )
                )
        fp16_seconds, _, _, fp16_pipelined, *_ = round_medians(results[runs[0]])
        for name, block in runs:
            seconds, host, peak, pipelined, pipelined_peak, built, queued = (
                round_medians(results[name, block])
            )
            if args.profile and context == args.contexts[-1]:
                start_run(name, block)
                profiles.append((name, host_profile(caches[name, block], args)))
            size = cache_bytes(caches[name, block])
            ops = ""
            if args.count_ops:
                start_run(name, block)
                layer = caches[name, block][0]
                ops = f" {ops_per_layer(layer, args.q_heads, args.kv_heads, args.head_dim)} |"
            emit(
                f"| {name} | {context} | {block or '-'} | {seconds * 1e3:.2f} | {fp16_seconds / seconds:.2f}x | "
                f"{host * 1e3:.2f} | {size / 2**20:.1f} | {peak / 2**20:.1f} | {peak / size:.2f}x | "
                f"{pipelined * 1e3:.2f} | {fp16_pipelined / pipelined:.2f}x | {pipelined_peak / 2**20:.1f} | "
                f"{built * 1e3:.2f} / {queued * 1e3:.2f} |" + ops
            )
        del caches
    attention.DECODE_BLOCK_TOKENS = default_block
    for name, text in profiles:
        emit()
        emit(
            f"Host profile, {name}, {args.contexts[-1]} tokens (cProfile, by own time)"
        )
        emit()
        emit("```")
        emit(text)
        emit("```")
    if args.prefill:
        emit()
        emit(f"Prefill of {args.prefill} tokens in {args.chunk}-token chunks")
        emit()
        emit(
            "| cache | block scores : tokens : query rows | seconds | speed vs fp16 | "
            "peak MiB (caches included) | peak vs fp16 | cache MiB at the end |"
        )
        emit("|---|---|---:|---:|---:|---:|---:|")
        library = tuple(getattr(attention, n) for n in PREFILL_SETTINGS)
        settings = prefill_settings or [library]
        fp16_seconds = fp16_peak = None
        runs = [("fp16", library)] + [(n, b) for n in schemes for b in settings]
        for name, blocks in runs:
            for setting, value in zip(PREFILL_SETTINGS, blocks):
                setattr(attention, setting, value)
            make = cache_maker(name)
            seconds, peak, size = prefill(
                make,
                args.layers,
                args.prefill,
                args.chunk,
                args.q_heads,
                args.kv_heads,
                args.head_dim,
            )
            fp16_seconds, fp16_peak = fp16_seconds or seconds, fp16_peak or peak
            emit(
                f"| {name} | {':'.join(map(str, blocks)) if name != 'fp16' else '-'} | "
                f"{seconds:.1f} | {fp16_seconds / seconds:.2f}x | {peak / 2**20:.1f} | "
                f"{peak / fp16_peak:.2f}x | {size / 2**20:.1f} |"
            )
        for setting, value in zip(PREFILL_SETTINGS, library):
            setattr(attention, setting, value)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
