"""Emitted Python after the default pipeline, run in a fresh process.

``DEFAULT_PIPELINE`` hoists constants into module parameters and closure-converts
custom rules: every corpus program is optimized with it, emitted, imported in ONE
fresh Python process without jaxpr_cc, and compared with JAX on the original:
values, and gradients wherever the program declares ``grad`` in ``SUPPORTS``.
"""
from __future__ import annotations

import pytest

import jaxpr_cc
from jaxpr_cc.backends.python_source import PythonEmitError
from test_emit_python import CORPUS, _run_fresh, emit_corpus


@pytest.fixture(scope="module")
def emitted_after_pipeline(tmp_path_factory):
    return emit_corpus(tmp_path_factory.mktemp("emitted_pipeline"), "p",
                       lambda program: jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE))


def test_pipeline_output_emits_for_every_traceable_program(emitted_after_pipeline):
    failures = {name: str(p) for name, (_, p) in emitted_after_pipeline.items()
                if isinstance(p, PythonEmitError)}
    assert failures == {}
    assert len(emitted_after_pipeline) >= 50


@pytest.mark.heavy  # a fresh process emitting the whole corpus (~30 s); the in-process checks stay default
def test_pipeline_output_runs_in_a_fresh_process_with_gradients(emitted_after_pipeline, tmp_path):
    report = _run_fresh(emitted_after_pipeline, tmp_path, grads="all", exact=False)
    grads = [n for n, ts in report["checked"].items() if "grad" in ts]
    want = [p.name for p in CORPUS if p.name in report["checked"] and "grad" in p.supports]
    assert sorted(grads) == sorted(want)
