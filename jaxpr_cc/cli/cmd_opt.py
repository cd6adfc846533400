"""``jaxpr-cc opt``: run a pass pipeline on a program.

    jaxpr-cc opt model.py:loss --args 'f32[3], f32[]' -p 'hoist-consts,cse,dce' -o out.jcc
    jaxpr-cc opt saved.jcc -p dce --print-ir-after=dce --statistics

The result is saved with ``-o FILE`` (``-o -``: to stdout) or its IR printed to stdout;
instrumentation (IR dumps, timing and statistics tables) goes to stderr.  Exit
codes: 0 success, 1 a pass failed (the message names the reproducer), 2 bad
input or usage.
"""
from __future__ import annotations

import argparse
import sys

from .errors import CliError


def register(sub) -> None:
    p = sub.add_parser(
        "opt", help="run a pass pipeline on a program",
        description="Run a pipeline of passes (e.g. 'closure-convert,hoist-consts,cse,dce') on a "
                    "program. PROGRAM is a saved program, or MODULE_OR_FILE:FUNCTION with --args.")
    p.add_argument("program", metavar="PROGRAM", nargs="?")
    p.add_argument("--args", dest="args_spec", metavar="SPEC",
                   help="example arguments as shapes and dtypes, e.g. 'f32[3], f32[]'")
    p.add_argument("-p", "--pipeline", default=None, metavar="PIPELINE",
                   help="comma-separated passes with options in braces, e.g. "
                        "'hoist-consts{min-bytes=1024},cse,dce'")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="save the result here ('-' for stdout; default: print its IR)")
    p.add_argument("--print-ir-before", default="", metavar="PASSES",
                   help="print the IR before these passes (comma-separated names)")
    p.add_argument("--print-ir-after", default="", metavar="PASSES",
                   help="print the IR after these passes (comma-separated names)")
    p.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass")
    p.add_argument("--print-ir-after-change", action="store_true",
                   help="print the IR after every pass that changed it")
    p.add_argument("--timing", action="store_true", help="print a table of wall time per pass")
    p.add_argument("--statistics", action="store_true", help="print what each pass did")
    p.add_argument("--verify-each", action=argparse.BooleanOptionalAction, default=False,
                   help="verify the input and the program after every pass in full, JAX's type "
                        "checker included (default: off; the result is always checked "
                        "structurally)")
    p.add_argument("--reproducer-dir", metavar="DIR",
                   help="where to write crash reproducers (default: a jaxpr-cc-reproducers "
                        "directory in the system temp directory)")
    p.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    p.set_defaults(run=run)


def list_passes() -> str:
    import dataclasses

    from ..passes import available_passes
    from ..passes.pipeline import _type_hints
    lines = []
    for name, cls in available_passes().items():
        lines.append(f"{name}: {cls.summary}".rstrip(": "))
        hints = _type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            typ = getattr(hints.get(f.name), "__name__", str(hints.get(f.name)))
            shown = str(default).lower() if isinstance(default, bool) else default
            lines.append(f"    {f.name.replace('_', '-')}={shown}  ({typ})")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from ..io import SaveError, dumps
    from ..ir.verifier import VerificationError
    from ..passes.base import PassOptionError
    from ..passes.manager import PassError, PassManager
    from ..passes.pipeline import PipelineError
    from .loading import load_program_arg
    from .output import check_writable, write_output, write_stdout

    if args.list_passes:
        given = [flag for flag, value in (("PROGRAM", args.program), ("-p", args.pipeline),
                                          ("-o", args.output)) if value is not None]
        if given:
            raise CliError(f"opt: --list-passes only lists the passes; it takes no "
                           f"{', '.join(given)} (run opt without --list-passes)")
        write_stdout(list_passes())
        return 0
    if args.program is None:
        raise CliError("opt: give a PROGRAM (a saved program or MODULE_OR_FILE:FUNCTION)")
    if args.pipeline is None:
        raise CliError("opt: give a pipeline with -p, e.g. -p 'hoist-consts,cse,dce' "
                       "(--list-passes shows the passes)")
    try:
        manager = PassManager(
            args.pipeline, verify_each=args.verify_each,
            print_ir_before=args.print_ir_before, print_ir_after=args.print_ir_after,
            print_ir_after_all=args.print_ir_after_all,
            print_ir_after_change=args.print_ir_after_change, timing=args.timing,
            statistics=args.statistics, stream=sys.stderr, reproducer_dir=args.reproducer_dir)
    except PipelineError as e:
        raise CliError(f"-p: {e.one_line()}") from e
    except ValueError as e:
        raise CliError(f"--{str(e).replace('_', '-')}") from e
    if args.output:
        check_writable(args.output, [(args.program, "the input program")])
    program = load_program_arg(args.program, args.args_spec)
    try:
        # Keep the loaded program untouched (one copy), so that a crash reproducer
        # can replay the passes before the failing one exactly.
        result = manager.run(program)
    except PassOptionError as e:
        raise CliError(str(e)) from e
    except PassError as e:
        raise CliError(str(e), code=1) from e
    except VerificationError as e:
        raise CliError(f"{args.program}: {e}") from e
    if args.output:
        try:
            data = dumps(result)
        except SaveError as e:
            raise CliError(f"{args.output}: cannot save the result: {e}") from e
        write_output(args.output, data)
    else:
        write_stdout(str(result))
    return 0
