"""``jaxpr-cc trace``: trace a Python function into a saved program.

    jaxpr-cc trace model.py:loss --args 'f32[3,4], f32[4]' -o loss.jcc
    jaxpr-cc trace model.py:loss --args-from inputs.npz -o loss.jcc
    jaxpr-cc trace mypkg.models:loss -o loss.jcc        # the module gives example_args()
"""
from __future__ import annotations

from .errors import CliError


def register(sub) -> None:
    p = sub.add_parser(
        "trace", help="trace a Python function into a saved program",
        description="Trace FUNCTION (from a .py file or an importable module) on example "
                    "arguments and save the program. Example arguments come from --args "
                    "(shapes and dtypes), --args-from (concrete arrays arg0, arg1, ... in an "
                    ".npz file) or, when neither is given, the module's example_args() "
                    "(and example_kwargs()) or EXAMPLE_ARGS.")
    p.add_argument("target", metavar="MODULE_OR_FILE:FUNCTION")
    p.add_argument("--args", dest="args_spec", metavar="SPEC",
                   help="example arguments as shapes and dtypes, e.g. 'f32[3], i32[2,2], f32[]'")
    p.add_argument("--args-from", metavar="FILE.npz",
                   help="example arguments as arrays named arg0, arg1, ... in an .npz file")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="where to save the program ('-' for stdout)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..io import SaveError, dumps
    from .loading import trace_target
    from .output import check_writable, write_output
    if ":" not in args.target:
        raise CliError(f"{args.target!r}: expected MODULE_OR_FILE:FUNCTION, e.g. model.py:loss")
    check_writable(args.output, [(args.target, "the traced module"),
                                 (args.args_from, "the --args-from file")])
    program = trace_target(args.target, args.args_spec, args.args_from)
    try:
        data = dumps(program)
    except SaveError as e:
        raise CliError(f"{args.target}: {e}") from None
    write_output(args.output, data)
    return 0
