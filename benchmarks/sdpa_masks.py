"""Which masks MLX's fused attention takes as they are: one prefill-shaped call of
``mx.fast.scaled_dot_product_attention`` (32 query / 8 KV heads, head_dim 128, float16,
1213 queries over 18432 keys) per mask form, with and without ``force_fused``: its time
and its peak memory above the inputs. Why ``cache.attention.dense_prefill_attention``
builds its mask additive in the model dtype (benchmarks/results/prefill_h200_73d6513.md).

    python benchmarks/sdpa_masks.py
"""

import time

import mlx.core as mx

Hq, Hkv, D, L, T = 32, 8, 128, 1213, 18432


def main():
    q = mx.random.normal((1, Hq, L, D)).astype(mx.float16)
    k = mx.random.normal((1, Hkv, T, D)).astype(mx.float16)
    v = mx.random.normal((1, Hkv, T, D)).astype(mx.float16)
    visible = mx.arange(T)[None] <= mx.arange(T - L, T)[:, None]
    additive = mx.where(visible, 0, mx.finfo(mx.float16).min).astype(mx.float16)
    mx.eval(q, k, v, visible, additive)
    masks = {
        '"causal"': "causal",
        "additive (L, T)": additive,
        "additive (1, 1, L, T)": additive[None, None],
        "bool (L, T)": visible,
        "additive (1, Hq, L, T), materialised": mx.contiguous(
            mx.broadcast_to(additive, (1, Hq, L, T))
        ),
    }
    print(f"{mx.default_device()}, mlx {mx.__version__}")
    print("| mask | force_fused | ms | peak MiB above the inputs |")
    print("|---|---|---:|---:|")
    for name, mask in masks.items():
        if not isinstance(mask, str):
            mx.eval(mask)
        for force_fused in (False, True):

            def call():
                return mx.fast.scaled_dot_product_attention(
                    q, k, v, scale=0.1, mask=mask, force_fused=force_fused
                )

            try:
                mx.clear_cache()
                mx.reset_peak_memory()
                before = mx.get_active_memory()
                mx.eval(call())
                start = time.perf_counter()
                for _ in range(5):
                    mx.eval(call())
                ms = (time.perf_counter() - start) / 5 * 1e3
                peak = (mx.get_peak_memory() - before) / 2**20
                print(f"| {name} | {force_fused} | {ms:.2f} | {peak:.1f} |")
            except ValueError as e:  # force_fused where MLX has no fused kernel
                print(f"| {name} | {force_fused} | refused: {str(e)[:80]} | - |")


if __name__ == "__main__":
    main()
