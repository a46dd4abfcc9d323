"""The ``mlx-lm-turbo`` command: ``mlx-lm-turbo {demo,bench,doctor} [...]``."""

import sys

COMMANDS = {"demo": "mlx_lm_turbo.demo", "bench": "mlx_lm_turbo.bench", "doctor": "mlx_lm_turbo.doctor"}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: mlx-lm-turbo {{{','.join(COMMANDS)}}} [options]  (-h on a command for help)",
              file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
