"""mlx-lm's attention routed to the turbo path for ``TurboKV`` keys.

mlx-lm's model modules bind ``scaled_dot_product_attention`` from
``mlx_lm.models.base`` by name when they are imported, so the dispatch is set on
``base`` (for modules imported later) and on every model module already loaded.
It only acts on ``TurboKV`` keys; everything else goes to the original.
"""

import importlib
import sys

from ..cache.view import TurboKV
from ..compat import check_mlx_lm_version


def _make_dispatch(original):
    turbo = None  # cache/attention.py, loaded when the first TurboKV comes

    def scaled_dot_product_attention(
        queries, keys, values, cache, scale, mask, sinks=None
    ):
        nonlocal turbo
        if isinstance(keys, TurboKV):
            if turbo is None:
                from ..cache import attention as turbo
            return turbo.turbo_scaled_dot_product_attention(
                queries, keys, scale, mask, sinks
            )
        return original(
            queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks
        )

    scaled_dot_product_attention.turbo_original = original
    return scaled_dot_product_attention


def install_attention_dispatch():
    """Idempotently route attention over turbo caches to the rotated-domain path."""
    check_mlx_lm_version()  # never patch an mlx-lm outside the tested range
    base = importlib.import_module("mlx_lm.models.base")
    original = base.scaled_dot_product_attention
    if hasattr(original, "turbo_original"):
        return
    dispatch = _make_dispatch(original)
    base.scaled_dot_product_attention = dispatch
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("mlx_lm.models.")
            and getattr(module, "scaled_dot_product_attention", None) is original
        ):
            module.scaled_dot_product_attention = dispatch
