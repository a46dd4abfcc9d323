# The bytes SmolLM2's turbo4v2 cache holds besides its packed rows (sink and recent tokens,
# key statistics, query energies), with the model in float32 (as on CPU) and in float16
# (as a GPU run holds it). The rows cost the scheme's bits per value at any length, so
# these give the all-in bits after the 4K bench's 4096 + 64 tokens; the float32 figure
# checks against the bench's own (3.527).
import mlx.core as mx
from mlx_lm.utils import load

from mlx_lm_turbo.tools.bench import CacheKind, book_tokens

model, tokenizer = load("/root/.cache/mlx-lm-turbo/SmolLM2-135M-Instruct")
tokens = book_tokens(tokenizer, 100)
values = (4096 + 64) * 11520  # K and V values per token: 30 layers x 3 heads x 2 x 64
for dtype in (mx.float32, mx.float16):
    model.set_dtype(dtype)
    kind = CacheKind("turbo4v2", 0)
    cache = kind.make(model)
    model(mx.array([tokens[:96]]), cache=cache)
    for t in tokens[96:100]:
        model(mx.array([[t]]), cache=cache)
    mx.eval([c.state for c in cache])
    rows = sum(a.nbytes for c in cache for a in c._stored_slice())
    held = sum(a.nbytes for c in cache for a in c.state if isinstance(a, mx.array))
    all_in = kind.bits_per_value(cache, 16) + 8 * (held - rows) / values
    print(f"{dtype}: {held - rows} bytes besides the rows, all in {all_in:.3f}")
