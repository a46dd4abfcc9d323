"""mlx_lm.server with and without --kv-scheme under the same concurrent load.

For each scheme it starts the real server on 127.0.0.1, sends ``--clients``
concurrent streams of chat requests (shared prefixes, mixed lengths), and
reports total generated tokens per second over all clients, the server's peak
resident memory (VmHWM; MLX's memory is host memory on CPU, not on a GPU), and
how many cached prompt tokens fit in ``--prompt-cache-bytes`` at that scheme's
measured bytes per token.

    python benchmarks/server_load.py [--model DIR] [--schemes none turbo4] [--clients 16]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run_load(model, scheme, clients, requests_per_client, max_tokens):
    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlx_lm.server"),
            "--model",
            model,
            "--port",
            str(port),
            "--kv-scheme",
            scheme,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        shared = (
            "You are reading a long novel about a family in the English countryside. "
        )
        tokens, errors = [0], []

        def client(c):
            for r in range(requests_per_client):
                question = f"Question {c}-{r}: " + "tell me more " * ((c + r) % 6)
                body = json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": shared * (1 + c % 3) + question}
                        ],
                        "max_tokens": max_tokens,
                        "temperature": 0.0,
                    }
                ).encode()
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=600) as response:
                        tokens[0] += json.loads(response.read())["usage"][
                            "completion_tokens"
                        ]
                except Exception as error:
                    errors.append(repr(error))

        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
            time.sleep(0.05)  # the stdlib HTTP server listens with a backlog of 5
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
        return {
            "scheme": scheme,
            "tokens": tokens[0],
            "seconds": seconds,
            "tokens_per_second": tokens[0] / seconds,
            "peak_rss": peak_rss(server.pid),
            "errors": len(errors),
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


def cache_bytes_per_token(model_path, scheme, tokens=512):
    import mlx.core as mx
    from mlx_lm import load

    from mlx_lm_turbo import make_prompt_cache

    model, _ = load(model_path)
    cache = make_prompt_cache(model, scheme)
    model(mx.arange(tokens)[None] % 1000, cache=cache)
    mx.eval([c.state for c in cache])
    return sum(c.nbytes for c in cache) / tokens


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", help="mlx-lm model directory (default: the demo model)"
    )
    parser.add_argument("--schemes", nargs="+", default=["none", "turbo4"])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prompt-cache-bytes", type=int, default=1 << 30)
    args = parser.parse_args()
    if args.model is None:
        from mlx_lm_turbo.tools.gguf import demo_model_path

        args.model = str(demo_model_path())
    os.environ.pop("MLX_LM_TURBO_KV_SCHEME", None)
    rows = [
        run_load(args.model, s, args.clients, args.requests, args.max_tokens)
        for s in args.schemes
    ]
    base = rows[0]
    print(
        f"{args.clients} concurrent clients x {args.requests} requests, {args.max_tokens} tokens each, "
        f"model {args.model}\n"
    )
    print(
        f"| --kv-scheme | tokens/s (all clients) | vs {base['scheme']} | server peak RSS (MiB) | errors | "
        f"KV bytes/token | prompt tokens in {args.prompt_cache_bytes / 2**30:.0f} GiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        per_token = cache_bytes_per_token(args.model, r["scheme"])
        print(
            f"| {r['scheme']} | {r['tokens_per_second']:.1f} | {r['tokens_per_second'] / base['tokens_per_second']:.2f}x | "
            f"{r['peak_rss'] / 2**20:.0f} | {r['errors']} | {per_token:.0f} | {args.prompt_cache_bytes / per_token:,.0f} |"
        )


if __name__ == "__main__":
    main()
