# Imported by tests/test_s23_ci.py (test_chunk_invariance.py with the reuse test's prefix
# compared against the CPU): GPT-OSS blocks that record their input, attention output
# and MLP output while RECORD is on (the same ops as mlx-lm's block), and the comparison.
import os

import mlx.core as mx
import numpy as np
from mlx_lm.models import gpt_oss
from mlx_lm.models.cache import save_prompt_cache

TAPS, RECORD = [], [False]


def _block(self, x, mask, cache=None):
    residual = x
    a = self.self_attn(self.input_layernorm(x), mask, cache)
    h = residual + a
    m = self.mlp(self.post_attention_layernorm(h))
    if RECORD[0]:
        TAPS.extend([x, a, m])
    return h + m


MOE_NAMES = (
    "g",
    "inds",
    "weights",
    "sx",
    "sidx",
    "inv",
    "up",
    "gate",
    "act",
    "down",
    "unsorted",
    "y",
)


def _mlp(self, x):
    # mlx-lm's MLPBlock and SwitchGLU (sorted path at >= 64 pairs) inlined, recording
    # each op's output for the first block's call (S23_TAP=moe)
    from mlx_lm.models.switch_layers import _gather_sort, _scatter_unsort

    g = self.router(x)
    experts, indices = gpt_oss.mlx_topk(g, k=self.num_experts_per_tok, axis=-1)
    weights = mx.softmax(experts, axis=-1, precise=True)
    e = self.experts
    xe = mx.expand_dims(x, (-2, -3))
    indices = mx.stop_gradient(indices)
    do_sort = indices.size >= 64
    idx, inv = indices, indices
    if do_sort:
        xe, idx, inv = _gather_sort(xe, indices)
    up = e.up_proj(xe, idx, sorted_indices=do_sort)
    gate = e.gate_proj(xe, idx, sorted_indices=do_sort)
    act = e.activation(up, gate)
    down = e.down_proj(act, idx, sorted_indices=do_sort)
    out = _scatter_unsort(down, inv, indices.shape) if do_sort else down
    out = out.squeeze(-2)
    y = (out * mx.expand_dims(weights, axis=-1)).sum(axis=-2)
    if RECORD[0] and not MOE_TAPS:
        MOE_TAPS.extend(
            [g, indices, weights, xe, idx, inv, up, gate, act, down, out, y]
        )
        DOWN.clear()
        DOWN.extend([e.down_proj, act, idx, down])
    return y


MOE_TAPS = []
DOWN = []  # (the down projection, its input, indices, output) of the first call


def recompute_down():
    """The first MLP's down projection again on the GPU from its evaluated inputs:
    sorted as before and not, against what the prefix's graph gave."""
    if not DOWN:
        return ""
    proj, act, idx, down = DOWN
    again = proj(act, idx, sorted_indices=True)
    unsorted = proj(act, idx, sorted_indices=False)
    mx.eval(again, unsorted)
    return (
        f"again:{mx.abs(again - down).max().item():.2g} "
        f"unsorted:{mx.abs(unsorted - down).max().item():.2g}"
    )


if os.environ.get("S23_TAP") == "moe":
    gpt_oss.MLPBlock.__call__ = _mlp
elif os.environ.get("S23_TAP"):
    gpt_oss.TransformerBlock.__call__ = _block


def prefix(model, make, tokens, path):
    cache = make()
    TAPS.clear()
    RECORD[0] = True
    model(mx.array([tokens]), cache=cache)
    RECORD[0] = False
    save_prompt_cache(path, cache)
    taps = [np.array(t) for t in TAPS + MOE_TAPS]
    TAPS.clear()
    MOE_TAPS.clear()
    return mx.load(path), taps


def compare(model, make, tokens, gpu_path, tmp_path, gpu_taps):
    gpu = mx.load(gpu_path)
    redo = recompute_down()
    DOWN.clear()
    device = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        with mx.stream(mx.cpu):
            cpu, cpu_taps = prefix(
                model, make, tokens, str(tmp_path / "cpu.safetensors")
            )
    finally:
        mx.set_default_device(device)
    worst = {}
    for k in cpu:
        a, b = np.array(cpu[k]), np.array(gpu[k])
        if a.size == 0 or a.shape != b.shape:
            continue
        layer = k.split(".")[0]
        f, s = worst.get(layer, (0.0, 0.0))
        if a.dtype.kind == "f":
            f = max(f, float(np.abs(a.astype(np.float64) - b).max()))
        else:
            s = max(s, float((a != b).mean()))
        worst[layer] = (f, s)
    summary = " ".join(
        f"L{k}:{f:.2g}/{s:.2f}"
        for k, (f, s) in sorted(worst.items(), key=lambda t: int(t[0]))
    )
    if os.environ.get("S23_TAP") == "moe":
        names = MOE_NAMES
    else:
        names = [
            f"{p}{i}" for i in range(len(gpu_taps) // 3) for p in ("in", "attn", "mlp")
        ]
    taps = " ".join(
        f"{n}:{float(np.abs(g.astype(np.float64) - c).max()):.2g}"
        for n, g, c in zip(names, gpu_taps, cpu_taps)
    )
    bad = any(f > 1e-2 or s > 0.01 for f, s in worst.values())
    name = os.environ.get("S23_NAME")
    print(
        f"S23 {name} {'WRONG' if bad else 'right'} {summary} {taps} {redo}", flush=True
    )
