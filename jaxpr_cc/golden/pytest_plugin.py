"""pytest plugin (entry point ``pytest11: jaxpr_cc_golden``): the ``golden`` fixture.

Any project that installs jaxpr-cc can pin what a pipeline does to its functions::

    def test_solver(golden):
        golden.check(solver, x0, pipeline="closure-convert,hoist-consts,cse,dce")

The first run fails (no golden yet); ``pytest --update-goldens`` writes the goldens
-- by default the printed IR after tracing and after each pass -- to
``goldens/<test module>/<test name>/`` next to the test file (the ``golden_dir`` ini
option moves them under one directory).  Later runs fail with a unified diff in
pytest's report whenever the output changes; ``--update-goldens`` accepts it and
the terminal summary lists the files written.

This module imports nothing heavy at load time: pytest loads it in every session.
"""
from __future__ import annotations

import pathlib
import re
from typing import Any, Sequence

import pytest

UPDATE_OPTION = "--update-goldens"
DEFAULT_VIEWS = ("trace", "passes")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_WRITTEN_KEY = "jaxpr_cc_golden_written"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("jaxpr-cc golden", "jaxpr-cc golden files")
    group.addoption(UPDATE_OPTION, action="store_true", default=False,
                    help="write golden files that are missing or differ (golden fixture and "
                         "jaxpr-cc's own golden suite) instead of failing")
    parser.addini("golden_dir", default="",
                  help="directory (relative to the rootdir) for the golden fixture's files; "
                       "default: a 'goldens' directory next to each test file")


def pytest_configure(config) -> None:
    setattr(config, _WRITTEN_KEY, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    written = getattr(config, _WRITTEN_KEY, [])
    if not written:
        return
    terminalreporter.section("jaxpr-cc goldens written")
    for status, path in written:
        terminalreporter.write_line(f"{status} {path}")


def record_written(config, entries) -> None:
    """Add ``(status, path)`` entries to the "goldens written" terminal summary."""
    getattr(config, _WRITTEN_KEY).extend(entries)


def _slug(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_.") or "test"


class GoldenFixture:
    """The ``golden`` fixture: see :meth:`check`."""

    def __init__(self, request):
        self._request = request
        self._names: set[str] = set()
        self.update = bool(request.config.getoption(UPDATE_OPTION))

    # ------------------------------------------------------------ locations
    @property
    def base_dir(self) -> pathlib.Path:
        """Where this test module's goldens live."""
        config = self._request.config
        module = pathlib.Path(str(self._request.node.path))
        configured = config.getini("golden_dir")
        root = (pathlib.Path(str(config.rootpath)) / configured if configured
                else module.parent / "goldens")
        return root / _slug(module.stem)

    def directory(self, name: str | None = None) -> pathlib.Path:
        """The golden directory of this test (``name`` tells several checks apart)."""
        node = self._request.node
        test = node.nodeid.split("::", 1)[-1].replace("::", ".")
        return self.base_dir / (_slug(test) + (f"--{_slug(name)}" if name else ""))

    # ------------------------------------------------------------------ check
    def check(self, target: Any, *args: Any, pipeline: str | None = None,
              name: str | None = None, views: Sequence[str] = DEFAULT_VIEWS,
              kwargs: dict | None = None, grad_argnums: Sequence[int] = (),
              checks: str | None = None):
        """Trace ``target(*args, **kwargs)`` (or take a traced Program), run
        ``pipeline`` (default: jaxpr-cc's default pipeline; ``""`` for none) and
        compare the chosen ``views`` with the golden files: ``"trace"`` (printed IR
        after tracing), ``"passes"`` (after each pass), ``"jaxpr"`` (the emitted
        jaxpr), ``"python"`` (emitted Python source), ``"numerics"`` (values, and
        gradients w.r.t. ``grad_argnums``).  ``checks`` are FileCheck directives
        (``CHECK: ...`` lines) matched against the final IR.  Returns the Program
        after the pipeline."""
        from .. import jit as _jit
        from ..passes.pipeline import as_pipeline
        from .filecheck import FileCheckFailure, FileCheckSyntaxError, filecheck
        from .store import sync_views, unified_diff
        from .views import compute_views, view_problems

        key = name or ""
        if key in self._names:
            raise ValueError(f"golden.check was already called in this test "
                             f"{'with name=' + repr(name) if name else 'without a name'}; give each "
                             f"check of one test its own name=")
        self._names.add(key)
        if pipeline is None:
            pipeline = _jit.DEFAULT_PIPELINE
        pipeline = str(as_pipeline(pipeline))
        result = compute_views(target, args, kwargs, pipeline=pipeline, kinds=tuple(views),
                               grad_argnums=tuple(grad_argnums))
        directory = self.directory(name)
        sync = sync_views(directory, result.views, update=self.update, problems=view_problems)
        root = pathlib.Path(str(self._request.config.rootpath))
        shown = [(v, _relative(v.path, root)) for v in sync.views]
        if self.update:
            record_written(self._request.config,
                           [(v.status, label) for v, label in shown if v in sync.written])
        failures = []
        if not self.update and not sync.ok:
            if not directory.is_dir():
                failures.append(f"no golden files in {_relative(directory, root)}; run pytest "
                                f"{UPDATE_OPTION} to create them")
            else:
                for v, label in shown:
                    if v.status == "same":
                        continue
                    what = {"changed": "output differs from the golden file",
                            "missing": "no golden file for this output",
                            "stale": "golden file of an output no longer produced"}[v.status]
                    failures.append(f"{label}: {what}")
                    failures.append(unified_diff(v.expected, v.actual, label).rstrip("\n"))
                    failures.extend(f"  beyond tolerance: {p}" for p in v.problems
                                    if v.name.endswith("numerics.txt"))
                failures.append(f"(run pytest {UPDATE_OPTION} to accept the new output)")
        if checks is not None:
            final = result.final
            if final is None:
                failures.append("FileCheck: the pipeline did not produce a program")
            else:
                try:
                    filecheck(checks, str(final), path="checks", input_name="final IR")
                except (FileCheckFailure, FileCheckSyntaxError) as e:
                    failures.append(str(e))
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)
        return result.final


def _relative(path: pathlib.Path, root: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


@pytest.fixture
def golden(request) -> GoldenFixture:
    """Golden-file checks of jaxpr-cc pipelines; ``golden.check(fn, *args, pipeline=...)``.
    Run ``pytest --update-goldens`` to write or accept golden files."""
    return GoldenFixture(request)
