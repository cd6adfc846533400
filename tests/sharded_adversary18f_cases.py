"""Sharded and multi-device cases of adversary round f (issue 18), for
tests/test_issue18_adversary_f.py (run in a fresh process: the host device count
must be set before JAX is imported).

``python sharded_adversary18f_cases.py OUT_DIR`` prints one JSON line per case:
``{"case": name, "problems": [...]}``.  References: ``jax.jit`` (values, output
shardings, devices) and the analytic derivative cos for sin.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

from sharded_compile_cases import run_cases


def _same(got, want, where: str) -> list:
    problems = []
    if got.shape != want.shape or not np.allclose(np.asarray(got), np.asarray(want),
                                                  rtol=1e-6, atol=1e-6):
        problems.append(f"{where}: value differs from jax.jit's")
    if not got.sharding.is_equivalent_to(want.sharding, got.ndim) or \
            got.sharding.device_set != want.sharding.device_set:
        problems.append(f"{where}: sharding {got.sharding} is not jax.jit's {want.sharding}")
    return problems


def cases(out_dir: Path):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import jaxpr_cc

    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("x", "y")))
    c = jax.device_put(jnp.arange(64.).reshape(8, 8), NamedSharding(mesh, P(None, "x")))

    def hoisted_sharded_constant_output_placement():
        # An output computed only from a hoisted sharded constant: jax.jit embeds
        # the constant, so only the arguments it keeps decide where it runs.
        problems = []
        table = [("unused arg", lambda a: c + 1, (x,), {}),
                 ("unused arg, keep_unused", lambda a: c + 1, (x,), {"keep_unused": True}),
                 ("uncommitted arg", lambda a: c + a, (jnp.ones((8, 8)),), {}),
                 ("sharded arg", lambda a: c + a, (x,), {}),
                 ("no args", lambda: c + 1, (), {})]
        for name, f, args, kw in table:
            want = jax.jit(f, **kw)(*args)
            problems += _same(jaxpr_cc.jit(f, **kw)(*args), want, f"{name}: jaxpr_cc.jit")
            exe = jaxpr_cc.jit(f, **kw).executable(*args)
            problems += _same(exe(*args), want, f"{name}: .executable")
            if kw:
                continue  # jaxpr_cc.compile has jax.jit's defaults
            q = jaxpr_cc.run_passes(jaxpr_cc.trace(f, *args), jaxpr_cc.DEFAULT_PIPELINE)
            problems += _same(jaxpr_cc.compile(q)(*args), want, f"{name}: passes -> compile")
            path = out_dir / "hoisted.jcc"
            jaxpr_cc.save(q, path)
            problems += _same(jaxpr_cc.compile(jaxpr_cc.load(path))(*args), want,
                              f"{name}: save/load -> compile")
        return problems

    def executable_honours_device_keyword():
        problems = []
        d3 = jax.devices()[3]
        c0 = jax.device_put(jnp.ones(4), jax.devices()[0])  # a committed constant elsewhere
        a = jnp.arange(4.)
        for name, f in [("plain", lambda v: v * 2), ("closing over a committed constant",
                                                     lambda v: v * c0)]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                want = jax.jit(f, device=d3)(a)
                jf = jaxpr_cc.jit(f, device=d3)
            problems += _same(jf(a), want, f"{name}: jaxpr_cc.jit(device=)")
            problems += _same(jf.executable(a)(a), want, f"{name}: .executable")
        return problems

    def forward_mode_through_vma_zero_term():
        # bwd = cos(a) * ct + 0 * i (i an integer residual): exactly linear in ct;
        # under check_vma the zero passes through a pvary cast.
        m = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
        xs = jnp.linspace(0.1, 1.6, 16, dtype=jnp.float32)

        @jax.custom_vjp
        def g(a):
            return jnp.sin(a)

        def fwd(a):
            return jnp.sin(a), (a, jnp.argmax(a))

        def bwd(r, ct):
            a, i = r
            return (jnp.cos(a) * ct + 0 * i,)
        g.defvjp(fwd, bwd)
        problems = []
        want = np.cos(np.asarray(xs, np.float64))
        for check_vma in (True, False):
            f = jax.shard_map(g, mesh=m, in_specs=P("x"), out_specs=P("x"), check_vma=check_vma)
            try:
                _, t = jax.jvp(jaxpr_cc.jit(f), (xs,), (jnp.ones_like(xs),))
                jac = jax.jacfwd(jaxpr_cc.jit(f))(xs)
            except Exception as e:  # the reproducer's failure was an exception
                problems.append(f"check_vma={check_vma}: {type(e).__name__}: {str(e)[:200]}")
                continue
            if not np.allclose(np.asarray(t), want, rtol=1e-5, atol=1e-6):
                problems.append(f"check_vma={check_vma}: jvp {np.asarray(t)[:3]} != cos")
            if not np.allclose(np.asarray(jac), np.diag(want), rtol=1e-5, atol=1e-6):
                problems.append(f"check_vma={check_vma}: jacfwd is not diag(cos)")
        return problems

    return {
        "hoisted_sharded_constant_output_placement": hoisted_sharded_constant_output_placement,
        "executable_honours_device_keyword": executable_honours_device_keyword,
        "forward_mode_through_vma_zero_term": forward_mode_through_vma_zero_term,
    }


CASE_NAMES = ("hoisted_sharded_constant_output_placement", "executable_honours_device_keyword",
              "forward_mode_through_vma_zero_term")


def main(out_dir: Path) -> int:
    return run_cases(cases(out_dir), CASE_NAMES)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
