# pytest -p s22_plugin (PYTHONPATH=devrun): S22_REC=path records every custom-kernel call
# while ACTIVE (inputs before, outputs after, each evaluated) and save() writes them;
# S22_COUNTERS16=1 gives each layer's group counters at least 4 words (16 bytes: out of
# MLX-CUDA's small pool of allocations of at most 8 bytes)
import json
import os

import mlx.core as mx
import numpy as np

CALLS, ACTIVE = [], [False]
_original = mx.fast.cuda_kernel


def _recording(*args, **kwargs):
    kernel, name = _original(*args, **kwargs), kwargs.get("name", "?")

    def call(**k):
        if not ACTIVE[0]:
            return kernel(**k)
        mx.eval(k["inputs"])
        ins = [np.array(a) for a in k["inputs"]]
        outs = kernel(**k)
        mx.eval(outs)
        CALLS.append((name, k["grid"], ins, [np.array(o) for o in outs]))
        return outs

    return call


def save():
    arrays, meta = {}, []
    for i, (name, grid, ins, outs) in enumerate(CALLS):
        meta.append([name, list(grid), len(ins), len(outs)])
        arrays.update({f"{i}_in{j}": a for j, a in enumerate(ins)})
        arrays.update({f"{i}_out{j}": a for j, a in enumerate(outs)})
    np.savez_compressed(os.environ["S22_REC"], meta=json.dumps(meta), **arrays)


if os.environ.get("S22_REC"):
    mx.fast.cuda_kernel = _recording
    print("S22 recording")

if os.environ.get("S22_COUNTERS16"):
    from mlx_lm_turbo.kernels.decode_attention import _Layer

    def zeroed_counters(self, groups):
        if self.counters is None or self.counters.size < groups:
            self.counters = mx.zeros((max(groups, 4),), mx.uint32)
            mx.eval(self.counters)
        return self.counters

    _Layer.zeroed_counters = zeroed_counters
    print("S22 counters of at least 16 bytes")

if os.environ.get("S22_NOCOMPILE_DEQ"):
    from functools import lru_cache

    import mlx_lm_turbo.codec.codec as codec_module
    from mlx_lm_turbo.codec.codebooks import codebook
    from mlx_lm_turbo.codec.packing import unpack

    @lru_cache(maxsize=None)
    def _plain_dequantizer(bits, head_dim, dtype):
        levels = codebook(head_dim, bits).astype(dtype)
        return lambda codes, norms: (
            levels[unpack(codes, bits, head_dim)] * norms.astype(dtype)
        )

    codec_module._dequantizer = _plain_dequantizer
    print("S22 dequantizer not compiled")

if os.environ.get("S22_CHECK"):
    # each blockwise attention and each dequantization checked against the same call on
    # the CPU stream, uncompiled: a mismatch prints its call number and shapes
    import mlx_lm_turbo.cache.attention as attention_module
    import mlx_lm_turbo.codec.codec as codec_module

    def _reference(fn, *args):
        mx.disable_compile()
        try:
            with mx.stream(mx.cpu):
                return fn(*args)
        finally:
            mx.enable_compile()

    def _checked(fn, label, shapes):
        count = [0]

        def call(*args):
            out = fn(*args)
            ref = _reference(fn, *args)
            mx.eval(out, ref)
            count[0] += 1
            d = mx.abs(out.astype(mx.float32) - ref.astype(mx.float32)).max().item()
            if d > 1e-3 or count[0] <= 2:
                print(
                    f"S22 {label} #{count[0]} maxdiff {d:.3g} {shapes(*args)}",
                    flush=True,
                )
            return out

        return call

    def _deq_shapes(codes, norms, bits, head_dim, dtype):
        return f"codes {codes.shape} norms {norms.shape} bits {bits} dim {head_dim} {dtype}"

    def _bw_shapes(queries, kv, scale, mask, sinks=None):
        m = mask if isinstance(mask, str) or mask is None else mask.shape
        return f"q {queries.shape} stored {kv.stored[-1].shape} new {None if kv.new_keys is None else kv.new_keys.shape} sinks {None if kv.sinks is None else kv.sinks[0].shape} mask {m} window {kv.window}"

    deq = _checked(codec_module.dequantize_rotated, "DEQ", _deq_shapes)
    codec_module.dequantize_rotated = attention_module.dequantize_rotated = deq
    attention_module.blockwise_attention = _checked(
        attention_module.blockwise_attention, "BW", _bw_shapes
    )
    print("S22 checking against the CPU")

if os.environ.get("S22_GATHER_CHECK"):
    # every gather_mm checked against the same call on the CPU stream
    _gather_mm = mx.gather_mm
    _gather_count = [0]

    def _checked_gather_mm(a, b, *args, **kwargs):
        out = _gather_mm(a, b, *args, **kwargs)
        with mx.stream(mx.cpu):
            ref = _gather_mm(a, b, *args, **kwargs)
        mx.eval(out, ref)
        _gather_count[0] += 1
        d = mx.abs(out - ref).max().item()
        if d > 1e-3 or _gather_count[0] <= 2:
            print(
                f"S22 GATHER #{_gather_count[0]} maxdiff {d:.3g} a {a.shape} b {b.shape} {kwargs.get('sorted_indices')}",
                flush=True,
            )
        return out

    mx.gather_mm = _checked_gather_mm
    print("S22 checking gather_mm against the CPU")
