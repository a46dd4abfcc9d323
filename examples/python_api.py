"""The Python API: load a model, build TurboQuant caches, generate, save and reload the cache.

    python examples/python_api.py [--model DIR] [--kv-scheme turbo4]

Without --model it uses the demo model, SmolLM2-135M-Instruct, fetched once into
~/.cache/mlx-lm-turbo (as ``mlx-lm-turbo demo`` does).
"""

import argparse
import tempfile
from pathlib import Path

from mlx_lm import generate, load
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

import mlx_lm_turbo
from mlx_lm_turbo.tools.gguf import demo_model_path


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model")
    parser.add_argument("--kv-scheme", default="turbo4")
    parser.add_argument("--max-tokens", type=int, default=40)
    args = parser.parse_args()
    model_path = args.model or str(demo_model_path())
    model, tokenizer = load(model_path)

    cache = mlx_lm_turbo.make_prompt_cache(model, args.kv_scheme, model_path=model_path)
    messages = [{"role": "user", "content": "Name three planets of the solar system."}]
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    print(
        generate(
            model,
            tokenizer,
            prompt=prompt,
            prompt_cache=cache,
            max_tokens=args.max_tokens,
        )
    )
    print(
        f"\nKV cache: {sum(c.nbytes for c in cache):,} bytes after {cache[0].offset} tokens"
    )

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "cache.safetensors")
        save_prompt_cache(path, cache)
        print(f"saved {Path(path).stat().st_size:,} bytes")
        reloaded = load_prompt_cache(path)
        follow_up = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Which one is largest?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        print(
            generate(
                model,
                tokenizer,
                prompt=follow_up,
                prompt_cache=reloaded,
                max_tokens=args.max_tokens,
            )
        )


if __name__ == "__main__":
    main()
