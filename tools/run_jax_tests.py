"""Run one of JAX's own test files with ``jax.jit`` (and optionally
``jax.closure_convert``) swapped for jaxpr-cc's.

Usage::

    python tools/run_jax_tests.py PATH/TO/lax_control_flow_test.py [--swap jit]
        [--swap closure_convert] [--no-swap] [--ids FILE] [-- PYTEST ARGS...]

The test file is read where it is (this script fetches nothing and copies nothing):
check out JAX's ``tests/`` at the tag matching the installed JAX, e.g.
``git --git-dir=<jax clone> show jax-v0.10.2:tests/lax_control_flow_test.py > /tmp/t.py``.
JAX's tests need ``absl-py`` importable (``pip install absl-py``, or a directory of
it on ``PYTHONPATH``).

How the swap works: before pytest imports the test file, ``jax.jit`` (and JAX's
internal ``api.jit``, which JAX's tests also call) are replaced by a dispatcher that
looks at its caller: calls made from code in the test file get ``jaxpr_cc.jit``,
everything else (JAX itself, jaxpr-cc, which compiles through the real ``jax.jit``)
gets the real one.  So ``jax.jit(f)``, ``from jax import jit``, ``@jax.jit`` and
``partial(jax.jit, static_argnums=...)`` written in the test file all compile
through jaxpr-cc, and nothing else changes.  ``closure_convert`` is swapped the
same way.  ``--no-swap`` runs the file unchanged (the baseline).

Extra arguments after ``--`` go to pytest (``-k``, ``-q``, ``-x``...).  The exit
status is pytest's.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SWAPPABLE = {
    "jit": ("jaxpr_cc", "jit"),
    "closure_convert": ("jaxpr_cc", "closure_convert"),
}


class SwapPlugin:
    """A pytest plugin that installs the swaps when pytest is configured, i.e.
    before the test file is imported, and counts how often each swap was taken."""

    def __init__(self, test_files: list[str], names: list[str]):
        self.test_files = {os.path.realpath(f) for f in test_files}
        self.names = names
        self.taken = {n: 0 for n in names}
        self._undo: list = []

    def pytest_configure(self, config):
        import jax

        import jaxpr_cc
        from jaxpr_cc.jax_adapter import jit_defining_modules
        for name in self.names:
            ours = getattr(jaxpr_cc, SWAPPABLE[name][1])
            real = getattr(jax, name)
            modules = jit_defining_modules() if name == "jit" else (jax,)
            dispatcher = self._dispatcher(name, real, ours)
            for module in modules:
                if getattr(module, name, None) is real:
                    self._undo.append((module, name, real))
                    setattr(module, name, dispatcher)

    def pytest_unconfigure(self, config):
        for module, name, real in reversed(self._undo):
            setattr(module, name, real)
        self._undo.clear()

    def pytest_terminal_summary(self, terminalreporter):
        for name, n in self.taken.items():
            terminalreporter.write_line(f"run_jax_tests: jaxpr_cc.{name} stood in for "
                                        f"jax.{name} {n} times")

    def _dispatcher(self, name: str, real, ours):
        test_files, taken = self.test_files, self.taken

        def swapped(*args, **kwargs):
            # The caller's frame decides: only code written in the test file is
            # redirected; functools.partial adds no Python frame.
            caller = sys._getframe(1).f_code.co_filename
            if caller in test_files or os.path.realpath(caller) in test_files:
                taken[name] += 1
                return ours(*args, **kwargs)
            return real(*args, **kwargs)
        swapped.__name__ = swapped.__qualname__ = name
        swapped.__doc__ = real.__doc__
        swapped.__wrapped__ = real
        return swapped


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    else:
        pytest_args = []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", help="a JAX test file (e.g. lax_control_flow_test.py)")
    parser.add_argument("--swap", action="append", choices=sorted(SWAPPABLE),
                        help="what to swap for jaxpr-cc's (repeatable; default: jit)")
    parser.add_argument("--ids", metavar="FILE",
                        help="run only these tests: a file with one test id a line, "
                             "'Class::test_name' or 'path::Class::test_name' (the order "
                             "is kept)")
    parser.add_argument("--no-swap", action="store_true",
                        help="swap nothing: run the file as JAX runs it (the baseline)")
    opts = parser.parse_args(argv)
    if any(a == "-n" or a.startswith(("-n=", "--numprocesses")) or (a.startswith("-n") and a[2:].isdigit())
           for a in pytest_args) and not opts.no_swap:
        # pytest-xdist runs the tests in worker processes, where the swap is not installed.
        parser.error("the swap lives in this process: run without pytest-xdist's -n")
    path = Path(opts.test_file)
    if not path.is_file():
        parser.error(f"test_file {opts.test_file!r} is not a file; check out JAX's tests at "
                     f"the installed version first (see this script's docstring)")
    if "absl" in path.read_text(errors="replace"):
        try:
            import absl.testing  # noqa: F401
        except ImportError:
            parser.error("JAX's tests need absl-py: pip install absl-py (or put it on "
                         "PYTHONPATH)")
    if opts.no_swap and opts.swap:
        parser.error("--no-swap and --swap contradict each other; give one")
    names = [] if opts.no_swap else sorted(set(opts.swap or ["jit"]))
    # The project's own package, wherever this script is run from.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import pytest
    plugin = SwapPlugin([str(path)], names)
    # rootdir next to the test file, so no conftest of ours applies to it.
    if opts.ids:
        try:
            wanted = [line.strip() for line in open(opts.ids) if line.strip()]
        except OSError as e:
            parser.error(f"--ids {opts.ids!r}: {e.strerror}")
        # Ids name tests of the given file, whatever path they were written with.
        targets = [f"{path}::{i.split('.py::', 1)[-1]}" for i in wanted]
    else:
        targets = [str(path)]
    args = [*targets, "--rootdir", str(path.parent), *pytest_args]
    return int(pytest.main(args, plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main())
