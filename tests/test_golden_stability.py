"""Goldens do not depend on the process: hash seed, program order, test order.

* ``jaxpr-cc golden update`` run in two processes with different ``PYTHONHASHSEED``
  values (and the programs named in opposite orders) writes byte-identical files,
  which agree with the checked-in goldens;
* the golden suite passes under pytest in collection order and reversed (a small
  plugin reverses the items), with different hash seeds.

The default run uses a sample of programs chosen for the things that tend to leak
process state (sets, dicts and named tuples in parameters, custom rules, callbacks
naming files, hoisted constants, a multi-device mesh); the ``heavy`` variants run
the whole corpus.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from jaxpr_cc.golden.corpus import corpus_dir
from jaxpr_cc.golden import store
from jaxpr_cc.golden.runner import select_programs
from jaxpr_cc.golden.views import view_problems

REPO = pathlib.Path(__file__).resolve().parents[1]
ALL = [p.name for p in select_programs([corpus_dir()])]
SAMPLE = ["27_custom_vjp_two_sites", "34_debug_callback",
          "41_namedtuple_state", "49_shard_map_normalize", "51_large_constant"]

REVERSE_PLUGIN = '''\
def pytest_collection_modifyitems(session, config, items):
    items.reverse()
'''


def _env(seed: int, extra_path: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = str(seed)
    env.pop("JAXPR_CC_CORPUS", None)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    return env


def _files(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _update_in_fresh_processes(names: list[str], tmp_path: pathlib.Path) -> None:
    paths = [str(corpus_dir() / f"{name}.py") for name in names]
    outputs = {}
    for seed, order in ((1, paths), (2, paths[::-1])):
        target = tmp_path / f"seed{seed}"
        proc = subprocess.run([sys.executable, "-m", "jaxpr_cc.cli.main", "golden", "update",
                               "--expected", str(target), *order], cwd=REPO, env=_env(seed),
                              capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        outputs[seed] = _files(target)
    assert sorted({name.split(os.sep)[0] for name in outputs[1]}) == sorted(names)
    assert outputs[1] == outputs[2]
    # ... and they are the checked-in goldens (numerics within their tolerance, so
    # this also holds on a machine whose CPU rounds differently)
    expected_root = corpus_dir().parent / store.EXPECTED_DIRNAME
    for rel, data in outputs[1].items():
        golden = expected_root / rel
        assert golden.is_file(), f"{rel}: produced, but not checked in"
        problems = view_problems(golden.name, store.read_text(golden), data.decode())
        assert not problems, f"{rel}: {problems}"
    for name in names:
        assert sorted(p.name for p in (expected_root / name).iterdir()) == \
            sorted(pathlib.Path(rel).name for rel in outputs[1] if rel.startswith(name + os.sep))


def test_update_is_identical_across_hash_seeds_and_orders(tmp_path):
    _update_in_fresh_processes(SAMPLE, tmp_path)


@pytest.mark.heavy
def test_update_is_identical_across_hash_seeds_and_orders_whole_corpus(tmp_path):
    _update_in_fresh_processes(ALL, tmp_path)


_RESULT = re.compile(r"test_golden\.py::test_corpus_golden\[(?P<name>[^\]]+)\] (?P<outcome>[A-Z]+)")


def _pytest_in_both_orders(names: list[str], tmp_path: pathlib.Path) -> None:
    (tmp_path / "reverse_order_plugin.py").write_text(REVERSE_PLUGIN)
    selector = " or ".join(f"test_corpus_golden[{name}]" for name in names)
    runs = {}
    for seed, extra in ((3, []), (4, ["-p", "reverse_order_plugin"])):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/test_golden.py", "-v", "-p", "no:randomly",
             "-p", "no:cacheprovider", "-k", selector, *extra],
            cwd=REPO, env=_env(seed, str(tmp_path)), capture_output=True, text=True, timeout=1800)
        results = [(m.group("name"), m.group("outcome")) for m in _RESULT.finditer(proc.stdout)]
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        runs[seed] = results
    assert [n for n, _ in runs[3]] == sorted(names)
    assert [n for n, _ in runs[4]] == sorted(names)[::-1]  # really reversed
    assert {o for _, o in runs[3] + runs[4]} == {"PASSED"}


def test_golden_suite_passes_in_both_orders(tmp_path):
    _pytest_in_both_orders(SAMPLE, tmp_path)


@pytest.mark.heavy
def test_golden_suite_passes_in_both_orders_whole_corpus(tmp_path):
    _pytest_in_both_orders(ALL, tmp_path)
