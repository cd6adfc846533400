"""Worker for tests/test_jit_adversary18.py on 8 host devices (set before JAX is
imported): one JSON line per case, ``{"case": name, "problems": [...]}``, every
value and sharding compared with jax.jit's in the same process."""
import json
import os
import sys
import tempfile
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxpr_cc
from jaxpr_cc.backends.xla import load_executable


def _same(problems, what, got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        problems.append(f"{what}: got {got!r}, jax.jit gives {want!r}")


def _bodies(jit):
    # (name, in_specs, body): each body calls `jit` on a function of its shards.
    return [
        ("times_two", P("x"), lambda b: jit(lambda c: c * 2)(b)),
        ("psum", P("x"), lambda b: jit(lambda c: jax.lax.psum(c, "x"))(b)),
        ("axis_index", P("x"), lambda b: jit(lambda c: c + jax.lax.axis_index("x"))(b)),
        # A varying and an invariant input mixed in one program.
        ("invariant_second", (P("x"), P()),
         lambda b, w: jit(lambda c, u: c * u + jax.lax.psum(c, "x"))(b, w)),
        ("grad_inside", P("x"),
         lambda b: jax.grad(lambda c: jit(lambda d: jnp.sin(d) * d)(c).sum())(b)),
    ]


def case_jit_in_shard_map():
    problems = []
    for axis_type in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
        v = jax.device_put(jnp.arange(16.), NamedSharding(mesh, P("x")))
        w = jax.device_put(jnp.arange(2.) + 1.5, NamedSharding(mesh, P()))
        for (name, in_specs, ours), (_, _, ref) in zip(_bodies(jaxpr_cc.jit), _bodies(jax.jit)):
            args = (v, w) if isinstance(in_specs, tuple) else (v,)
            for check_vma in (True, False):
                label = f"{axis_type} {name} check_vma={check_vma}"
                run = lambda body: jax.shard_map(body, mesh=mesh, in_specs=in_specs,  # noqa
                                                 out_specs=P("x"), check_vma=check_vma)(*args)
                want = run(ref)
                try:
                    got = run(ours)
                except Exception as e:  # the bug: report, do not stop the other cases
                    problems.append(f"{label}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                _same(problems, label, got, want)
                if got.sharding != want.sharding:
                    problems.append(f"{label}: sharding {got.sharding} vs {want.sharding}")
    return problems


def case_compile_follows_committed_device():
    problems = []

    def f(a):
        return a * 2 + 1
    x = jax.device_put(jnp.arange(4.), jax.devices()[3])
    want = jax.jit(f).lower(x).compile()(x)
    exe = jaxpr_cc.compile(jaxpr_cc.trace(f, x))
    got = exe(x)
    _same(problems, "compile(trace(f, x))(x)", got, want)
    if got.sharding != want.sharding:
        problems.append(f"placement {got.sharding}, jax.jit AOT {want.sharding}")
    # The same executable still runs where it was compiled, and on other devices.
    for dev in (0, 5):
        y = jax.device_put(jnp.arange(4.) - 1, jax.devices()[dev])
        r, ref = exe(y), jax.jit(f)(y)
        _same(problems, f"on device {dev}", r, ref)
        if r.sharding != ref.sharding:
            problems.append(f"on device {dev}: {r.sharding} vs {ref.sharding}")
    _same(problems, "uncommitted", exe(np.arange(4.0, dtype=np.float32)), f(jnp.arange(4.)))
    # Saved and loaded, it stays portable and follows the argument too.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "e.jxe")
        exe.save(path)
        loaded = load_executable(path)
        r = loaded(x)
        _same(problems, "loaded(x)", r, want)
        if r.sharding != want.sharding:
            problems.append(f"loaded placement {r.sharding}, jax.jit AOT {want.sharding}")
    # A program with a closed-over array follows the argument as well.
    c = jnp.arange(4.) * 3

    def g(a):
        return a * c
    r = jaxpr_cc.compile(jaxpr_cc.trace(g, x))(x)
    ref = jax.jit(g).lower(x).compile()(x)
    _same(problems, "closed-over constant", r, ref)
    if r.sharding != ref.sharding:
        problems.append(f"closed-over constant: {r.sharding} vs {ref.sharding}")
    # A device mismatch between committed arguments is still refused, as by jax.jit.
    y = jax.device_put(jnp.arange(4.), jax.devices()[1])
    two = jaxpr_cc.compile(jaxpr_cc.trace(lambda a, b: a + b, x, x))
    for name, fn in (("jax.jit", jax.jit(lambda a, b: a + b)), ("jaxpr_cc", two)):
        try:
            fn(x, y)
            problems.append(f"{name}: arguments on devices 3 and 1 were accepted")
        except ValueError:
            pass
    return problems


CASES = {name[len("case_"):]: fn for name, fn in dict(globals()).items()
         if name.startswith("case_")}
CASE_NAMES = sorted(CASES)

if __name__ == "__main__":
    for name in sys.argv[1:] or CASE_NAMES:
        try:
            problems = CASES[name]()
        except Exception:
            problems = [traceback.format_exc()]
        print(json.dumps({"case": name, "problems": problems}), flush=True)
