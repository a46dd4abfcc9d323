"""What the current mlx-lm command asked of the plugin (process-wide).

mlx-lm passes no extra keyword arguments through ``generate()`` and friends, so
the parsed ``--kv-scheme`` options travel here rather than through calls.
"""

from dataclasses import dataclass
from typing import Optional

# First and last attention layers kept at 8 bits unless told otherwise.
DEFAULT_BOUNDARY_SKIP = 2
# Keys each query reads exactly besides the sink tokens: itself and the
# DEFAULT_RECENT_EXACT - 1 tokens before it (the caches keep exact copies of those).
DEFAULT_RECENT_EXACT = 1


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
