"""Regenerate ``mlx_lm_turbo/codec/codebooks.json``: Lloyd-Max codebooks for TurboQuant.

After a random rotation, each coordinate of a unit vector in R^d follows the
law with density proportional to (1 - x^2)^((d - 3) / 2) on [-1, 1] (a Beta
law; N(0, 1/d) is its limit). For each head dim and bit width this solves the
continuous Lloyd-Max problem for that density on a fine grid and stores the
positive half of the (symmetric) codebook and its mean squared error per unit
vector (d times the per-coordinate error).

Run:  python scripts/make_codebooks.py
"""

import json
from pathlib import Path

import numpy as np

HEAD_DIMS = (32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 512)
BITS = (1, 2, 3, 4, 5, 6, 8)
OUT = (
    Path(__file__).resolve().parent.parent / "mlx_lm_turbo" / "codec" / "codebooks.json"
)


def coordinate_density(d, n_points=2_000_001):
    # The density is negligible beyond 12 standard deviations (1/sqrt(d) each).
    half_width = min(1.0, 12.0 / np.sqrt(d))
    x = np.linspace(-half_width, half_width, n_points)
    log_w = 0.5 * (d - 3) * np.log1p(-np.minimum(x * x, 1 - 1e-12))
    w = np.exp(log_w - log_w.max())
    return x, w / w.sum()


def lloyd_max(x, w, levels, iterations=3000, tol=1e-12):
    cw = np.concatenate([[0.0], np.cumsum(w)])
    cxw = np.concatenate([[0.0], np.cumsum(x * w)])
    # Start from the high-resolution optimum: quantiles of density^(1/3).
    w3 = np.cumsum(w ** (1 / 3))
    w3 /= w3[-1]
    centroids = np.interp((np.arange(levels) + 0.5) / levels, w3, x)
    for _ in range(iterations):
        edges = (centroids[1:] + centroids[:-1]) / 2
        cut = np.concatenate([[0], np.searchsorted(x, edges), [len(x)]])
        mass = cw[cut[1:]] - cw[cut[:-1]]
        new = (cxw[cut[1:]] - cxw[cut[:-1]]) / np.maximum(mass, 1e-300)
        new = np.where(mass > 0, new, centroids)
        new = (new - new[::-1]) / 2  # enforce the law's symmetry
        done = np.max(np.abs(new - centroids)) < tol
        centroids = new
        if done:
            break
    edges = (centroids[1:] + centroids[:-1]) / 2
    cell = np.searchsorted(edges, x)
    mse = float(np.sum(w * (x - centroids[cell]) ** 2))
    return centroids, mse


def main():
    tables = {}
    for d in HEAD_DIMS:
        x, w = coordinate_density(d)
        for bits in BITS:
            centroids, mse = lloyd_max(x, w, 2**bits)
            half = centroids[2 ** (bits - 1) :]
            tables[f"{d}/{bits}"] = {
                "positive_half": [float(f"{c:.8g}") for c in half],
                "unit_vector_mse": float(f"{mse * d:.6g}"),
            }
            print(f"d={d:4d} bits={bits}  mse(unit vector)={mse * d:.5f}")
    OUT.write_text(
        json.dumps({"head_dims": HEAD_DIMS, "bits": BITS, "tables": tables}, indent=1)
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
