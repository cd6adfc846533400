"""The region-layout table (``jaxpr_cc.ir.layouts``) agrees with the programs JAX
stages: for every equation of every corpus program (traced, and after the default
pipeline), each constant group's operands have the types of the region inputs they
feed (the count, for shard_map), the group's count param holds its size, and per-operand / per-result params
have one entry per operand / result."""
from __future__ import annotations

import functools

import jaxpr_cc
from jaxpr_cc.golden.corpus import load_corpus
from jaxpr_cc.ir.layouts import constant_groups, layout_of

CORPUS = load_corpus()


def _check(program) -> int:
    checked = 0
    for region in program.body.regions():
        for eqn in region.equations:
            layout = layout_of(eqn)
            if layout is None:
                continue
            for name, _ in layout.operand_params:
                if isinstance(eqn.params.get(name), tuple):
                    assert len(eqn.params[name]) == len(eqn.inputs), (eqn, name)
            for name in layout.result_params:
                if isinstance(eqn.params.get(name), tuple):
                    assert len(eqn.params[name]) == len(eqn.outputs), (eqn, name)
            covered = set()
            for group in constant_groups(eqn):
                assert 0 <= group.start <= group.stop <= len(eqn.inputs)
                if group.count_param is not None:
                    assert eqn.params[group.count_param] == group.stop - group.start
                for slot in group.slots:
                    covered.add((slot.key, slot.index))
                    sub = slot.region(eqn)
                    inner = sub.invars[slot.first_input:slot.first_input + group.stop - group.start]
                    outer = eqn.inputs[group.start:group.stop]
                    assert len(inner) == len(outer), (eqn, slot)
                    if layout.transparent:  # shard_map's body sees one shard
                        assert [v.aval.strip_weak_type() for v in inner] == \
                            [a.aval.strip_weak_type() for a in outer], (eqn, slot)
                    checked += 1
            if constant_groups(eqn) and layout.transparent:
                # A transparent layout accounts for every region the equation holds.
                assert covered == {(k, i) for k, i, _ in eqn.regions()}, eqn
    return checked


def test_layouts_match_every_corpus_program():
    total = 0
    for prog in CORPUS:
        traced = jaxpr_cc.trace(functools.partial(prog.fun, **prog.kwargs), *prog.args)
        total += _check(traced)
        total += _check(jaxpr_cc.run_passes(traced, jaxpr_cc.DEFAULT_PIPELINE))
    assert total > 100  # the corpus has calls, branches, loops and custom rules

