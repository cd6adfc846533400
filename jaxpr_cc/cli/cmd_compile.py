"""``jaxpr-cc compile``: compile a program with XLA and save the executable.

    jaxpr-cc compile model.py:loss --args 'f32[3], f32[]' -o loss.jxe
    jaxpr-cc compile saved.jcc -o saved.jxe --pipeline '' --show hlo
    jaxpr-cc compile saved.jcc -o - > saved.jxe

The file holds the program as ``jax.export`` serialized it plus its parameters;
``jaxpr-cc exec`` and ``jaxpr_cc.backends.xla.load_executable`` read it back.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from .errors import CliError

SHOW_CHOICES = ("stablehlo", "hlo", "cost", "memory")


def register(sub) -> None:
    p = sub.add_parser(
        "compile", help="compile a program with XLA and save the executable",
        description="Run a pass pipeline on a program, compile it with XLA and write the "
                    "executable. PROGRAM is a saved program, or MODULE_OR_FILE:FUNCTION with "
                    "--args.")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("--args", dest="args_spec", metavar="SPEC",
                   help="example arguments as shapes and dtypes, e.g. 'f32[3], f32[]'")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write the executable ('-' for stdout)")
    p.add_argument("-p", "--pipeline", default=None, metavar="PIPELINE",
                   help="passes to run before compiling (default: the jit pipeline, "
                        "'closure-convert,hoist-consts,cse,dce'; '' runs none)")
    p.add_argument("--show", choices=SHOW_CHOICES, action="append", default=[],
                   help="also print the StableHLO, the optimized HLO, XLA's cost or memory "
                        "analysis (repeatable)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..backends import xla
    from ..jit_function import default_pipeline
    from .loading import load_program_arg
    from .output import STDOUT, check_writable, write_output, write_stdout

    if args.output == STDOUT and args.show:
        raise CliError("--show prints to stdout, which -o - already takes for the executable; "
                       "give -o a file name or drop --show")
    check_writable(args.output, [(args.program, "the input program")])
    program = load_program_arg(args.program, args.args_spec)
    pipeline = default_pipeline() if args.pipeline is None else args.pipeline
    if pipeline:
        program = _run_pipeline(program, pipeline)
    try:
        exe = xla.compile(program)
    except Exception as e:  # XLA and lowering errors: one line here, --debug has the rest
        raise CliError(f"{args.program}: compiling failed: {type(e).__name__}: {e}") from e
    for kind in args.show:
        write_stdout(_shown(exe, kind).rstrip("\n") + "\n")
    data = _serialized(exe)
    write_output(args.output, data)
    print(f"wrote {'stdout' if args.output == STDOUT else args.output}: {exe.name}, "
          f"{len(exe.arg_avals)} argument leaves, {len(exe.params)} params, "
          f"{exe.out_tree.num_leaves} outputs, {len(exe.devices)} device(s), {len(data)} bytes",
          file=sys.stderr)
    return 0


def _serialized(exe) -> bytes:
    """The executable's file, as bytes (written into a private directory first: the
    backend saves to a path; ``write_output`` then applies the rules of ``-o``)."""
    with tempfile.TemporaryDirectory(prefix="jaxpr-cc-compile-") as tmp:
        path = os.path.join(tmp, "executable")
        try:
            exe.save(path)
        except ValueError as e:  # the backend's SaveError: what cannot be serialized
            raise CliError(" ".join(str(e).split())) from e
        with open(path, "rb") as f:
            return f.read()


def _run_pipeline(program, pipeline: str):
    from ..passes.base import PassOptionError
    from ..passes.manager import PassError, run_passes
    from ..passes.pipeline import PipelineError
    try:
        return run_passes(program, pipeline)
    except PipelineError as e:
        raise CliError(f"-p: {e.one_line()}") from e
    except PassOptionError as e:
        raise CliError(str(e)) from e
    except PassError as e:
        raise CliError(str(e), code=1) from e


def _shown(exe, kind: str) -> str:
    if kind in ("stablehlo", "hlo"):
        return exe.as_text(kind)
    analysis = exe.cost_analysis() if kind == "cost" else exe.memory_analysis()
    if kind == "memory" and analysis is not None and not isinstance(analysis, dict):
        # XLA returns an object with *_in_bytes attributes.
        analysis = {name: getattr(analysis, name) for name in sorted(dir(analysis))
                    if name.endswith("_in_bytes")}
    return json.dumps(analysis, indent=1, sort_keys=True, default=str)
