# copied to tests/test_s23_probe.py on the device: the reuse failure's prefix alone.
# In a fresh process, MLX's buffer cache is first filled (S23_POISON=hex) with buffers of
# that 32-bit word, then the 40-token prefix of test_a_sliding_window_cache_reused_or_
# reloaded_equals_a_cold_one is computed on the GPU as that test computes it (logits
# never evaluated; the cache's state evaluated by save_prompt_cache), then again on the
# CPU in the same process, and the two caches are compared layer by layer.
# S23_CACHE=turbo4|plain (mlx-lm's own caches); S23_NOSORT=1: GPT-OSS's experts without
# the sorted gather (mlx-lm sorts at 64 or more (token, expert) pairs); S23_TAP=1: layer
# 0's attention and MLP outputs kept (unevaluated) and compared too, and with S23_TAP=all
# every block's input, attention and MLP outputs. S23_WARM=1: the earlier test of the
# failing selection (test_sliding_window_models_generate_the_same_for_every_prefill_step_
# size[gpt_oss]) runs first in the same process; S23_CLEAR=1 then collects and clears
# MLX's buffer cache before the prefix.
import os

import mlx.core as mx
import numpy as np
from mlx_lm.models import gpt_oss, switch_layers
from mlx_lm.models.cache import make_prompt_cache as mlx_make_prompt_cache
from mlx_lm.models.cache import save_prompt_cache
from test_chunk_invariance import PROMPT, load_sliding

from mlx_lm_turbo import make_prompt_cache
from mlx_lm_turbo.cache.cache import register_cache_classes

NAME = os.environ.get("S23_NAME", "?")
TAPS = []


def poison(word):
    value = np.array([word], np.uint32).view(np.int32)[0].item()
    sizes = sorted({int(16 * 1.19**k) // 4 for k in range(90)})
    arrays = [mx.full((n,), value, mx.int32) for n in sizes for _ in range(3)]
    arrays += [mx.full((n,), value, mx.int32) for n in (1, 2, 4, 8) for _ in range(200)]
    mx.eval(arrays)
    del arrays
    mx.synchronize()


def unsorted_switch_glu(self, x, indices):
    x = mx.expand_dims(x, (-2, -3))
    idx = mx.stop_gradient(indices)
    x_up = self.up_proj(x, idx)
    x_gate = self.gate_proj(x, idx)
    x = self.down_proj(self.activation(x_up, x_gate), idx)
    return x.squeeze(-2)


def tapped_block(self, x, mask, cache=None):
    residual = x
    a = self.self_attn(self.input_layernorm(x), mask, cache)
    h = residual + a
    m = self.mlp(self.post_attention_layernorm(h))
    if self is FIRST[0] or (FIRST[0] is None and TAP_ALL[0]):
        TAPS.extend([x, a, m] if TAP_ALL[0] else [a, m])
    return h + m


TAP_ALL = [False]


FIRST = [None]


def prefix_state(model, kind, shared, path):
    if kind == "plain":
        cache = mlx_make_prompt_cache(model)
    else:
        cache = make_prompt_cache(model, kind, boundary_skip=0)
    model(mx.array([PROMPT[:shared]]), cache=cache)
    save_prompt_cache(path, cache)
    return mx.load(path)


def test_probe(tiny_model, tmp_path):
    register_cache_classes()
    if os.environ.get("S23_WARM"):
        import gc

        from test_chunk_invariance import (
            test_sliding_window_models_generate_the_same_for_every_prefill_step_size as warm,
        )

        warm(tiny_model, "gpt_oss")
        if os.environ.get("S23_CLEAR"):
            gc.collect()
            mx.synchronize()
            mx.clear_cache()
    word = os.environ.get("S23_POISON")
    if word:
        poison(int(word, 16))
    if os.environ.get("S23_NOSORT"):
        switch_layers.SwitchGLU.__call__ = unsorted_switch_glu
    model, _ = load_sliding(tiny_model, "gpt_oss")
    if os.environ.get("S23_TAP"):
        TAP_ALL[0] = os.environ["S23_TAP"] == "all"
        FIRST[0] = None if TAP_ALL[0] else model.model.layers[0]
        gpt_oss.TransformerBlock.__call__ = tapped_block
    kind = os.environ.get("S23_CACHE", "turbo4")
    shared = int(os.environ.get("S23_SHARED", "40"))
    gpu = prefix_state(model, kind, shared, str(tmp_path / "gpu.safetensors"))
    gpu_taps = [np.array(t) for t in TAPS]
    TAPS.clear()
    mx.set_default_device(mx.cpu)
    with mx.stream(mx.cpu):
        cpu = prefix_state(model, kind, shared, str(tmp_path / "cpu.safetensors"))
        cpu_taps = [np.array(t) for t in TAPS]
    worst = {}
    for k in cpu:
        a, b = np.array(cpu[k]), np.array(gpu[k])
        if a.size == 0 or a.shape != b.shape:
            continue
        layer = k.split(".")[0]
        if a.dtype.kind == "f":
            d = float(np.abs(a.astype(np.float64) - b).max())
            worst[layer] = max(worst.get(layer, (0, 0)), (d, 0))
        else:
            share = float((a != b).mean())
            f, s = worst.get(layer, (0, 0))
            worst[layer] = (f, max(s, share))
    summary = " ".join(
        f"L{k}:{f:.2g}/{s:.2f}"
        for k, (f, s) in sorted(worst.items(), key=lambda t: int(t[0]))
    )
    names = (
        [f"{p}{i}" for i in range(4) for p in ("in", "attn", "mlp")]
        if TAP_ALL[0]
        else ["attn0", "mlp0"]
    )
    taps = " ".join(
        f"{n}:{float(np.abs(g - c).max()):.2g}"
        for n, g, c in zip(names, gpu_taps, cpu_taps)
    )
    bad = any(f > 1e-2 or s > 0.01 for f, s in worst.values())
    print(f"S23 {NAME} {'WRONG' if bad else 'right'} {summary} {taps}", flush=True)
