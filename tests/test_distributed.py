"""Compressed caches under mx.distributed (issue 15): a pipeline rank plans by the
model's layer numbers, as one process does."""

from dataclasses import replace

import mlx.core as mx
import pytest
from mlx_lm.utils import _get_classes

from mlx_lm_turbo import make_prompt_cache, plan
from tiny_models import CONFIGS

QWEN2 = dict(model_type="qwen2", hidden_size=64, num_hidden_layers=8, intermediate_size=128,
             num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, vocab_size=64,
             tie_word_embeddings=True)


class FakeGroup:
    """What ``PipelineMixin.pipeline`` reads of a group: its rank and size."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


def build(config, pipeline=None):
    """A model of ``config`` (unevaluated random weights), pipelined as ``sharded_load`` does."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if pipeline is not None:
        model.model.pipeline(FakeGroup(*pipeline))
    return model


def rank_share(whole, model):
    """The one-process plan cut to the layers a pipeline rank holds, numbered as its caches are."""
    start = model.model.start_idx
    return [replace(p, index=p.layer - start) for p in whole[start:model.model.end_idx]]


@pytest.fixture
def overrides(tmp_path, monkeypatch):
    from mlx_lm_turbo.registry import registry

    def write(text):
        path = tmp_path / "overrides.toml"
        path.write_text(text)
        monkeypatch.setenv("MLX_LM_TURBO_OVERRIDES", str(path))
        registry.cache_clear()

    yield write
    monkeypatch.delenv("MLX_LM_TURBO_OVERRIDES", raising=False)
    registry.cache_clear()


@pytest.mark.parametrize("name, config, size", [
    ("qwen2", QWEN2, 2), ("qwen2", QWEN2, 3), ("qwen3_5", CONFIGS["qwen3_5"], 2), ("qwen3_5", CONFIGS["qwen3_5"], 3),
])
def test_pipeline_rank_plan_is_the_one_process_plan_restricted_to_its_layers(name, config, size):
    config = {"vocab_size": 64, **config}
    _, _, whole, _ = plan(build(config), "turbo4")
    assert [p.index for p in whole] == [p.layer for p in whole] == list(range(len(whole)))
    held = []
    for rank in range(size):
        model = build(config, pipeline=(rank, size))
        _, _, layers, _ = plan(model, "turbo4")
        assert layers == rank_share(whole, model)
        held += [p.layer for p in layers]
    assert sorted(held) == list(range(len(whole)))


def test_eight_layers_over_two_ranks_protect_layers_0_1_6_7_only():
    """The issue's case: each rank used to protect its own first and last two layers."""
    boundary = {}
    for rank in range(2):
        model = build(QWEN2, pipeline=(rank, 2))
        _, _, layers, _ = plan(model, "turbo4")
        boundary.update({p.layer: p.scheme.name for p in layers})
    assert boundary == {0: "turbo8", 1: "turbo8", 2: "turbo4", 3: "turbo4",
                        4: "turbo4", 5: "turbo4", 6: "turbo8", 7: "turbo8"}


def test_pipeline_caches_take_the_model_layer_as_rotation_seed():
    model = build(QWEN2, pipeline=(0, 2))  # rank 0 holds the last layers, 4-7
    caches = make_prompt_cache(model, "turbo4")
    assert [c.layer for c in caches] == [4, 5, 6, 7]
    assert [c.scheme.name for c in caches] == ["turbo4", "turbo4", "turbo8", "turbo8"]


def test_pipeline_overrides_name_model_layers(overrides):
    overrides('[[override]]\nmodel_type = "qwen2"\nlayer_schemes = { 5 = "turbo3", 2 = "turbo2" }\n')
    schemes = {}
    for rank in range(2):
        _, _, layers, _ = plan(build(QWEN2, pipeline=(rank, 2)), "turbo4")
        schemes.update({p.layer: (p.scheme.name, p.reason) for p in layers})
    assert schemes[5] == ("turbo3", "per-layer override") and schemes[2] == ("turbo2", "per-layer override")
    # An entry past the model's last layer is refused on every rank, not only where it would fall.
    from mlx_lm_turbo.errors import UsageError
    overrides('[[override]]\nmodel_type = "qwen2"\nlayer_schemes = { 8 = "turbo3" }\n')
    with pytest.raises(UsageError, match="whose caches are entries 0-7"):
        plan(build(QWEN2, pipeline=(1, 2)), "turbo4")


def test_planning_a_pipeline_rank_leaves_the_random_key_as_it_was():
    """The layout comes from an unloaded copy of the model, whose init must not shift sampling."""
    model = build(QWEN2, pipeline=(1, 2))
    mx.random.seed(7)
    expected = mx.random.uniform(shape=(4,))
    mx.random.seed(7)
    plan(model, "turbo4")
    assert mx.array_equal(mx.random.uniform(shape=(4,)), expected)
