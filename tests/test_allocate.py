"""Per-layer bit allocation: the budget holds, and the bits go where the measured
sensitivities say they cut the error most."""

import mlx.core as mx
import pytest
from mlx_lm import load

from mlx_lm_turbo import make_prompt_cache
from mlx_lm_turbo.codec.schemes import KVScheme
from mlx_lm_turbo.tools.allocate import (
    LayerShape,
    all_in_bits,
    allocate,
    layer_sensitivities,
    layer_shapes,
)

SHAPES = [LayerShape(i, 2, 64, 64, 1024, 16) for i in range(4)]


def flat(scale=1.0):
    """Sensitivities that shrink 4x per extra bit, the same for every layer."""
    return {w: scale * 4.0**-w for w in (2, 3, 4, 8)}


def sensitivities(key_scales, value_scales):
    return {
        i: {"key": flat(k), "value": flat(v)}
        for i, (k, v) in enumerate(zip(key_scales, value_scales))
    }


@pytest.mark.parametrize("budget", [2.75, 3.0, 3.5, 4.0, 4.5, 6.0, 8.5])
def test_the_plan_stays_within_the_budget_and_uses_it(budget):
    plan = allocate(SHAPES, sensitivities([1, 5, 2, 9], [1, 1, 3, 1]), budget)
    spent = all_in_bits(SHAPES, plan)
    assert spent <= budget
    # No widening left (one layer's keys or values to the next width) fits: a bit of
    # one part of one layer is 1 / (2 x layers) bits per value over them all.
    widths = (2, 3, 4, 8)
    steps = [
        (widths[widths.index(w) + 1] - w) / (2 * len(SHAPES))
        for s in plan.values()
        for w in (s.key_bits, s.value_bits)
        if w < 8
    ]
    assert not steps or spent > budget - min(steps)


def test_a_budget_below_the_narrowest_plan_is_refused():
    with pytest.raises(ValueError, match="below the narrowest plan"):
        allocate(SHAPES, sensitivities([1] * 4, [1] * 4), 2.0)


def test_bits_go_to_the_sensitive_layers_and_parts():
    # Layer 1's keys and layer 2's values are 100x as sensitive as anything else.
    plan = allocate(SHAPES, sensitivities([1, 100, 1, 1], [1, 1, 100, 1]), 3.5)
    others = [plan[0], plan[3]]
    assert all(plan[1].key_bits > s.key_bits for s in others)
    assert all(plan[2].value_bits > s.value_bits for s in others)
    assert plan[1].key_bits > plan[1].value_bits
    assert plan[2].value_bits > plan[2].key_bits
    # The same budget, the other way round: the plan follows the measurements.
    swapped = allocate(SHAPES, sensitivities([1, 1, 100, 1], [1, 100, 1, 1]), 3.5)
    others = [swapped[0], swapped[3]]
    assert all(swapped[2].key_bits > s.key_bits for s in others)
    assert all(swapped[1].value_bits > s.value_bits for s in others)


def test_the_plan_beats_the_uniform_one_at_the_same_bits():
    sens = sensitivities([1, 20, 3, 0.5], [2, 1, 6, 0.5])
    uniform = {s.index: KVScheme(3, 3) for s in SHAPES}
    plan = allocate(SHAPES, sens, all_in_bits(SHAPES, uniform))

    def error(p):
        return sum(
            sens[i]["key"][s.key_bits] + sens[i]["value"][s.value_bits]
            for i, s in p.items()
        )

    assert error(plan) < 0.8 * error(uniform)


def test_sink_tokens_and_windows_are_counted():
    global_layer = LayerShape(0, 1, 256, 256, 1024, 16)
    window_layer = LayerShape(1, 1, 256, 256, 512, 0)
    plan = {0: KVScheme(4, 4), 1: KVScheme(4, 4)}
    codes = 4 + 16 / 256
    # 16 bits a value, and a float32 query energy per pair of key channels (8 bits a
    # value over keys and values), for 16 of 1024 tokens
    sinks = 16 * (16 + 32 / 4) / 1024
    expected = (1024 * (codes + sinks) + 512 * codes) / (1024 + 512)
    assert all_in_bits([global_layer, window_layer], plan) == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [mx.float16, mx.float32])
def test_counted_bits_are_what_the_cache_stores(tiny_model, dtype):
    model, _ = load(str(tiny_model("llama")))
    model.set_dtype(dtype)  # exact sink tokens keep the model's dtype
    tokens = mx.arange(3, 3 + 80)[None]
    plan = {0: KVScheme(2, 8), 1: KVScheme(8, 3), 2: KVScheme(4, 2)}
    cache = make_prompt_cache(model, "turbo3", boundary_skip=0, layer_schemes=plan)
    model(tokens, cache=cache)
    shapes = layer_shapes(model, 80)
    schemes = {s.index: plan.get(s.index, KVScheme(3, 3)) for s in shapes}
    stored = sum(
        8 * sum(a.nbytes for a in (*c._stored_slice(), *c.sinks, c.sink_query_energy))
        for c in cache
    )
    assert all_in_bits(shapes, schemes) == pytest.approx(
        stored / sum(s.values for s in shapes)
    )


def test_measured_sensitivities_fall_with_width(tiny_model):
    model, _ = load(str(tiny_model("llama")))
    sens = layer_sensitivities(model, mx.arange(3, 3 + 64), probe_tokens=40)
    assert len(sens) == len(model.layers)
    for parts in sens.values():
        for errors in parts.values():
            assert errors[2] > errors[3] > errors[4] > errors[8] > 0
