"""The ``mlx-lm-turbo`` command: ``mlx-lm-turbo {demo,bench,needles,questions,doctor}
[...]``."""

import os
import sys

COMMANDS = {
    "demo": (
        "mlx_lm_turbo.tools.demo",
        "generate with an fp16 cache and with TurboQuant caches, side by side",
    ),
    "bench": (
        "mlx_lm_turbo.tools.bench",
        "quality, memory and speed of KV caches on a real model",
    ),
    "needles": (
        "mlx_lm_turbo.tools.needles",
        "needle retrieval, paired against fp16 over many trials",
    ),
    "questions": (
        "mlx_lm_turbo.tools.questions",
        "short factual questions: do TurboQuant caches keep the answers?",
    ),
    "doctor": (
        "mlx_lm_turbo.tools.doctor",
        "is the plugin attached, which adapters exist, what a model would get",
    ),
}
USAGE = "\n".join(
    [
        f"usage: mlx-lm-turbo {{{','.join(COMMANDS)}}} [options]",
        "",
        "commands:",
        *(f"  {name:<11}{about}" for name, (_, about) in COMMANDS.items()),
        "",
        "mlx-lm-turbo COMMAND -h shows a command's options. TurboQuant itself runs inside mlx-lm's",
        "own commands: mlx_lm.generate --kv-scheme turbo4 (also chat, server, cache_prompt, ...).",
    ]
)


def _run(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        problem = f"unknown command {argv[0]!r}" if argv else "give a command"
        print(f"mlx-lm-turbo: error: {problem}", file=sys.stderr)
        return 2
    import importlib

    from ..errors import UsageError

    try:
        return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])
    except UsageError as error:
        print(f"mlx-lm-turbo {argv[0]}: error: {error}", file=sys.stderr)
        return 2


def main(argv=None):
    try:
        status = _run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # a reader gone away shows here, not in Python's final flush
        return status
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, as a shell's commands do
        print(file=sys.stderr)
        return 128 + 2  # as if killed by SIGINT
    except BrokenPipeError:
        # The reader went away (doctor | head): stop quietly like other Unix tools, and keep
        # Python's final flush of stdout from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as if killed by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
