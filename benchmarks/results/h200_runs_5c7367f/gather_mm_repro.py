"""MLX-CUDA's sorted gather_mm against the CPU, with MLX and mlx-lm alone (no mlx_lm_turbo).

The tiny GPT-OSS model of the project's tests (random weights, seed as tests/tiny_models.py,
float32) is built in memory. Mode ``mlp``: its first MLP block on random inputs of L tokens
(L from --lengths, in that order, repeated --rounds times), GPU against CPU, largest
difference printed per call; mlx-lm sorts the (token, expert) pairs from 64 on (top-2: L >= 32)
and passes gather_mm ``sorted_indices=True``. Mode ``model``: the whole model's forward over a
prompt of each length (fresh mlx-lm caches), logits GPU against CPU.

    python gather_mm_repro.py [--mode mlp|model] [--lengths 10 40] [--rounds 5]
"""

import argparse
import sys

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes

CONFIG = dict(
    model_type="gpt_oss",
    vocab_size=256,
    num_hidden_layers=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    hidden_size=128,
    intermediate_size=128,
    head_dim=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=16,
    layer_types=["sliding_attention", "full_attention"] * 2,
)


def build():
    model_class, args_class = _get_classes(CONFIG)
    mx.random.seed(sum(map(ord, "gpt_oss")))
    model = model_class(args_class.from_dict(CONFIG))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("mlp", "model"), default="mlp")
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 40])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = build()
    mlp = model.model.layers[0].mlp
    worst = 0.0
    for r in range(args.rounds):
        for n in args.lengths:
            if args.mode == "mlp":
                x = mx.random.normal(
                    (1, n, CONFIG["hidden_size"]), key=mx.random.key(n + 1000 * r)
                )
                gpu = mlp(x)
                mx.eval(gpu)
                with mx.stream(mx.cpu):
                    cpu = mlp(x)
                    mx.eval(cpu)
            else:
                tokens = mx.random.randint(
                    0, 256, (1, n), key=mx.random.key(n + 1000 * r)
                )
                gpu = model(tokens, cache=make_prompt_cache(model))
                mx.eval(gpu)
                with mx.stream(mx.cpu):
                    cpu = model(tokens, cache=make_prompt_cache(model))
                    mx.eval(cpu)
            diff = (gpu - cpu).abs().max().item()
            worst = max(worst, diff)
            print(
                f"REPRO {args.mode} round {r} L {n}: max |gpu - cpu| {diff:.3g}",
                flush=True,
            )
    ours = sorted(m for m in sys.modules if m.startswith("mlx_lm_turbo"))
    print(
        f"REPRO {args.mode} worst {worst:.3g} ({mx.default_device()}, MLX {mx.__version__}; "
        f"mlx_lm_turbo modules loaded: {ours or 'none'})"
    )


if __name__ == "__main__":
    main()
