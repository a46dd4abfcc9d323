"""Run by tests/test_distributed.py under ``mlx.launch``: one rank of a pipeline-sharded
model with TurboQuant caches, checked against the same model in this one process.

    mlx.launch -n 2 --backend ring --hosts 127.0.0.1 -- python distributed_check.py MODEL_DIR pipeline|tensor

Each rank prints one line ``RESULT {json}``: its layers, whether its plan is the
one-process plan cut to those layers, and its cache bytes next to the one-process
cache's bytes for those layers after the same prefill (a tensor rank holds all
layers, each with its share of the KV heads). Caches made through mlx-lm's own
``make_prompt_cache`` with a scheme active, as the commands make them, print the
compression notice on rank 0 alone.
"""

import json
import sys
from dataclasses import replace

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models import cache as mlx_cache
from mlx_lm.utils import sharded_load

from mlx_lm_turbo import make_prompt_cache, plan, settings
from mlx_lm_turbo.codec.schemes import parse_scheme

SCHEME = "turbo4"
# The boundary layers across ranks are what the test checks; W 1 so that most of the
# 40-token prompt is compressed, as the tensor run's bound against another seed needs.
OPTIONS = dict(boundary_skip=2, recent_exact=1)
PROMPT = mx.array([[(7 * i) % 200 + 3 for i in range(40)]])


def prefill(model, scheme=SCHEME, seed=0):
    cache = make_prompt_cache(model, scheme, seed=seed, **OPTIONS)
    logits = model(PROMPT, cache=cache)
    mx.eval(logits, [c.state for c in cache])
    return cache, logits


def main(model_dir, sharding):
    group = mx.distributed.init()
    if sharding == "pipeline":
        sharded, _ = sharded_load(model_dir, pipeline_group=group)
        start, end = sharded.model.start_idx, sharded.model.end_idx
    else:
        sharded, _ = sharded_load(model_dir, tensor_group=group)
        start, end = 0, len(sharded.layers)
    whole, _ = load(model_dir)

    _, _, whole_plan, _ = plan(whole, SCHEME, boundary_skip=OPTIONS["boundary_skip"])
    _, _, rank_plan, _ = plan(sharded, SCHEME, boundary_skip=OPTIONS["boundary_skip"])
    share = [replace(p, index=p.layer - start) for p in whole_plan[start:end]]

    rank_cache, rank_logits = prefill(sharded)
    whole_cache, whole_logits = prefill(whole)
    # Two rotation seeds quantize every key independently: the most a run can differ
    # from another by quantization alone, the bound for a tensor rank's float noise,
    # which flips codes at boundaries (benchmarks/sharded.py).
    other_seed_difference = (
        mx.abs(prefill(whole, seed=1)[1] - whole_logits).max().item()
    )
    uncompressed_difference = (
        mx.abs(prefill(sharded, "none")[1] - prefill(whole, "none")[1]).max().item()
    )
    result = {
        "rank": group.rank(),
        "size": group.size(),
        "layers": [start, end],
        "plan_matches": rank_plan == share,
        "schemes": {p.layer: p.scheme.name if p.scheme else None for p in rank_plan},
        "rank_bytes": [c.nbytes for c in rank_cache],
        "share_bytes": [c.nbytes for c in whole_cache[start:end]],
        "whole_bytes": sum(c.nbytes for c in whole_cache),
        "seeds": [getattr(c, "layer", None) for c in rank_cache],
        "max_logit_difference": mx.abs(rank_logits - whole_logits).max().item(),
        "max_logit_difference_uncompressed": uncompressed_difference,
        "max_logit_difference_other_seed": other_seed_difference,
    }
    print("RESULT " + json.dumps(result), flush=True)

    settings.active = settings.Settings(parse_scheme(SCHEME))
    mlx_cache.make_prompt_cache(sharded)
    settings.active = None


if __name__ == "__main__":
    main(*sys.argv[1:])
