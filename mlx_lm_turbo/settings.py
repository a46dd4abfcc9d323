"""What the current mlx-lm command asked of the plugin (process-wide).

mlx-lm passes no extra keyword arguments through ``generate()`` and friends, so
the parsed ``--kv-scheme`` options travel here rather than through calls.
"""

from dataclasses import dataclass
from typing import Optional

# The defaults users get (benchmarks/results/default_window_h200_ada1b0a.md): on both
# real models at 4K and 16K, 15 exact recent tokens and no boundary layers gave turbo4
# 1.8-7x lower KL at 0.5-1.2 fewer bits all in than 8-bit boundary layers without the
# window; boundary layers add nothing once the window is there.
# First and last attention layers kept at 8 bits unless told otherwise.
DEFAULT_BOUNDARY_SKIP = 0
# Keys each query reads exactly besides the sink tokens: itself and the
# DEFAULT_RECENT_EXACT - 1 tokens before it (the caches keep exact copies of those).
# Such caches cannot be trimmed, so commands that decode speculatively (--draft-model)
# read only the query itself exactly unless told otherwise.
DEFAULT_RECENT_EXACT = 16
SPECULATIVE_RECENT_EXACT = 1


@dataclass(frozen=True)
class Settings:
    scheme: "KVScheme"  # noqa: F821 (mlx_lm_turbo.codec.schemes, not imported at start-up)
    boundary_skip: int = DEFAULT_BOUNDARY_SKIP
    uncompressed_start: int = 0
    recent_exact: int = DEFAULT_RECENT_EXACT
    model_path: Optional[str] = None


active: Optional[Settings] = None
# Whether the current command decodes speculatively (--draft-model), so trims its caches:
# a loaded prompt cache that cannot be trimmed is then refused (attach/files.py).
speculative: bool = False
