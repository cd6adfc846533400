"""``jaxpr-cc golden``: golden-file regression tests over a directory of programs.

    jaxpr-cc golden check                      # every program in golden/programs
    jaxpr-cc golden check golden/programs/27_custom_vjp_two_sites.py -k vjp
    jaxpr-cc golden update                     # rewrite what changed, report the files

``check`` prints a unified diff for every view that differs from its golden file,
the programs with no golden, stale golden files, and failed ``# RUN:`` FileCheck
lines; it exits 1 when anything differs.  ``update`` writes only the files whose
content changed (numerics within tolerance count as unchanged), removes stale ones
and lists them.  ``--load FILE.py`` imports a file first (e.g. one registering
passes named in ``--pipeline`` or in ``# RUN:`` lines).  See docs/golden.md.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys

from .errors import CliError

# Goldens are recorded on a CPU host platform with this many devices (the corpus
# has multi-device programs); set before JAX starts its backend.
HOST_DEVICES = 8


def register(sub) -> None:
    p = sub.add_parser("golden", help="check or update golden files of programs",
                       description="Golden-file regression tests: each program's printed IR after "
                                   "tracing and after every pass, emitted jaxpr, Python source "
                                   "and numerics, compared with golden/expected/<program>/.")
    actions = p.add_subparsers(dest="golden_action", metavar="ACTION")
    actions.required = True
    for action, text in (("check", "compare programs with their golden files (exit 1 on any "
                                   "difference)"),
                         ("update", "rewrite the golden files whose content changed")):
        a = actions.add_parser(action, help=text, description=text)
        a.add_argument("paths", nargs="*", metavar="PATH",
                       help="program files or directories of programs (default: "
                            "$JAXPR_CC_CORPUS or golden/programs)")
        a.add_argument("-k", dest="keywords", action="append", default=[], metavar="FILTER",
                       help="only programs whose name contains FILTER (case-insensitive; "
                            "repeat for several)")
        a.add_argument("-p", "--pipeline", default=None, metavar="PIPELINE",
                       help="the pipeline whose passes the goldens record (default: "
                            "jaxpr_cc.jit.DEFAULT_PIPELINE)")
        a.add_argument("--expected", default=None, metavar="DIR",
                       help="directory of the golden files (default: 'expected' next to each "
                            "programs directory)")
        a.add_argument("--load", action="append", default=[], metavar="FILE_OR_MODULE",
                       help="import a Python file or module first, e.g. one that registers "
                            "passes (repeatable)")
        a.add_argument("--max-diff-lines", type=int, default=200, metavar="N",
                       help="show at most N lines of each diff (0: all; default 200)")
        a.set_defaults(run=run)


def _ensure_host_devices() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count="
                                   f"{HOST_DEVICES}").strip()


def load_extra(target: str) -> None:
    """Import ``target``: a ``.py`` file (by path) or a module name."""
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise CliError(f"--load {target}: no such file")
        name = "jaxpr_cc_golden_load_" + re.sub(r"\W", "_", os.path.basename(target)[:-3])
        spec = importlib.util.spec_from_file_location(name, target)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise CliError(f"--load {target}: importing failed: {type(e).__name__}: {e}") from e
        return
    try:
        importlib.import_module(target)
    except Exception as e:
        raise CliError(f"--load {target}: cannot import: {type(e).__name__}: {e}") from e


def run(args) -> int:
    _ensure_host_devices()
    from ..golden.runner import GoldenUsageError, run_golden
    from ..golden.store import GoldenFileError
    from .progress import progress
    if args.max_diff_lines < 0:
        raise CliError("--max-diff-lines must be 0 (all) or a positive number")
    for target in args.load:
        load_extra(target)
    update = args.golden_action == "update"
    try:
        with progress(f"golden {args.golden_action}"):
            report = run_golden(args.paths, keywords=args.keywords, pipeline=args.pipeline,
                                update=update, expected_root=args.expected)
    except (GoldenUsageError, GoldenFileError) as e:
        raise CliError(str(e)) from e
    sys.stdout.write(report.render(args.max_diff_lines))
    sys.stdout.flush()
    return report.exit_code
