"""A custom rule's cache must see in-place writes to the built-in mutable containers
its rules read (issue 15, adversary round i): each program calls a ``custom_jvp``
reading a container, writes into that container in place, and calls it again.
Checked against JAX: values and gradients of ``jaxpr_cc.jit`` and the traced
Program."""
import array
import collections
import types

import jax
import numpy as np
import pytest

import jaxpr_cc


class Cfg(dict):
    pass


class Seq(list):
    pass


def _make(read, write, restore):
    """A custom_jvp whose value and tangent scale by ``read()``; the program calls
    it, ``write()``s in place, calls it again, and ``restore()``s."""
    @jax.custom_jvp
    def g(x):
        return x * read()

    g.defjvp(lambda p, t: (g(p[0]), t[0] * read()))

    def prog(x):
        y1 = g(x)
        write()
        y2 = g(x)
        restore()
        return y1 + 10 * y2
    return prog


BA = bytearray(b"\x01")
MV_BUF = bytearray(b"\x01")
MV = memoryview(MV_BUF)
ARR = array.array("d", [1.0])
DQ = collections.deque([1.0])
NS = types.SimpleNamespace(k=1.0)
CFG = Cfg(k=1.0)
CFG.scale = 1.0
DD = collections.defaultdict(lambda: 1.0)
OD = collections.OrderedDict(k=1.0)
SEQ = Seq([1.0])
SEQ.scale = 1.0
PAIRS = {("k", 1)}
NESTED = [bytearray(b"\x01")]


def _set_pairs(v):
    PAIRS.clear()
    PAIRS.add(("k", v))


CASES = {
    "bytearray": (lambda: BA[0], lambda: BA.__setitem__(0, 5), lambda: BA.__setitem__(0, 1)),
    "memoryview": (lambda: MV[0], lambda: MV_BUF.__setitem__(0, 5),
                   lambda: MV_BUF.__setitem__(0, 1)),
    "array": (lambda: ARR[0], lambda: ARR.__setitem__(0, 5.0), lambda: ARR.__setitem__(0, 1.0)),
    "deque": (lambda: DQ[0], lambda: DQ.__setitem__(0, 5.0), lambda: DQ.__setitem__(0, 1.0)),
    "simplenamespace": (lambda: NS.k, lambda: setattr(NS, "k", 5.0),
                        lambda: setattr(NS, "k", 1.0)),
    "dict_subclass_attr": (lambda: CFG.scale, lambda: setattr(CFG, "scale", 5.0),
                           lambda: setattr(CFG, "scale", 1.0)),
    "defaultdict_factory": (lambda: DD["missing"],
                            lambda: (DD.clear(), setattr(DD, "default_factory", lambda: 5.0)),
                            lambda: (DD.clear(), setattr(DD, "default_factory", lambda: 1.0))),
    "ordereddict": (lambda: OD["k"], lambda: OD.__setitem__("k", 5.0),
                    lambda: OD.__setitem__("k", 1.0)),
    "list_subclass_attr": (lambda: SEQ.scale, lambda: setattr(SEQ, "scale", 5.0),
                           lambda: setattr(SEQ, "scale", 1.0)),
    "set_of_tuples": (lambda: next(iter(PAIRS))[1], lambda: _set_pairs(5),
                      lambda: _set_pairs(1)),
    "bytearray_in_list": (lambda: NESTED[0][0], lambda: NESTED[0].__setitem__(0, 5),
                          lambda: NESTED[0].__setitem__(0, 1)),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_in_place_write_between_calls_matches_jax(kind):
    prog = _make(*CASES[kind])
    want_val, want_grad = float(prog(1.0)), float(jax.grad(prog)(1.0))
    assert (want_val, want_grad) == (51.0, 51.0)  # the write is seen by JAX
    traced = jaxpr_cc.trace(prog, 1.0)
    for g in (jaxpr_cc.jit(prog), traced):
        np.testing.assert_allclose(float(g(1.0)), want_val)
        np.testing.assert_allclose(float(jax.grad(g)(1.0)), want_grad)
