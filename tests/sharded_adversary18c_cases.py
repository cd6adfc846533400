"""Sharded programs as JAX users expect them (issue 18, adversary reproducers), for
tests/test_sharded_adversary18c.py (run in a fresh process: the host device count
must be set before JAX is imported).

``python sharded_adversary18c_cases.py OUT_DIR`` runs every case on 8 host devices
and prints one JSON line per case: ``{"case": name, "problems": [...]}``.  The
reference is ``jax.jit`` of the same function on the same arguments (values bit
for bit, and every output's sharding); where JAX raises (forward mode through a
custom_vjp), the same function without the custom_vjp under ``jax.jit``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sharded_compile_cases import _check_same, run_cases


def _close(out, ref, where: str) -> list:
    """Values equal to float32 rounding (a different but equivalent order of
    operations: forward mode through a transposed bwd), shardings equal."""
    import jax
    problems = []
    out_leaves, ref_leaves = jax.tree.leaves(out), jax.tree.leaves(ref)
    if len(out_leaves) != len(ref_leaves):
        return [f"{where}: {len(out_leaves)} results, reference has {len(ref_leaves)}"]
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        if o.shape != r.shape or o.dtype != r.dtype or not np.allclose(
                np.asarray(o), np.asarray(r), rtol=1e-5, atol=1e-6):
            problems.append(f"{where}: output {i} {np.asarray(o)} differs from {np.asarray(r)}")
        if not o.sharding.is_equivalent_to(r.sharding, o.ndim):
            problems.append(f"{where}: output {i} sharding {o.sharding} != {r.sharding}")
    return problems


def _save_load(program, out_dir: Path, name: str):
    import jaxpr_cc
    path = out_dir / f"{name}.jxp"
    jaxpr_cc.save(program, str(path))
    return jaxpr_cc.load(str(path)), path


def cases(out_dir: Path):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import jaxpr_cc
    from jaxpr_cc.ir.program import Program

    explicit = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    auto = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    x = jax.device_put(jnp.arange(32.).reshape(8, 4), NamedSharding(explicit, P("x")))
    c = jax.device_put(jnp.arange(32.).reshape(8, 4) / 7, NamedSharding(explicit, P(None, "y")))
    s0 = jax.device_put(jnp.float32(3.0), NamedSharding(explicit, P()))
    key = jax.device_put(jax.random.key(0), NamedSharding(explicit, P()))
    wide = jax.device_put(jnp.ones((8, 512)), NamedSharding(explicit, P("x")))
    big = jax.device_put(jnp.arange(8 * 512.).reshape(8, 512), NamedSharding(explicit, P(None, "y")))

    def constants_keep_their_sharding():
        """A sharded array the program closes over keeps its sharding through save
        and load (under Explicit axes it is part of the result's type)."""
        problems = []
        functions = {
            "add": lambda a: a + c,
            "scalar": lambda a: a * s0 + c,
            "returned": lambda a: (a, c, s0),
            "key": lambda a: a + jax.random.uniform(key, a.shape,
                                                     out_sharding=NamedSharding(explicit, P("x"))),
        }
        for name, f in functions.items():
            ref = jax.jit(f)(x)
            loaded, _ = _save_load(jaxpr_cc.trace(f, x), out_dir, f"const_{name}")
            problems += _check_same(jaxpr_cc.compile(loaded)(x), ref, f"{name}: compile(load)")
            problems += _check_same(loaded(x), ref, f"{name}: loaded program called")
            problems += _check_same(jax.jit(loaded)(x), ref, f"{name}: jax.jit(loaded)")
        return problems

    def hoisted_parameter_compiles_without_set_mesh():
        """A hoisted sharded parameter keeps its sharding through save and load, and
        the loaded program compiles without jax.set_mesh or in_shardings."""
        f = lambda a: a + big  # noqa: E731
        ref = jax.jit(f)(wide)
        hoisted = jaxpr_cc.run_passes(jaxpr_cc.trace(f, wide), "hoist-consts{min-bytes=0}")
        loaded, _ = _save_load(hoisted, out_dir, "hoisted")
        problems = []
        if loaded.params[0].sharding != big.sharding:
            problems.append(f"parameter sharding after load {loaded.params[0].sharding}")
        problems += _check_same(jaxpr_cc.compile(loaded)(wide), ref, "compile(load)")
        problems += _check_same(jaxpr_cc.compile(
            loaded, in_shardings=NamedSharding(explicit, P("x")))(wide), ref,
            "compile(load, in_shardings)")
        problems += _check_same(loaded(wide), ref, "loaded program called")
        problems += _check_same(jax.jit(loaded)(wide), ref, "jax.jit(loaded)")
        # A file written before values kept their sharding holds the parameter on
        # one device: it is placed on the mesh of the saved argument shardings.
        unplaced = Program(loaded.body, loaded.in_tree, loaded.out_tree, name=loaded.name,
                           params=[jax.device_put(np.asarray(p)) for p in loaded.params],
                           arg_shardings=loaded.arg_shardings)
        problems += _check_same(jaxpr_cc.compile(unplaced)(wide), ref, "unplaced parameter")
        return problems

    def cli_compile_and_exec_hoisted():
        """The command line compiles and runs the saved hoisted program (its mesh
        comes from the file)."""
        from jaxpr_cc.cli.main import main as cli
        f = lambda a: a + big  # noqa: E731
        ref = np.asarray(jax.jit(f)(wide))
        hoisted = jaxpr_cc.run_passes(jaxpr_cc.trace(f, wide), "hoist-consts{min-bytes=0}")
        _, path = _save_load(hoisted, out_dir, "cli_hoisted")
        inputs = out_dir / "cli_in.npz"
        np.savez(inputs, arg0=np.asarray(wide))
        problems = []
        exe = out_dir / "cli_hoisted.jxe"
        if cli(["compile", str(path), "-o", str(exe)]) != 0:
            problems.append("jaxpr-cc compile failed")
        for what, target in (("program", path), ("executable", exe)):
            result = out_dir / f"cli_out_{what}.npz"
            if cli(["exec", str(target), "--inputs", str(inputs), "-o", str(result)]) != 0:
                problems.append(f"jaxpr-cc exec of the {what} failed")
            elif not np.array_equal(np.load(result)["out0"], ref):
                problems.append(f"jaxpr-cc exec of the {what}: values differ from jax.jit's")
        return problems

    @jax.custom_vjp
    def sin_vjp(b):
        return jnp.sin(b)
    sin_vjp.defvjp(lambda b: (jnp.sin(b), b), lambda r, g: (g * jnp.cos(r),))

    @jax.custom_vjp
    def clipped(b):
        return jnp.sin(b)
    clipped.defvjp(lambda b: (jnp.sin(b), b),
                   lambda r, g: (jnp.clip(g * jnp.cos(r), -0.5, 0.5),))

    xa = jnp.arange(1., 33.).reshape(8, 4)

    def in_shard_map(rule):
        return lambda a: jax.shard_map(lambda b: jax.lax.psum(rule(b).sum(), "x"), mesh=auto,
                                       in_specs=P("x"), out_specs=P())(a)

    def grad_of_jit_with_custom_vjp_in_shard_map():
        """jax.grad of jaxpr_cc.jit(f), f a shard_map over a custom_vjp, with forward
        mode on (the default): the rewritten rule's tangents keep their vma."""
        problems = []
        for rname, rule in (("linear bwd", sin_vjp), ("reverse-only bwd", clipped)):
            h = in_shard_map(rule)
            ref = jax.grad(jax.jit(h))(xa)
            problems += _check_same(jax.grad(jaxpr_cc.jit(h))(xa), ref, f"{rname}: grad(cc.jit)")
            problems += _check_same(jax.jit(jax.grad(jaxpr_cc.jit(h)))(xa), ref,
                                    f"{rname}: jit(grad(cc.jit))")
            # jaxpr_cc.jit inside the shard_map body
            g = jaxpr_cc.jit(lambda b: rule(b).sum())
            h_in = jax.shard_map(lambda b: jax.lax.psum(g(b), "x"), mesh=auto, in_specs=P("x"),
                                 out_specs=P())
            problems += _check_same(jax.grad(h_in)(xa), ref, f"{rname}: grad(shard_map(cc.jit))")
        return problems

    def grad_of_program_with_custom_vjp_in_shard_map():
        """jax.grad of a Program (traced, and saved and loaded) holding a shard_map
        over a custom_vjp; and that gradient traced and compiled."""
        h = in_shard_map(sin_vjp)
        ref = jax.jit(jax.grad(h))(xa)
        traced = jaxpr_cc.run_passes(jaxpr_cc.trace(h, xa), "canonicalize")
        loaded, _ = _save_load(traced, out_dir, "grad_program")
        problems = []
        for name, prog in (("traced", traced), ("loaded", loaded)):
            problems += _check_same(jax.grad(prog)(xa), ref, f"{name}: grad(program)")
            problems += _check_same(jaxpr_cc.compile(jaxpr_cc.trace(jax.grad(prog), xa))(xa), ref,
                                    f"{name}: compile(trace(grad(program)))")
        return problems

    def forward_mode_in_shard_map():
        """Forward mode through the rewritten rule inside shard_map: jax.jit raises
        for a custom_vjp, so the reference is the same function without it; a
        reverse-only rule refuses in one line."""
        plain = lambda a: jax.shard_map(  # noqa: E731
            lambda b: jax.lax.psum(jnp.sin(b).sum(), "x"), mesh=auto, in_specs=P("x"),
            out_specs=P())(a)
        t = jnp.linspace(-1., 1., 32).reshape(8, 4)
        ref = jax.jit(lambda a, ta: jax.jvp(plain, (a,), (ta,)))(xa, t)
        problems = _close(jax.jvp(jaxpr_cc.jit(in_shard_map(sin_vjp)), (xa,), (t,)), ref,
                          "jvp(cc.jit(shard_map(custom_vjp)))")
        g = jaxpr_cc.jit(lambda b: sin_vjp(b).sum())
        inner = lambda a: jax.shard_map(lambda b: jax.lax.psum(g(b), "x"),  # noqa: E731
                                        mesh=auto, in_specs=P("x"), out_specs=P())(a)
        problems += _close(jax.jvp(inner, (xa,), (t,)), ref, "jvp(shard_map(cc.jit(custom_vjp)))")
        try:
            jax.jvp(jaxpr_cc.jit(in_shard_map(clipped)), (xa,), (t,))
            problems.append("forward mode through a reverse-only rule did not raise")
        except TypeError as e:
            if "reverse-only rule" not in str(e).splitlines()[0]:
                problems.append(f"reverse-only refusal message: {str(e)[:300]}")
        return problems

    def reverse_only_rule_in_shard_map_saves():
        """The rewritten program (with a reverse-only rule's refusal inside
        shard_map) saves, loads and differentiates like jax.jit."""
        from jaxpr_cc.passes.vjp_to_jvp import with_forward_mode
        h = in_shard_map(clipped)
        ref = jax.jit(jax.grad(h))(xa)
        loaded, _ = _save_load(with_forward_mode(jaxpr_cc.trace(h, xa)), out_dir, "reverse_only")
        return _check_same(jax.grad(loaded)(xa), ref, "grad(loaded rewritten program)")

    def rules_with_literals_in_shard_map():
        """Custom rules whose bodies hold Python literals (pvary'd inside shard_map)
        are re-bound in the body's context: plain calls, grad, vmap and a custom_jvp."""
        mesh8 = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))

        @jax.custom_vjp
        def twice_sin(v):
            return jnp.sin(v) * 2.

        twice_sin.defvjp(lambda v: (jnp.sin(v) * 2., jnp.cos(v)), lambda r, g: (2. * g * r,))

        @jax.custom_jvp
        def twice_sin_jvp(v):
            return jnp.sin(v) * 2.

        twice_sin_jvp.defjvp(lambda p, t: (jnp.sin(p[0]) * 2., 2. * jnp.cos(p[0]) * t[0]))
        v = jnp.linspace(0., 1., 16)
        problems = []
        for rule in (twice_sin, twice_sin_jvp):
            def loss(a, rule=rule):
                return jax.shard_map(rule, mesh=mesh8, in_specs=P("x"),
                                     out_specs=P("x"))(a).sum()
            name = rule.__name__
            problems += _close(jaxpr_cc.jit(loss)(v), jax.jit(loss)(v), f"{name} value")
            problems += _close(jax.grad(jaxpr_cc.jit(loss))(v), jax.grad(jax.jit(loss))(v),
                               f"{name} grad")
            problems += _close(jax.grad(jaxpr_cc.trace(loss, v))(v), jax.grad(jax.jit(loss))(v),
                               f"{name} grad of Program")
            vv = jnp.stack([v, v + 1.])
            problems += _close(jax.vmap(jaxpr_cc.jit(loss))(vv), jax.vmap(jax.jit(loss))(vv),
                               f"{name} vmap")
        return problems

    def untyped_collective_in_bwd_is_reverse_only():
        """Inside shard_map(check_vma=False) a bwd that psums a replicated value's
        cotangent has no transpose JAX can type (psum would transpose to psum: the
        tangent times the axis size): forward mode refuses in one line; grad is
        jax.jit's."""
        mesh8 = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))

        @jax.custom_vjp
        def layer(w, v):
            return jnp.sin(w * v)

        def layer_bwd(r, g):
            w, v = r
            c = jnp.cos(w * v) * g
            return jax.lax.psum((c * v).sum(), "x"), c * w

        layer.defvjp(lambda w, v: (jnp.sin(w * v), (w, v)), layer_bwd)

        def f(w, v):
            return jax.shard_map(layer, mesh=mesh8, in_specs=(P(), P("x")), out_specs=P("x"),
                                 check_vma=False)(w, v)

        w, v = jnp.float32(0.7), jnp.linspace(-1., 1., 16, dtype=jnp.float32)
        problems = _close(jax.grad(lambda w: jaxpr_cc.jit(f)(w, v).sum())(w),
                          jax.grad(lambda w: jax.jit(f)(w, v).sum())(w), "grad")
        try:
            jax.jvp(lambda w: jaxpr_cc.jit(f)(w, v), (w,), (jnp.float32(1.),))
            problems.append("forward mode through an untyped psum in bwd did not raise")
        except TypeError as e:
            if "check_vma=False" not in str(e).splitlines()[0]:
                problems.append(f"refusal message: {str(e)[:300]}")
        return problems

    return {
        "constants_keep_their_sharding": constants_keep_their_sharding,
        "hoisted_parameter_compiles_without_set_mesh": hoisted_parameter_compiles_without_set_mesh,
        "cli_compile_and_exec_hoisted": cli_compile_and_exec_hoisted,
        "grad_of_jit_with_custom_vjp_in_shard_map": grad_of_jit_with_custom_vjp_in_shard_map,
        "grad_of_program_with_custom_vjp_in_shard_map": grad_of_program_with_custom_vjp_in_shard_map,
        "forward_mode_in_shard_map": forward_mode_in_shard_map,
        "reverse_only_rule_in_shard_map_saves": reverse_only_rule_in_shard_map_saves,
        "rules_with_literals_in_shard_map": rules_with_literals_in_shard_map,
        "untyped_collective_in_bwd_is_reverse_only": untyped_collective_in_bwd_is_reverse_only,
    }


CASE_NAMES = ("constants_keep_their_sharding", "hoisted_parameter_compiles_without_set_mesh",
              "cli_compile_and_exec_hoisted", "grad_of_jit_with_custom_vjp_in_shard_map",
              "grad_of_program_with_custom_vjp_in_shard_map", "forward_mode_in_shard_map",
              "reverse_only_rule_in_shard_map_saves", "rules_with_literals_in_shard_map",
              "untyped_collective_in_bwd_is_reverse_only")


def main(out_dir: Path) -> int:
    return run_cases(cases(out_dir), CASE_NAMES)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
