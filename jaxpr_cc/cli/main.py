"""``jaxpr-cc`` command line: argparse front end, exit codes and error reporting.

Each subcommand lives in its own module exposing ``register(subparsers)``; the
parser calls the ``run(args)`` function it registered.  Exit codes: 0 success,
1 a check failed, 2 usage error or bad input (a result for a stdout closed from
the start, ``>&-``, too), 141 stdout's reader went away (as a shell reports for
``cat`` killed by SIGPIPE; nothing is printed).  Errors print one
line (argparse's usage errors too); ``--debug``, before or after the subcommand,
shows the traceback.  Stdout carries results only (see :mod:`jaxpr_cc.cli.output`).
"""
from __future__ import annotations

import argparse
import sys
import traceback

from .errors import CliError

SUBCOMMANDS = ("demo", "trace", "show", "opt", "emit", "exec", "compile", "golden")
# The subcommands that may run the user's code: while they run, stdout is reserved
# for their results (what else is printed goes to stderr).
RUN_USER_CODE = ("trace", "show", "opt", "emit", "exec", "compile")


DEBUG_HELP = "show Python tracebacks for errors"


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2), like every other CLI error;
    subcommand parsers are of this class too (``add_subparsers`` copies it)."""

    def _print_message(self, message, file=None):
        # --help and --version with stdout closed (`>&-`): argparse would print
        # nothing and exit 0; say it instead, as for every other result.
        if message and file is None and sys.stdout is None:
            from .output import STDOUT_CLOSED_MESSAGE
            self.exit(2, f"{self.prog}: error: {STDOUT_CLOSED_MESSAGE}\n")
        super()._print_message(message, file)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} "
                     f"(see {self.prog} --help)\n")


def version_text() -> str:
    from importlib import metadata

    from .. import __version__
    versions = []
    for package in ("jax", "jaxlib"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} not installed")
    return f"jaxpr-cc {__version__} ({', '.join(versions)})"


def build_parser() -> argparse.ArgumentParser:
    import importlib
    parser = Parser(
        prog="jaxpr-cc",
        description="A jaxpr-level source-transformation compiler for JAX.")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print the versions of jaxpr-cc, JAX and jaxlib, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"jaxpr_cc.cli.cmd_{name}").register(sub)
    _accept_debug_everywhere(sub)
    return parser


def _accept_debug_everywhere(subparsers) -> None:
    """``--debug`` after the subcommand (``jaxpr-cc show --debug x.jcc``) too.  The
    default is SUPPRESS so that a subcommand without it keeps the top-level value."""
    for parser in subparsers.choices.values():
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                            help=DEBUG_HELP)
        for action in parser._actions:  # nested subcommands (golden check/update)
            if isinstance(action, argparse._SubParsersAction):
                _accept_debug_everywhere(action)


def main(argv=None) -> int:
    from .output import STDOUT_CLOSED_CODE, STDOUT_CLOSED_MESSAGE, StdoutClosed, results_path, \
        silence_stdout, stdout_reserved_for_results
    parser = build_parser()
    args = parser.parse_args(argv)
    from .output import record_files_read
    record_files_read()
    try:
        if args.command in RUN_USER_CODE:
            if getattr(args, "output", None):  # -o /dev/stdout is -o - (see results_path)
                args.output = results_path(args.output)
            with stdout_reserved_for_results():
                code = args.run(args)
        else:
            if sys.stdout is None:  # closed from the start (`>&-`): its report is lost
                raise CliError(STDOUT_CLOSED_MESSAGE)
            code = args.run(args)
        return int(code or 0)
    except (StdoutClosed, BrokenPipeError):
        # (a BrokenPipeError from anything but stdout is reported by the writer)
        silence_stdout()
        return STDOUT_CLOSED_CODE
    except CliError as e:
        if args.debug:
            traceback.print_exc()
        print(f"jaxpr-cc {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("jaxpr-cc: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 -- user code may raise any BaseException;
        # not anticipated by the subcommand: still one line
        if args.debug:
            traceback.print_exc()
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"jaxpr-cc {args.command}: error: {type(e).__name__}: {msg[:500]} "
              f"(run with --debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
