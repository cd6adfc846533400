"""Multi-device cases of issue 18's last open items, for tests/test_issue18_h.py (run
in a fresh process: the host device count must be set before JAX is imported).

``python sharded_issue18h_cases.py OUT_DIR`` (8 devices) prints one JSON line per
case: ``{"case": name, "problems": [...]}``.  ``python sharded_issue18h_cases.py
OUT_DIR --one-device`` loads the device=-pinned executable the 8-device run saved
in a process with one device and prints ``{"case": "load_on_missing_device",
"error": ...}``.  References: ``jax.jit`` (values, output shardings).
"""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np

from sharded_compile_cases import run_cases


def cases(out_dir: Path):
    import warnings

    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, PartitionSpec as P

    import jaxpr_cc
    from jaxpr_cc.backends.xla import load_executable

    def vmap_of_shard_map_custom_vjp_with_constants():
        # A custom_vjp whose fwd and bwd close over a constant array, called in a
        # shard_map body: jax.vmap of it makes JAX stage the rule again (a batched
        # fwd thunk and bwd), which must be traced in the body's axis context.
        mesh = jax.make_mesh((8,), ("i",), axis_types=(AxisType.Auto,))
        scale = jnp.array([1.5, -0.25])

        @jax.custom_vjp
        def g(x, w):
            return jnp.sin(x) * w * scale[0]

        def g_fwd(x, w):
            return g(x, w), (jnp.cos(x), jnp.sin(x), w)

        def g_bwd(res, ct):
            cos, sin, w = res
            return ct * cos * w * scale[0] + scale[1], ct * sin * scale[0]
        g.defvjp(g_fwd, g_bwd)

        def f(x, w):
            return jax.shard_map(g, mesh=mesh, in_specs=(P("i"), P("i")),
                                 out_specs=P("i"))(x, w).sum()

        w = jnp.arange(8.) + 1.0
        x = jnp.linspace(0., 1., 8)
        xs = jnp.stack([x, 2 * x, -x])

        def summed(fn):
            return lambda a, b: jax.vmap(fn, in_axes=(0, None))(a, b).sum()
        compositions = {
            "grad(jit)": lambda J: jax.grad(J(f), argnums=(0, 1))(x, w),
            "vmap(grad(jit))": lambda J: jax.vmap(jax.grad(J(f)), in_axes=(0, None))(xs, w),
            "jit(vmap(f))": lambda J: J(jax.vmap(f, in_axes=(0, None)))(xs, w),
            "jit(vmap(grad))": lambda J: J(jax.vmap(jax.grad(f), in_axes=(0, None)))(xs, w),
            "jit(grad(vmap))": lambda J: J(jax.grad(summed(f), argnums=(0, 1)))(xs, w),
            "grad(jit(vmap))": lambda J: jax.grad(
                lambda a, b: J(jax.vmap(f, in_axes=(0, None)))(a, b).sum(),
                argnums=(0, 1))(xs, w),
            "grad(vmap(jit))": lambda J: jax.grad(summed(J(f)), argnums=(0, 1))(xs, w),
        }
        problems = []
        for name, run in compositions.items():
            want = run(jax.jit)
            try:
                got = run(jaxpr_cc.jit)
            except Exception as e:  # noqa: BLE001 -- reported as a problem
                problems.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                continue
            for g_leaf, w_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                if not np.allclose(np.asarray(g_leaf), np.asarray(w_leaf), rtol=1e-5,
                                   atol=1e-6):
                    problems.append(f"{name}: differs from jax.jit's")
        return problems

    def device_executable_kept_through_save_and_load():
        # jax.jit's device= puts inputs and outputs on that device, and its compiled
        # call moves arguments committed to another device there.
        problems = []
        devices = jax.devices()
        f = lambda v: v * 2 + 1  # noqa: E731
        x = jnp.arange(4.)
        elsewhere = jax.device_put(x, devices[5])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # device= is deprecated
            for label, kw in (("device=3", {"device": devices[3]}),
                              ("backend=cpu", {"backend": "cpu"})):
                want_compiled = jax.jit(f, **kw).lower(x).compile()
                exe = jaxpr_cc.jit(f, **kw).executable(x)
                path = out_dir / f"{label}.jxe"
                exe.save(str(path))
                loaded = load_executable(str(path))
                for how, run in (("executable", exe), ("loaded", loaded)):
                    for arg_name, arg in (("uncommitted", x), ("on device 5", elsewhere)):
                        got, want = run(arg), want_compiled(arg)
                        where = f"{label} {how} {arg_name}"
                        if got.sharding != want.sharding:
                            problems.append(f"{where}: on {got.sharding}, jax.jit's compiled "
                                            f"call gives {want.sharding}")
                        if not np.array_equal(np.asarray(got), np.asarray(want)):
                            problems.append(f"{where}: value differs from jax.jit's")
        return problems

    def jit_program_compiles_as_jit_places_it():
        # jaxpr_cc.jit(f).program(args) records the arguments' mesh placements
        # (committed arrays, or the jit's in_shardings), so that jaxpr_cc.compile
        # of it, in memory and after save/load, lays them out as jax.jit does.
        import tempfile
        problems = []
        for axis_type in (AxisType.Auto, AxisType.Explicit):
            mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type,) * 2)
            a = jax.device_put(jnp.arange(64.0).reshape(8, 8),
                               jax.sharding.NamedSharding(mesh, P(None, "y")))
            c = jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(mesh, P("y")))
            given = jax.sharding.NamedSharding(mesh, P("x", None))
            host = np.arange(64.0, dtype=np.float32).reshape(8, 8)  # placed by in_shardings
            for label, f, options, arg in (("sum", lambda a: a.sum(0), {}, a),
                                           ("closes over c", lambda a: a * c, {}, a),
                                           ("in_shardings", lambda a: a * c,
                                            {"in_shardings": given}, host)):
                want = jax.jit(f, **options)(arg)
                program = jaxpr_cc.jit(f, **options).program(arg)
                with tempfile.TemporaryDirectory() as tmp:
                    path = f"{tmp}/p.jaxprcc"
                    jaxpr_cc.save(program, path)
                    for how, p in (("in memory", program), ("loaded", jaxpr_cc.load(path))):
                        where = f"{axis_type.name} {label} {how}"
                        try:
                            got = jaxpr_cc.compile(p)(arg)
                        except Exception as e:  # noqa: BLE001 -- reported as a problem
                            problems.append(f"{where}: {type(e).__name__}: {str(e)[:300]}")
                            continue
                        if not np.array_equal(np.asarray(got), np.asarray(want)):
                            problems.append(f"{where}: value differs from jax.jit's")
                        if not got.sharding.is_equivalent_to(want.sharding, want.ndim):
                            problems.append(f"{where}: on {got.sharding}, jax.jit gives "
                                            f"{want.sharding}")
        return problems

    def executable_over_two_meshes_of_the_same_devices_saves():
        # Arguments on a 2-D ('x', 'y') mesh and a 1-D ('d',) mesh over the same
        # 8 devices in the same order: P('d') on one is P(('x', 'y')) on the
        # other, so the executable saves (over one mesh) and its loaded copy
        # gives jax.jit's values on equivalent placements.
        import tempfile
        m2 = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        m1 = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
        a = jax.device_put(jnp.ones(8), jax.sharding.NamedSharding(m2, P(("x", "y"))))
        b = jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(m1, P("d")))

        def g(a, b):
            return a * 2, b + 1
        want = jax.jit(g)(a, b)
        problems = []
        with tempfile.TemporaryDirectory() as tmp:
            try:
                jaxpr_cc.jit(g).executable(a, b).save(f"{tmp}/g.jxe")
                got = load_executable(f"{tmp}/g.jxe")(a, b)
            except Exception as e:  # noqa: BLE001 -- reported as a problem
                return [f"{type(e).__name__}: {str(e)[:300]}"]
        for i, (r, w) in enumerate(zip(got, want)):
            if not np.array_equal(np.asarray(r), np.asarray(w)):
                problems.append(f"output {i}: value differs from jax.jit's")
            if not r.sharding.is_equivalent_to(w.sharding, w.ndim):
                problems.append(f"output {i}: on {r.sharding}, jax.jit gives {w.sharding}")
        return problems

    def executable_with_a_constant_on_another_mesh_lays_out_as_jit():
        # The argument is on an ('x', 'y') mesh and a closed-over array on a
        # ('p', 'q') mesh of the same devices.  jax.jit embeds the constant, so
        # the argument's mesh names the results' layouts.  The executable
        # (in memory and saved) used to put both results on the constant's
        # mesh, replicated (x itself came back P()).
        import tempfile
        mx = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        mp = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("p", "q"),
                               axis_types=(AxisType.Auto,) * 2)
        w = jax.device_put(jnp.arange(64.0).reshape(8, 8), jax.sharding.NamedSharding(mp, P("p")))
        x = jax.device_put(jnp.ones((8, 8)), jax.sharding.NamedSharding(mx, P("x", "y")))

        def g(x):
            return x * 2 + w.sum(), x + w, x
        want = jax.jit(g)(x)
        problems = []
        with tempfile.TemporaryDirectory() as tmp:
            try:
                exe = jaxpr_cc.jit(g).executable(x)
                exe.save(f"{tmp}/g.jxe")
                runs = {"executable": exe(x), "loaded": load_executable(f"{tmp}/g.jxe")(x)}
            except Exception as e:  # noqa: BLE001 -- reported as a problem
                return [f"{type(e).__name__}: {str(e)[:300]}"]
        for label, got in runs.items():
            for i, (r, ref) in enumerate(zip(got, want)):
                if not np.array_equal(np.asarray(r), np.asarray(ref)):
                    problems.append(f"{label} output {i}: value differs from jax.jit's")
                if r.sharding != ref.sharding:
                    problems.append(f"{label} output {i}: on {r.sharding}, jax.jit gives "
                                    f"{ref.sharding}")
        return problems

    def executable_refuses_in_shardings_that_move_a_committed_argument():
        # jax.jit does not move a committed array to another in_sharding: it
        # raises, and so does .executable (its own lowering would otherwise
        # compile silently or fail elsewhere).
        mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        named = jax.sharding.NamedSharding

        def f(d):
            return d["a"] + d["b"]
        in_shardings = ({"a": named(mesh, P("x")), "b": None},)
        problems = []
        for b_spec in (P(), P("y")):
            args = ({"a": jax.device_put(jnp.ones((8, 8)), named(mesh, P())),
                     "b": jax.device_put(jnp.ones((8, 8)), named(mesh, b_spec))},)
            try:
                jax.jit(f, in_shardings=in_shardings).lower(*args)
                return ["jax.jit accepted the placement: the case no longer tests anything"]
            except ValueError as e:
                want = str(e).split("--------------------")[0].strip()
            try:
                jaxpr_cc.jit(f, in_shardings=in_shardings).executable(*args)
                problems.append(f"b on {b_spec}: .executable accepted it")
            except ValueError as e:
                got = str(e).split("--------------------")[0].strip()
                if got != want:
                    problems.append(f"b on {b_spec}: {got!r} != jax.jit's {want!r}")
            except Exception as e:  # noqa: BLE001 -- reported as a problem
                problems.append(f"b on {b_spec}: {type(e).__name__}: {str(e)[:200]}")
        return problems

    def emitted_python_keeps_closed_over_placements():
        # Closed-over arrays laid out on a mesh are emitted laid out so: jax.jit of
        # the emitted function places its result as jax.jit of the original does.
        import importlib.util
        import tempfile
        problems = []
        for axis_type in (AxisType.Auto, AxisType.Explicit):
            mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type,) * 2)
            named = jax.sharding.NamedSharding
            c = jax.device_put(jnp.arange(8.0), named(mesh, P("y")))
            d = jax.device_put(jnp.arange(8.0), named(mesh, P("x")))

            def f(a):
                return c[:, None] * d[None, :] + a
            a = jax.device_put(jnp.ones((8, 8)), named(mesh, P()))
            want = jax.jit(f)(a)
            program = jaxpr_cc.run_passes(jaxpr_cc.trace(f, a), jaxpr_cc.DEFAULT_PIPELINE)
            with tempfile.TemporaryDirectory() as tmp:
                path = f"{tmp}/emitted_{axis_type.name}.py"
                jaxpr_cc.write_python(program, path)
                spec = importlib.util.spec_from_file_location(f"emitted_{axis_type.name}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                got = jax.jit(getattr(module, program.name))(a)
            if not np.array_equal(np.asarray(got), np.asarray(want)):
                problems.append(f"{axis_type.name}: value differs from jax.jit's")
            if not got.sharding.is_equivalent_to(want.sharding, want.ndim):
                problems.append(f"{axis_type.name}: on {got.sharding}, jax.jit gives "
                                f"{want.sharding}")
        return problems

    def saved_executable_keeps_each_shardings_axis_types():
        # in_shardings on an Explicit mesh, out_shardings on an Auto mesh of the
        # same devices (and the reverse): the loaded executable places its output
        # with jax.jit's axis types, so it combines with other arrays as jax.jit's does.
        import tempfile
        named = jax.sharding.NamedSharding
        explicit = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
        auto = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        x = jnp.ones((8, 8))
        problems = []
        for label, (m_in, m_out) in (("explicit in, auto out", (explicit, auto)),
                                     ("auto in, explicit out", (auto, explicit))):
            kw = dict(in_shardings=named(m_in, P("y", "x")), out_shardings=named(m_out, P("x")))
            want = jax.jit(lambda a: a * 2, **kw)(x)
            with tempfile.TemporaryDirectory() as tmp:
                jaxpr_cc.jit(lambda a: a * 2, **kw).executable(x).save(f"{tmp}/e.jxe")
                got = load_executable(f"{tmp}/e.jxe")(x)
            if got.sharding != want.sharding:
                problems.append(f"{label}: on {got.sharding}, jax.jit gives {want.sharding}")
            if not np.array_equal(np.asarray(got), np.asarray(want)):
                problems.append(f"{label}: value differs from jax.jit's")
        return problems

    return {
        "saved_executable_keeps_each_shardings_axis_types":
            saved_executable_keeps_each_shardings_axis_types,
        "emitted_python_keeps_closed_over_placements":
            emitted_python_keeps_closed_over_placements,
        "executable_refuses_in_shardings_that_move_a_committed_argument":
            executable_refuses_in_shardings_that_move_a_committed_argument,
        "executable_over_two_meshes_of_the_same_devices_saves":
            executable_over_two_meshes_of_the_same_devices_saves,
        "executable_with_a_constant_on_another_mesh_lays_out_as_jit":
            executable_with_a_constant_on_another_mesh_lays_out_as_jit,
        "jit_program_compiles_as_jit_places_it": jit_program_compiles_as_jit_places_it,
        "vmap_of_shard_map_custom_vjp_with_constants":
            vmap_of_shard_map_custom_vjp_with_constants,
        "device_executable_kept_through_save_and_load":
            device_executable_kept_through_save_and_load,
    }


CASE_NAMES = ("saved_executable_keeps_each_shardings_axis_types",
              "emitted_python_keeps_closed_over_placements",
              "executable_refuses_in_shardings_that_move_a_committed_argument",
              "executable_over_two_meshes_of_the_same_devices_saves",
              "executable_with_a_constant_on_another_mesh_lays_out_as_jit",
              "jit_program_compiles_as_jit_places_it",
              "vmap_of_shard_map_custom_vjp_with_constants",
              "device_executable_kept_through_save_and_load")


def load_on_one_device(out_dir: Path) -> int:
    """Load the executable saved for device 3 where only device 0 exists."""
    from jaxpr_cc import LoadError
    from jaxpr_cc.backends.xla import load_executable
    try:
        load_executable(str(out_dir / "device=3.jxe"))
        error = None
    except LoadError as e:
        error = str(e)
    except Exception:  # noqa: BLE001 -- reported: the wrong kind of failure
        error = "not a LoadError: " + traceback.format_exc()
    print(json.dumps({"case": "load_on_missing_device", "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[2:] == ["--one-device"]:
        sys.exit(load_on_one_device(Path(sys.argv[1])))
    sys.exit(run_cases(cases(Path(sys.argv[1])), CASE_NAMES))
