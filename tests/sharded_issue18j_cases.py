"""Multi-device cases from issue 18's adversary adv18j, for tests/test_issue18_j.py
(run in a fresh process: the host device count must be set before JAX is imported).

``python sharded_issue18j_cases.py OUT_DIR`` (8 devices) prints one JSON line per
case: ``{"case": name, "problems": [...]}``.  References: ``jax.jit`` (values,
output shardings, whether it runs at all).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sharded_compile_cases import run_cases


def cases(out_dir: Path):
    import jax
    import jax.numpy as jnp
    from jax.experimental.layout import Format, Layout
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    import jaxpr_cc
    from jaxpr_cc.backends.xla import load_executable

    auto2 = (AxisType.Auto,) * 2
    mesh8 = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))

    def compare(label, got, want, problems, exact_sharding=True):
        for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
            if not np.array_equal(np.asarray(g), np.asarray(w)):
                problems.append(f"{label} output {i}: value differs from jax.jit's")
            same = (g.sharding == w.sharding if exact_sharding
                    else g.sharding.is_equivalent_to(w.sharding, w.ndim))
            if not same:
                problems.append(f"{label} output {i}: on {g.sharding}, jax.jit gives {w.sharding}")

    def runs(label, thunk, problems):
        try:
            return thunk()
        except Exception as e:  # noqa: BLE001 -- reported as a problem
            problems.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            return None

    def program_on_another_mesh_is_refused_in_one_line():
        # The program's equations are typed on mesh A (a value on a mesh has it in
        # its JAX type; jax.jit traces again for another).  Called on mesh B of
        # the same devices it used to crash (IndivisibleError, "compiled for input
        # shardings that disagree") or return a GSPMDSharding.
        problems = []
        mesh_a = jax.make_mesh((4, 2), ("x", "y"), axis_types=auto2)
        mesh_b = jax.make_mesh((2, 4), ("a", "b"), axis_types=auto2)
        data = jnp.arange(64.0).reshape(8, 8)
        xa = jax.device_put(data, NamedSharding(mesh_a, P("x", "y")))
        xb = jax.device_put(data, NamedSharding(mesh_b, P("b")))

        def f(x):
            return jnp.cumsum(x, 0)
        for traced, other in ((xa, xb), (xb, xa)):
            program = jaxpr_cc.trace(f, traced)
            compare("program on its own mesh", program(traced), jax.jit(f)(traced), problems)
            path = str(out_dir / "other_mesh.jcc")
            jaxpr_cc.save(program, path)
            for label, thunk in (
                    ("program call", lambda: program(other)),
                    ("jax.jit(program)", lambda: jax.jit(program)(other)),
                    ("jax.grad of program", lambda: jax.grad(lambda v: program(v).sum())(other)),
                    ("compile(program)", lambda: jaxpr_cc.compile(program)(other)),
                    ("compile(load(saved))", lambda: jaxpr_cc.compile(jaxpr_cc.load(path))(other))):
                try:
                    thunk()
                    problems.append(f"{label}: ran on another mesh than traced")
                except TypeError as e:
                    text = str(e)
                    if len(text.splitlines()) != 1 or "on mesh ('" not in text \
                            or "trace the function again" not in text:
                        problems.append(f"{label}: unclear TypeError: {text[:300]}")
                except Exception as e:  # noqa: BLE001 -- the wrong kind of failure
                    problems.append(f"{label}: {type(e).__name__}: {str(e)[:200]}")
        return problems

    def constant_on_other_devices_than_the_arguments():
        # jax.jit embeds closed-over constants, so one committed to device 0, or
        # sharded over all 8 devices while the argument sits on 4 of them, never
        # decides where the computation runs.  hoist-consts makes them bound
        # parameters: read replicated where the arguments are.
        problems = []
        c0 = jax.device_put(jnp.arange(8.0), jax.devices()[0])
        x8 = jax.device_put(jnp.ones(8), NamedSharding(mesh8, P("x")))
        c8 = jax.device_put(jnp.arange(8.0), NamedSharding(mesh8, P("x")))
        mesh4 = Mesh(np.array(jax.devices()[:4]), ("z",), axis_types=(AxisType.Auto,))
        x4 = jax.device_put(jnp.ones(8), NamedSharding(mesh4, P("z")))
        for name, f, x in (("one-device constant", lambda v: v * 2 + c0, x8),
                           ("8-device constant, 4-device argument", lambda v: v + c8, x4)):
            want = jax.jit(f)(x)
            program = jaxpr_cc.run_passes(jaxpr_cc.trace(f, x), jaxpr_cc.DEFAULT_PIPELINE)
            path = str(out_dir / "const.jcc")
            jaxpr_cc.save(program, path)
            for label, thunk in (
                    ("executable", lambda: jaxpr_cc.jit(f).executable(x)(x)),
                    ("compile", lambda: jaxpr_cc.compile(program)(x)),
                    ("compile(load(saved))", lambda: jaxpr_cc.compile(jaxpr_cc.load(path))(x)),
                    ("program call", lambda: program(x))):
                got = runs(f"{name}, {label}", thunk, problems)
                if got is not None:
                    compare(f"{name}, {label}", got, want, problems)
        return problems

    def executable_takes_format_in_shardings():
        # jax.jit takes Format(layout, sharding) in in_shardings; .executable
        # refused it ("entries must be jax.sharding.Sharding").
        problems = []
        mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=auto2)
        xn = np.arange(64.0, dtype=np.float32).reshape(8, 8)

        def f(x):
            return x.T * 2
        for layout in (Layout.AUTO, Layout(major_to_minor=(1, 0))):
            fmt = Format(layout, NamedSharding(mesh, P("x", "y")))
            want = jax.jit(f, in_shardings=fmt)(xn)
            exe = runs(f"executable, {layout}",
                       lambda: jaxpr_cc.jit(f, in_shardings=fmt).executable(xn), problems)
            if exe is None:
                continue
            compare(f"executable, {layout}", exe(xn), want, problems)
            path = str(out_dir / "format.jxe")
            exe.save(path)
            compare(f"loaded, {layout}", load_executable(path)(xn), want, problems)
        return problems

    def compile_with_out_shardings_follows_committed_arguments():
        # jax.jit(f, out_shardings=...) without in_shardings reads committed
        # arguments where they are; compile(program, out_shardings=...) refused
        # them ("compiled for input shardings that disagree").
        problems = []
        mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=auto2)

        def f(x):
            return x + 1, x.sum(0)
        xn = np.arange(64.0, dtype=np.float32).reshape(8, 8)
        program = jaxpr_cc.trace(f, xn)
        x = jax.device_put(xn, NamedSharding(mesh, P("x")))
        for outs in (NamedSharding(mesh, P("y")), (None, NamedSharding(mesh, P("y")))):
            got = runs(f"out_shardings={outs}",
                       lambda: jaxpr_cc.compile(program, out_shardings=outs)(x), problems)
            if got is not None:
                compare(f"out_shardings={outs}", got, jax.jit(f, out_shardings=outs)(x),
                        problems)
        return problems

    def program_call_places_constant_results_as_jit():
        # Evaluated equation by equation, results that read no argument sat where
        # they were made (the default device, a closed-over array's own sharding);
        # jax.jit makes them replicated copies where the arguments are, or on the
        # default device when it reads no argument.
        problems = []
        mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=auto2)
        x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("x", "y")))
        c = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
        functions = {"numpy constant": lambda x: (x, np.arange(3.0)),
                     "Python scalar": lambda x: (x, 3.0),
                     "closed-over sharded array": lambda x: (x, c),
                     "jnp constant": lambda x: (x, jnp.arange(3)),
                     "only a closed-over array": lambda x: c,
                     "only a Python int": lambda x: 7}
        for name, f in functions.items():
            got = runs(name, lambda: jaxpr_cc.trace(f, x)(x), problems)
            if got is not None:
                compare(name, got, jax.jit(f)(x), problems)
        return problems

    def emitted_python_runs_under_the_context_mesh():
        # emit_python spelled abstract meshes without their abstract device
        # (kind, platform), so jax.jit of the emitted function failed where JAX
        # compares them with the context mesh (adv18m): shard_map without mesh= on
        # an Auto mesh, reshard on an Explicit one.
        problems = []
        for kind in (AxisType.Auto, AxisType.Explicit):
            mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(kind,) * 2)
            x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("x", "y")))
            if kind == AxisType.Auto:
                def f(x):
                    return jax.shard_map(lambda a: a * 2, in_specs=P("x", "y"),
                                         out_specs=P("x", "y"))(x)
            else:
                def f(x):
                    return jax.sharding.reshard(x, P("y", None)).sum(axis=0)
            with jax.set_mesh(mesh):
                want = jax.jit(f)(x)
                namespace = {}
                exec(compile(jaxpr_cc.emit_python(jaxpr_cc.trace(f, x)), "emitted", "exec"),
                     namespace)
                got = runs(f"{kind} emitted under jax.jit", lambda: jax.jit(namespace["f"])(x),
                           problems)
                if got is not None:
                    compare(f"{kind} emitted", got, want, problems)
        return problems

    def loaded_program_places_numpy_arguments_as_traced():
        # Traced under jax.set_mesh from sharded arguments, with a sharding
        # constraint named by a PartitionSpec; loaded and called with a NumPy
        # array outside set_mesh, the program call raised JAX's internal "must be
        # a NamedSharding" TypeError (adv18m).  It now places the argument as
        # traced, as jaxpr_cc.compile does; the reference is jax.jit under the mesh.
        problems = []
        mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=auto2)

        def h(x):
            return jax.lax.with_sharding_constraint(x * 2, P("y", None))
        xs = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("x", "y")))
        path = str(out_dir / "nomesh.jcc")
        with jax.set_mesh(mesh):
            jaxpr_cc.save(jaxpr_cc.trace(h, xs), path)
            want = jax.jit(h)(xs)
        loaded = jaxpr_cc.load(path)
        xn = np.ones((8, 8), np.float32)
        for label, thunk in (("program call", lambda: loaded(xn)),
                             ("compile", lambda: jaxpr_cc.compile(loaded)(xn))):
            got = runs(label, thunk, problems)
            if got is not None:
                compare(label, got, want, problems, exact_sharding=False)
        return problems

    return {
        "loaded_program_places_numpy_arguments_as_traced":
            loaded_program_places_numpy_arguments_as_traced,
        "emitted_python_runs_under_the_context_mesh": emitted_python_runs_under_the_context_mesh,
        "program_on_another_mesh_is_refused_in_one_line":
            program_on_another_mesh_is_refused_in_one_line,
        "constant_on_other_devices_than_the_arguments":
            constant_on_other_devices_than_the_arguments,
        "executable_takes_format_in_shardings": executable_takes_format_in_shardings,
        "compile_with_out_shardings_follows_committed_arguments":
            compile_with_out_shardings_follows_committed_arguments,
        "program_call_places_constant_results_as_jit":
            program_call_places_constant_results_as_jit,
    }


CASE_NAMES = ("loaded_program_places_numpy_arguments_as_traced",
              "emitted_python_runs_under_the_context_mesh",
              "program_on_another_mesh_is_refused_in_one_line",
              "constant_on_other_devices_than_the_arguments",
              "executable_takes_format_in_shardings",
              "compile_with_out_shardings_follows_committed_arguments",
              "program_call_places_constant_results_as_jit")


if __name__ == "__main__":
    sys.exit(run_cases(cases(Path(sys.argv[1])), CASE_NAMES))
