"""Host microseconds to build one decode layer of the default turbo4 cache (W 16) with the
kernels stubbed, timed as ``decode_layer_checks_cpu.py`` times it, then with parts of it
taken away one after another: the stand-in kernel call (its outputs made once), the slice
of the stored rows, the ``MLX_LM_TURBO_KERNEL`` read, the kernel-mode and call-support
checks. What is left is the Python of the cache update, the routing and the launch's
inputs.

    python benchmarks/results/decode_layer_ablation_cpu.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# its import stubs the kernels; the layer is timed as it times it
from decode_layer_checks_cpu import layer_build_us, layer_inputs  # noqa: E402

import mlx_lm_turbo.cache.cache as cache_module  # noqa: E402
import mlx_lm_turbo.kernels.decode_attention as decode_attention  # noqa: E402
import mlx_lm_turbo.kernels.dispatch as dispatch  # noqa: E402


def kernel_outputs_made_once():
    build = decode_attention._Plan.__init__

    def init(plan, *args, **kwargs):
        build(plan, *args, **kwargs)
        stand_in, made = plan.kernel, []

        def call(**arguments):
            if not made:
                made.append(stand_in(**arguments))
            return made[0]

        plan.kernel = call

    decode_attention._Plan.__init__ = init


def main():
    history, query = layer_inputs()
    steps = [
        ("as it is", lambda: None),
        ("the stand-in kernel call taken away", kernel_outputs_made_once),
        (
            "and the slice of the rows",
            lambda: setattr(cache_module._TurboCache, "_slice", lambda c: c.stored),
        ),
        (
            "and the environment read",
            lambda: setattr(dispatch, "kernel_mode", lambda: "auto"),
        ),
        (
            "and use_kernel, call_support",
            lambda: (
                setattr(decode_attention, "use_kernel", lambda codec: True),
                setattr(decode_attention, "call_support", lambda *args: None),
            ),
        ),
    ]
    for label, take_away in steps:
        take_away()
        print(f"{label}: {layer_build_us(history, query):.1f} us a layer")


if __name__ == "__main__":
    main()
