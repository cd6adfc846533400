"""``jaxpr-cc`` command line: argparse front end, exit codes and error reporting.

Each subcommand lives in its own module exposing ``register(subparsers)``; the
parser calls the ``run(args)`` function it registered.  Exit codes: 0 success,
1 a check failed, 2 usage error or bad input.  Errors print one line; ``--debug``
shows the traceback.
"""
from __future__ import annotations

import argparse
import sys
import traceback

from .errors import CliError

SUBCOMMANDS = ("demo", "trace", "show", "opt", "emit", "exec", "compile", "golden")


def build_parser() -> argparse.ArgumentParser:
    import importlib
    parser = argparse.ArgumentParser(
        prog="jaxpr-cc",
        description="A jaxpr-level source-transformation compiler for JAX.")
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"jaxpr_cc.cli.cmd_{name}").register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.run(args)
        return int(code or 0)
    except CliError as e:
        if args.debug:
            traceback.print_exc()
        print(f"jaxpr-cc {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("jaxpr-cc: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # not anticipated by the subcommand: still one line
        if args.debug:
            traceback.print_exc()
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"jaxpr-cc {args.command}: error: {type(e).__name__}: {msg[:500]} "
              f"(run with --debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
