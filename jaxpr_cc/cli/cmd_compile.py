"""``jaxpr-cc compile``: compile a program with XLA and save the executable.

    jaxpr-cc compile model.py:loss --args 'f32[3], f32[]' -o loss.jxe
    jaxpr-cc compile saved.jcc -o saved.jxe --pipeline '' --show hlo

The file holds the program as ``jax.export`` serialized it plus its parameters;
``jaxpr-cc exec`` and ``jaxpr_cc.backends.xla.load_executable`` read it back.
"""
from __future__ import annotations

import json
import os
import sys

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
                   help="where to write the executable")
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

    if os.path.isdir(args.output):
        raise CliError(f"{args.output}: is a directory; -o takes a file name")
    program = load_program_arg(args.program, args.args_spec)
    pipeline = default_pipeline() if args.pipeline is None else args.pipeline
    if pipeline:
        program = _run_pipeline(program, pipeline)
    try:
        exe = xla.compile(program)
    except Exception as e:  # XLA and lowering errors: one line here, --debug has the rest
        raise CliError(f"{args.program}: compiling failed: {type(e).__name__}: {e}") from e
    for kind in args.show:
        sys.stdout.write(_shown(exe, kind).rstrip("\n") + "\n")
    try:
        exe.save(args.output)
    except ValueError as e:
        raise CliError(str(e)) from e
    except OSError as e:
        raise CliError(f"{args.output}: cannot write: {e}") from e
    print(f"wrote {args.output}: {exe.name}, {len(exe.arg_avals)} argument leaves, "
          f"{len(exe.params)} params, {exe.out_tree.num_leaves} outputs, "
          f"{len(exe.devices)} device(s), {os.path.getsize(args.output)} bytes",
          file=sys.stderr)
    return 0


def _run_pipeline(program, pipeline: str):
    from ..passes.manager import PassError, run_passes
    from ..passes.pipeline import PipelineError
    try:
        return run_passes(program, pipeline)
    except PipelineError as e:
        raise CliError(f"-p: {e.one_line()}") from e
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
