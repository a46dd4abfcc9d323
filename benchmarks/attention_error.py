"""TurboQuant vs mlx-lm's affine KV quantization: attention error per bit.

Keys and values with realistic outlier structure (a per-channel bias and a few
channels an order of magnitude larger, as in real models' keys) are cached in
full, then attended by fresh decode queries. Prints, side by side in one run,
the relative error of the attention output against the unquantized cache and
the storage cost in bits per value.

    python benchmarks/attention_error.py [--tokens 2048] [--head-dim 128] [--trials 4]
"""

import argparse

import mlx.core as mx
from mlx_lm.models.base import quantized_scaled_dot_product_attention

from mlx_lm_turbo import TurboKV, TurboQuantKVCache
from mlx_lm_turbo.cache.attention import turbo_scaled_dot_product_attention


def realistic_kv(tokens, head_dim, n_kv_heads, seed):
    k = mx.random.split(mx.random.key(seed), 6)
    spread = mx.ones((head_dim,))
    spread[mx.random.randint(0, head_dim, (6,), key=k[0])] = 6.0
    bias = 2.0 * mx.random.normal((1, n_kv_heads, 1, head_dim), key=k[1])
    keys = mx.random.normal((1, n_kv_heads, tokens, head_dim), key=k[2]) * spread + bias
    value_spread = mx.exp(0.5 * mx.random.normal((head_dim,), key=k[3]))
    values = (
        mx.random.normal((1, n_kv_heads, tokens, head_dim), key=k[4]) * value_spread
    )
    return keys.astype(mx.float16), values.astype(mx.float16), k[5]


def relative_error(a, b):
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return (mx.linalg.norm(a - b) / mx.linalg.norm(b)).item()


def affine(queries, keys, values, scale, bits, group_size=64):
    q_keys = mx.quantize(keys, group_size=group_size, bits=bits)
    q_values = mx.quantize(values, group_size=group_size, bits=bits)
    stored = sum(a.nbytes for a in (*q_keys, *q_values))
    # A copy of the queries: mlx-lm scales them in place.
    out = quantized_scaled_dot_product_attention(
        mx.array(queries),
        q_keys,
        q_values,
        scale=scale,
        mask=None,
        group_size=group_size,
        bits=bits,
    )
    return out, stored


def turbo(queries, keys, values, scale, scheme):
    cache = TurboQuantKVCache(scheme)
    cache.update_and_fetch(keys, values)
    stored = cache._stored_slice()
    out = turbo_scaled_dot_product_attention(
        queries, TurboKV(cache.codec, stored), scale, None
    )
    return out, sum(a.nbytes for a in stored)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--q-heads", type=int, default=16)
    parser.add_argument(
        "--queries", type=int, default=16, help="decode queries per trial"
    )
    parser.add_argument("--trials", type=int, default=4)
    args = parser.parse_args()

    methods = [
        (f"turbo{b}", lambda q, k, v, s, b=b: turbo(q, k, v, s, f"turbo{b}"))
        for b in (8, 4, 3, 2)
    ]
    methods += [
        (f"affine {b}-bit (g64)", lambda q, k, v, s, b=b: affine(q, k, v, s, b))
        for b in (8, 4, 3, 2)
    ]
    errors = {name: [] for name, _ in methods}
    bits = {}
    for trial in range(args.trials):
        keys, values, qkey = realistic_kv(
            args.tokens, args.head_dim, args.kv_heads, trial
        )
        # Independent decode queries, each attending to every cached token (no mask).
        queries = mx.random.normal(
            (1, args.q_heads, args.queries, args.head_dim), key=qkey
        )
        queries = queries.astype(mx.float16)
        scale = args.head_dim**-0.5
        reference = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale
        )
        for name, fn in methods:
            out, stored = fn(queries, keys, values, scale)
            errors[name].append(relative_error(out, reference))
            bits[name] = stored * 8 / (2 * keys.size)

    print(
        f"Attention-output relative error, {args.tokens} cached tokens, head_dim {args.head_dim}, "
        f"{args.kv_heads} KV heads / {args.q_heads} query heads, {args.trials} trials x {args.queries} queries\n"
    )
    print("| cache | bits/value | rel. error of attention output |")
    print("|---|---:|---:|")
    for name, _ in sorted(methods, key=lambda m: -bits[m[0]]):
        print(
            f"| {name} | {bits[name]:.3f} | {sum(errors[name]) / len(errors[name]):.4f} |"
        )


if __name__ == "__main__":
    main()
