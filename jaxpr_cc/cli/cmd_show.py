"""``jaxpr-cc show``: print a program's IR."""
from __future__ import annotations

import sys

from .errors import CliError


def register(sub) -> None:
    p = sub.add_parser("show", help="print the IR of a program",
                       description="Print a program's IR. PROGRAM is a saved program, or "
                                   "MODULE_OR_FILE:FUNCTION with --args.")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("--args", dest="args_spec", metavar="SPEC",
                   help="example arguments as shapes and dtypes, e.g. 'f32[3], f32[]'")
    p.set_defaults(run=run)


def run(args) -> int:
    from .loading import load_program_arg
    program = load_program_arg(args.program, args.args_spec)
    sys.stdout.write(str(program))
    return 0
