"""Golden-file regression testing: pin what a pipeline does to programs.

* :mod:`.filecheck` -- FileCheck directives (``CHECK``, ``CHECK-NEXT``, ``CHECK-SAME``,
  ``CHECK-NOT``, ``CHECK-LABEL``, captures) matched against printed IR;
* :mod:`.program_checks` -- ``# RUN: <pipeline>`` lines in program files;
* :mod:`.views` -- what a golden records for a program (printed IR after tracing and
  after each pass, emitted jaxpr, Python source, numerics);
* :mod:`.numerics` -- exact text for values and gradients, compared with
  dtype-aware tolerances;
* :mod:`.store` -- golden files on disk, atomic writes, stale and missing files;
* :mod:`.corpus` -- the program corpus (``golden/programs/NN_name.py``) and its contract;
* :mod:`.runner` -- check / update over a directory of programs
  (``jaxpr-cc golden check|update``);
* :mod:`.pytest_plugin` -- the ``golden`` fixture and ``pytest --update-goldens``.

See docs/golden.md for the workflow.
"""
from .filecheck import FileCheckFailure, FileCheckSyntaxError, filecheck, parse_directives
from .runner import run_golden
from .views import compute_views

__all__ = ["FileCheckFailure", "FileCheckSyntaxError", "compute_views", "filecheck",
           "parse_directives", "run_golden"]
