"""Sharded programs, adversary round d (issue 18), for
tests/test_issue18_sharded_adversary_d.py (run in a fresh process: the host device
count must be set before JAX is imported).

``python sharded_adversary18d_cases.py OUT_DIR`` runs every case on 8 host devices
and prints one JSON line per case: ``{"case": name, "problems": [...]}``.  The
references are float64 NumPy derivatives (where JAX raises or has no forward mode
through a custom_vjp) and ``jax.jit`` (values and output shardings).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sharded_compile_cases import run_cases


def _near(got, want, where: str, atol=1e-5) -> list:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return [f"{where}: shape {got.shape} != reference {want.shape}"]
    if not np.allclose(got, want, rtol=1e-5, atol=atol):
        return [f"{where}: {got.ravel()[:4]} != float64 reference {want.ravel()[:4]}"]
    return []


def _check_same(out, ref, where: str) -> list:
    """Values equal to float32 rounding (XLA folds an embedded constant's sin at
    compile time; a parameter's is computed at run time) and shardings equal."""
    import jax
    out_leaves, out_tree = jax.tree.flatten(out)
    ref_leaves, ref_tree = jax.tree.flatten(ref)
    if out_tree != ref_tree:
        return [f"{where}: result structure {out_tree} != {ref_tree}"]
    problems = []
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        if o.shape != r.shape or o.dtype != r.dtype or not np.allclose(
                np.asarray(o), np.asarray(r), rtol=1e-6, atol=1e-6):
            problems.append(f"{where}: output {i} differs from jax.jit's")
        if not o.sharding.is_equivalent_to(r.sharding, o.ndim):
            problems.append(f"{where}: output {i} sharding {o.sharding} is not jax.jit's "
                            f"{r.sharding}")
    return problems


def _attempt(where: str, fn, want, **kw) -> list:
    try:
        return _near(fn(), want, where, **kw)
    except Exception as e:  # the reproducers' failures were exceptions
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return [f"{where}: {type(e).__name__}: {first[:300]}"]


def cases(out_dir: Path):
    import jax
    import jax.numpy as jnp
    from functools import partial
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import jaxpr_cc

    mesh8 = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    mesh42 = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)

    def forward_mode_wrt_replicated_param():
        """jvp/jacfwd w.r.t. a replicated (in_specs P()) argument of a custom_vjp
        inside shard_map: the zero tangent of the sharded argument must vary over
        the manual axes as the rule's transposed bwd was traced with."""
        @jax.custom_vjp
        def layer(w, x):
            return jnp.sin(w * x)

        def fwd(w, x):
            return jnp.sin(w * x), (w, x)

        def bwd(r, g):
            w, x = r
            c = jnp.cos(w * x) * g
            return jax.lax.psum((c * x).sum(), "x"), c * w
        layer.defvjp(fwd, bwd)

        def f(w, x):
            return jax.shard_map(layer, mesh=mesh8, in_specs=(P(), P("x")),
                                 out_specs=P("x"))(w, x)
        w, x = jnp.float32(0.7), jnp.linspace(-1., 1., 16, dtype=jnp.float32)
        wh, xh = 0.7, np.linspace(-1., 1., 16)
        dw = np.cos(wh * xh) * xh
        jf = jaxpr_cc.jit(f)
        p = []
        p += _attempt("value", lambda: jf(w, x), np.sin(wh * xh))
        p += _attempt("grad w", lambda: jax.grad(lambda w: jf(w, x).sum())(w), dw.sum())
        p += _attempt("jacfwd w", lambda: jax.jacfwd(jf)(w, x), dw)
        p += _attempt("jvp w", lambda: jax.jvp(lambda w: jf(w, x), (w,),
                                               (jnp.float32(1.),))[1], dw)
        p += _attempt("jacfwd x", lambda: jax.jacfwd(jf, 1)(w, x),
                      np.diag(np.cos(wh * xh) * wh))
        p += _attempt("hessian w", lambda: jax.hessian(lambda w: jf(w, x).sum())(w),
                      (-np.sin(wh * xh) * xh * xh).sum(), atol=1e-4)
        prog = jaxpr_cc.trace(f, w, x)
        p += _attempt("jvp w of trace()", lambda: jax.jvp(lambda w: prog(w, x), (w,),
                                                          (jnp.float32(1.),))[1], dw)
        return p

    def grad_wrt_value_closed_over_in_shard_map():
        """grad w.r.t. a value a custom_vjp closes over inside shard_map (jax.jit
        raises CustomVJPException here): the closed-over derivative is typed with
        the manual axes its value varies over."""
        @partial(jax.custom_vjp, nondiff_argnums=(0,))
        def fp(f, x0):
            return f(x0)
        fp.defvjp(lambda f, x0: (f(x0), x0), lambda f, x0, g: (jax.vjp(f, x0)[1](g)[0],))

        def f(b, x0):
            return jax.shard_map(
                lambda b, x0: jax.lax.psum(fp(lambda x: jnp.cos(b * x), x0), "y"),
                mesh=mesh42, in_specs=(P("x", "y"), P("x", "y")), out_specs=P("x", None))(b, x0)
        w = np.arange(1., 3.)

        def loss(b, x0):
            return (f(b, x0) * jnp.asarray(w, jnp.float32)[None, :]).sum()
        bh = np.linspace(-1, 0.9, 16).reshape(4, 4)
        xh = np.linspace(0.2, 1.5, 16).reshape(4, 4)
        spec = NamedSharding(mesh42, P("x", "y"))
        b = jax.device_put(jnp.asarray(bh, jnp.float32), spec)
        x0 = jax.device_put(jnp.asarray(xh, jnp.float32), spec)
        bl, xl = bh.reshape(4, 2, 2), xh.reshape(4, 2, 2)
        gb = (-np.sin(bl * xl) * xl * w[None, None, :]).reshape(4, 4)
        p = []
        p += _attempt("value", lambda: jaxpr_cc.jit(f)(b, x0), np.cos(bl * xl).sum(1))
        p += _attempt("grad b", lambda: jax.grad(jaxpr_cc.jit(loss))(b, x0), gb)
        p += _attempt("grad b forward_mode=False",
                      lambda: jax.grad(jaxpr_cc.jit(loss, forward_mode=False))(b, x0), gb)
        p += _attempt("jacfwd b", lambda: jax.jacfwd(jaxpr_cc.jit(loss))(b, x0), gb)
        p += _attempt("grad of trace()", lambda: jax.grad(jaxpr_cc.trace(loss, b, x0))(b, x0), gb)
        return p

    def custom_vjp_in_eagerly_evaluated_shard_map():
        """A Program called outside jit (also under jax.vmap, and loaded) evaluates
        its shard_map eagerly; a custom_vjp inside (re-bound by jaxpr-cc with
        symbolic zeros) must run there as it does under jax.jit."""
        @jax.custom_vjp
        def csin(x):
            return jnp.sin(x)
        csin.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (g * c,))

        def fv(x):
            return jax.shard_map(csin, mesh=mesh42, in_specs=P("x", "y"),
                                 out_specs=P("x", "y"))(x)
        x = jax.device_put(jnp.arange(32.).reshape(8, 4) / 10, NamedSharding(mesh42, P("x", "y")))
        xs = jnp.stack([x, 2 * x])
        want = np.sin(np.asarray(xs, np.float64))
        prog = jaxpr_cc.trace(fv, x)
        optimized = jaxpr_cc.run_passes(prog, jaxpr_cc.DEFAULT_PIPELINE)
        jaxpr_cc.save(optimized, str(out_dir / "csin.jxp"))
        loaded = jaxpr_cc.load(str(out_dir / "csin.jxp"))
        p = []
        p += _attempt("program(x)", lambda: prog(x), want[0])
        p += _attempt("vmap(trace)", lambda: jax.vmap(prog)(xs), want)
        p += _attempt("vmap(trace+pipeline)", lambda: jax.vmap(optimized)(xs), want)
        p += _attempt("vmap(loaded)", lambda: jax.vmap(loaded)(xs), want)
        p += _attempt("grad(vmap(trace))", lambda: jax.grad(lambda v: jax.vmap(prog)(v).sum())(xs),
                      np.cos(np.asarray(xs, np.float64)))

        # A fixed-point solver closing over a shard_map-local value (nondiff f).
        @partial(jax.custom_vjp, nondiff_argnums=(0,))
        def fixed_point(f, x0):
            return jax.lax.while_loop(lambda c: jnp.max(jnp.abs(c[0] - c[1])) > 1e-6,
                                      lambda c: (f(c[0]), c[0]), (f(x0), x0))[0]

        def fp_fwd(f, x0):
            x = fixed_point(f, x0)
            return x, x
        fixed_point.defvjp(fp_fwd, lambda f, x, g: (jnp.zeros_like(x),))

        def g(b, x0):
            return jax.shard_map(
                lambda b, x0: fixed_point(lambda x: jnp.cos(b * x) * 0.5 + b / 2, x0),
                mesh=mesh8, in_specs=(P("x"), P("x")), out_specs=P("x"))(b, x0)
        spec = NamedSharding(mesh8, P("x"))
        b = jax.device_put(jnp.linspace(-1, 0.9, 8), spec)
        x0 = jax.device_put(jnp.zeros(8), spec)
        bb, xx = np.linspace(-1, 0.9, 8), np.zeros(8)
        for _ in range(2000):
            xx = 0.5 * np.cos(bb * xx) + bb / 2
        p += _attempt("fixed point: trace()(b, x0)", lambda: jaxpr_cc.trace(g, b, x0)(b, x0), xx)
        return p

    def hoisted_constants_keep_jit_output_shardings():
        """A sharded constant hoisted into a parameter (DEFAULT_PIPELINE) is read as
        jax.jit reads the constant it was (embedded: replicated), so the outputs'
        shardings are jax.jit's, also after save/load."""
        devs = np.array(jax.devices()).reshape(4, 2)
        mesh = jax.sharding.Mesh(devs, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        S = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
        c = jax.device_put(jnp.arange(4096.), S(("x", "y")))
        base = np.arange(4096., dtype=np.float32).reshape(64, 64)
        c1, c2 = jax.device_put(base, S("x", "y")), jax.device_put(base, S("y", "x"))
        functions = {
            "one_output": (lambda x: x + jnp.sin(c), jax.device_put(jnp.ones(4096), S("x"))),
            "two_outputs": (lambda x: (x + c1, x * c2),
                            jax.device_put(jnp.ones((64, 64)), S(None, "x"))),
        }
        p = []
        for name, (f, x) in functions.items():
            ref = jax.jit(f)(x)
            prog = jaxpr_cc.run_passes(jaxpr_cc.trace(f, x), jaxpr_cc.DEFAULT_PIPELINE)
            if not prog.params:
                p.append(f"{name}: DEFAULT_PIPELINE hoisted nothing; the case tests nothing")
            p += _check_same(jaxpr_cc.compile(prog)(x), ref, f"{name}: compile(DEFAULT_PIPELINE)")
            jaxpr_cc.save(prog, str(out_dir / f"hoisted_{name}.jxp"))
            loaded = jaxpr_cc.load(str(out_dir / f"hoisted_{name}.jxp"))
            p += _check_same(jaxpr_cc.compile(loaded)(x), ref, f"{name}: compile(load)")
        return p

    def executable_follows_committed_arguments():
        """An executable compiled without in_shardings/out_shardings runs where its
        committed arguments are, as jax.jit does (compiling once per placement);
        one compiled with in_shardings keeps refusing other placements."""
        S = lambda *spec: NamedSharding(mesh42, P(*spec))  # noqa: E731
        f = lambda x: x * 2  # noqa: E731
        placed = {"d0": jax.device_put(jnp.arange(8.), jax.devices()[0]),
                  "d3": jax.device_put(jnp.arange(8.), jax.devices()[3]),
                  "px": jax.device_put(jnp.arange(8.), S("x")),
                  "py": jax.device_put(jnp.arange(8.), S("y"))}
        p = []
        for traced, called in [("d0", "d3"), ("d0", "px"), ("px", "d3"), ("px", "py"),
                               ("py", "px")]:
            exe = jaxpr_cc.compile(jaxpr_cc.trace(f, placed[traced]))
            ref = jax.jit(f)(placed[called])
            for attempt in range(2):  # the second call uses the cached compilation
                try:
                    p += _check_same(exe(placed[called]), ref,
                                     f"traced on {traced}, called on {called} ({attempt})")
                except Exception as e:
                    p.append(f"traced on {traced}, called on {called}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200]}")
            p += _check_same(exe(placed[traced]), jax.jit(f)(placed[traced]),
                             f"traced on {traced}, called there again")
        pinned = jaxpr_cc.compile(jaxpr_cc.trace(f, placed["px"]), in_shardings=S("x"))
        try:
            pinned(placed["py"])
            p.append("compile(in_shardings=P('x')) ran on an argument sharded P('y')")
        except ValueError:
            pass
        return p

    return {
        "forward_mode_wrt_replicated_param": forward_mode_wrt_replicated_param,
        "grad_wrt_value_closed_over_in_shard_map": grad_wrt_value_closed_over_in_shard_map,
        "custom_vjp_in_eagerly_evaluated_shard_map": custom_vjp_in_eagerly_evaluated_shard_map,
        "hoisted_constants_keep_jit_output_shardings": hoisted_constants_keep_jit_output_shardings,
        "executable_follows_committed_arguments": executable_follows_committed_arguments,
    }


CASE_NAMES = ("forward_mode_wrt_replicated_param", "grad_wrt_value_closed_over_in_shard_map",
              "custom_vjp_in_eagerly_evaluated_shard_map",
              "hoisted_constants_keep_jit_output_shardings",
              "executable_follows_committed_arguments")


def main(out_dir: Path) -> int:
    return run_cases(cases(out_dir), CASE_NAMES)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
