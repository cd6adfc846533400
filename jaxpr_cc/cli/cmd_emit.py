"""``jaxpr-cc emit``: a program in another form.

    jaxpr-cc emit loss.jcc --to jaxpr -o -          # JAX's own jaxpr text
    jaxpr-cc emit loss.jcc --to python -o loss.py   # Python source (large constants in loss.npz)
    jaxpr-cc emit loss.jcc --to stablehlo -o loss.mlir
    jaxpr-cc emit loss.jcc --to hlo -o loss.hlo     # the HLO module handed to XLA

The StableHLO/HLO module takes the program's bound parameters (``program.params``)
first, then the flattened arguments, as ``program.to_jaxpr()`` does.
"""
from __future__ import annotations

import re

from .errors import CliError

FORMS = ("jaxpr", "python", "stablehlo", "hlo")


def register(sub) -> None:
    p = sub.add_parser("emit", help="emit a program as jaxpr text, Python, StableHLO or HLO",
                       description="Emit PROGRAM in another form. PROGRAM is a saved program "
                                   "('-' reads one from stdin), or MODULE_OR_FILE:FUNCTION with "
                                   "--args or --args-from.")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("--to", required=True, choices=FORMS, help="the form to emit")
    p.add_argument("-o", "--output", default="-", metavar="OUT",
                   help="output file ('-', the default, is stdout)")
    p.add_argument("--args", dest="args_spec", metavar="SPEC",
                   help="example arguments as shapes and dtypes, e.g. 'f32[3], f32[]'")
    p.add_argument("--args-from", metavar="FILE.npz",
                   help="example arguments as arrays named arg0, arg1, ... in an .npz file")
    p.add_argument("--forward-mode", dest="forward_mode", action="store_true",
                   help="--to python: emit custom_vjp rules with the forward mode a Program "
                        "has through them (emit_python(forward_mode=True)); the module then "
                        "differentiates only in a process that has imported jaxpr_cc")
    p.set_defaults(run=run)


def run(args) -> int:
    from .loading import load_program_arg
    from .output import check_writable, write_output
    if args.to != "python" and args.forward_mode:
        raise CliError(f"--forward-mode applies to --to python only, not --to {args.to}: "
                       f"drop it")
    check_writable(args.output, [(args.program, "the input program"),
                                 (args.args_from, "the --args-from file")])
    program = load_program_arg(args.program, args.args_spec, args.args_from)
    if args.to == "python" and args.output.endswith(".py"):
        # A module file may keep large constants in a sidecar .npz next to it.
        write_python_file(program, args.output, args.program, forward_mode=args.forward_mode)
        return 0
    text = emit(program, args.to, args.program, forward_mode=args.forward_mode)
    write_output(args.output, text if text.endswith("\n") else text + "\n")
    return 0


def _python_backend(where: str):
    try:
        from ..backends import python_source
    except ImportError as e:
        raise CliError(f"{where}: emitting Python source is not available in this build "
                       f"({e})") from None
    return python_source


def write_python_file(program, path: str, where: str, forward_mode: bool = False) -> None:
    from ..storage.errors import SaveError
    from .output import refuse_imported_files, write_errors
    refuse_imported_files(path)
    backend = _python_backend(where)
    with write_errors(path):
        try:
            backend.write_python(program, path, forward_mode=forward_mode)
        except SaveError:
            raise  # the file writer's (a directory, a missing directory)
        except ValueError as e:  # PythonEmitError is a ValueError
            raise CliError(f"{where}: cannot emit Python: {' '.join(str(e).split())}") from None


def emit(program, form: str, where: str, forward_mode: bool = False) -> str:
    if form == "jaxpr":
        return str(program.to_jaxpr())
    if form == "python":
        try:
            return _python_backend(where).emit_python(program, forward_mode=forward_mode)
        except ValueError as e:  # the Python backend's errors (PythonEmitError) are ValueErrors
            raise CliError(f"{where}: cannot emit Python: {' '.join(str(e).split())}") from None
    return lower(program, where, dialect=form)


def lower(program, where: str, dialect: str) -> str:
    """The program lowered by ``jax.jit`` at its input types, as StableHLO or HLO text."""
    import jax
    from ..jax_adapter import jaxpr_as_fun
    from .progress import progress
    closed = program.to_jaxpr()
    run_jaxpr = jaxpr_as_fun(closed)

    def flat_program(*flat):
        return run_jaxpr(*flat)
    flat_program.__name__ = flat_program.__qualname__ = re.sub(r"\W", "_", program.name) or "program"
    specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
             for v in program.body.invars]
    try:
        with progress(f"lowering {program.name}"):
            lowered = jax.jit(flat_program).lower(*specs)
            return lowered.as_text(dialect=dialect)
    except Exception as e:  # lowering a valid program can still fail (e.g. missing devices)
        raise CliError(f"{where}: lowering to {dialect} failed: {type(e).__name__}: "
                       f"{' '.join(str(e).split())[:300]}") from None
