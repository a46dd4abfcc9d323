# copied into tests/ as a test file and run on CPU: the failing process's saved prefix caches
# (prefix_fail_*.safetensors, from s22_c.sh) against the same prefixes computed on CPU
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import save_prompt_cache
from test_chunk_invariance import PROMPT, load_sliding

from mlx_lm_turbo import make_prompt_cache
from mlx_lm_turbo.cache.cache import register_cache_classes

GPU_DIR = "benchmarks/results/reuse_failure_h200_4f56b27"


def test_cmp(tiny_model, tmp_path):
    register_cache_classes()
    model, _ = load_sliding(tiny_model, "gpt_oss")
    for shared in (40,):
        prefix = make_prompt_cache(model, "turbo4", boundary_skip=0)
        model(mx.array([PROMPT[:shared]]), cache=prefix)
        f = str(tmp_path / "p.safetensors")
        save_prompt_cache(f, prefix)
        cpu = mx.load(f)
        gpu = mx.load(f"{GPU_DIR}/prefix_fail_{shared}.safetensors")
        for k in sorted(
            cpu, key=lambda s: [int(x) if x.isdigit() else x for x in s.split(".")]
        ):
            a, b = np.array(cpu[k]), np.array(gpu[k])
            if a.size == 0 or a.shape != b.shape:
                continue
            if a.dtype.kind == "f":
                print(shared, k, a.shape, f"maxdiff {np.abs(a - b).max():.3g}")
            else:
                print(
                    shared,
                    k,
                    a.shape,
                    "share of words differing",
                    round(float((a != b).mean()), 3),
                )
