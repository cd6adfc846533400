"""``jaxpr_cc.compile`` of programs traced from sharded arrays, for
tests/test_sharded_compile.py (run in a fresh process: the host device count must
be set before JAX is imported).

``python sharded_compile_cases.py OUT_DIR`` runs every case on 8 host devices and
prints one JSON line per case: ``{"case": name, "problems": [...]}``.  The
reference is always ``jax.jit`` of the same function on the same arguments:
values bit for bit, and every output's sharding.
"""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np


def _check_same(out, ref, where: str) -> list:
    import jax
    out_leaves, out_tree = jax.tree.flatten(out)
    ref_leaves, ref_tree = jax.tree.flatten(ref)
    if out_tree != ref_tree:
        return [f"{where}: result structure {out_tree} != {ref_tree}"]
    problems = []
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        if o.shape != r.shape or o.dtype != r.dtype or not np.array_equal(np.asarray(o),
                                                                            np.asarray(r)):
            problems.append(f"{where}: output {i} differs from jax.jit's")
        if not o.sharding.is_equivalent_to(r.sharding, o.ndim):
            problems.append(f"{where}: output {i} sharding {o.sharding} is not jax.jit's "
                            f"{r.sharding}")
    return problems


def _round_trips(program, args, ref, out_dir: Path, name: str, **compile_kw) -> list:
    """compile -> run; passes -> save -> load -> compile -> run; executable save ->
    load -> run: each must give jax.jit's values and shardings."""
    import jaxpr_cc
    from jaxpr_cc.backends.xla import load_executable
    from jaxpr_cc.jit_function import default_pipeline
    problems = _check_same(jaxpr_cc.compile(program, **compile_kw)(*args), ref, "compiled")
    optimized = jaxpr_cc.run_passes(program, default_pipeline())
    path = out_dir / f"{name}.jxp"
    jaxpr_cc.save(optimized, str(path))
    loaded = jaxpr_cc.load(str(path))
    if loaded.arg_shardings != program.arg_shardings:
        problems.append(f"saved program: arg_shardings {loaded.arg_shardings} != "
                        f"{program.arg_shardings}")
    exe = jaxpr_cc.compile(loaded, **compile_kw)
    problems += _check_same(exe(*args), ref, "passes, saved, loaded, compiled")
    exe_path = out_dir / f"{name}.jxe"
    exe.save(str(exe_path))
    problems += _check_same(load_executable(str(exe_path))(*args), ref,
                            "executable saved and loaded")
    return problems


def cases(out_dir: Path):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import jaxpr_cc

    auto = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    explicit = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((16, 8)).astype(np.float32)
    b_host = rng.standard_normal((8, 4)).astype(np.float32)

    def f(a, b):
        return jnp.sin(a) * 2.0, (a @ b).sum(axis=0), {"t": a.T + 1.0}

    def named_inputs_no_in_shardings():
        a = jax.device_put(a_host, NamedSharding(auto, P("x", "y")))
        b = jax.device_put(b_host, NamedSharding(auto, P(None, "y")))
        program = jaxpr_cc.trace(f, a, b)
        return _round_trips(program, (a, b), jax.jit(f)(a, b), out_dir, "named")

    def traced_under_set_mesh():
        with jax.set_mesh(auto):
            a = jax.device_put(a_host, P("x", None))
            program = jaxpr_cc.trace(f, a, b_host)
            ref = jax.jit(f)(a, b_host)
            problems = _round_trips(program, (a, b_host), ref, out_dir, "set_mesh")
        # ... and compiled after leaving the mesh context
        return problems + _check_same(jaxpr_cc.compile(program)(a, b_host), ref,
                                      "compiled outside set_mesh")

    def explicit_axes_compiled_outside_set_mesh():
        with jax.set_mesh(explicit):
            a = jax.device_put(a_host, P("x", "y"))
            b = jax.device_put(b_host, P())
            program = jaxpr_cc.trace(f, a, b)
            ref = jax.jit(f)(a, b)
        return _round_trips(program, (a, b), ref, out_dir, "explicit")

    def partition_spec_in_shardings_under_set_mesh():
        with jax.set_mesh(auto):
            program = jaxpr_cc.trace(f, a_host, b_host)
            kw = dict(in_shardings=(P("x", None), P()), out_shardings=P("y"))
            ref = jax.jit(f, **kw)(a_host, b_host)
            problems = _round_trips(program, (a_host, b_host), ref, out_dir, "pspec", **kw)
            # a single PartitionSpec for every argument
            one = jaxpr_cc.compile(program, in_shardings=P())(a_host, b_host)
            problems += _check_same(one, jax.jit(f, in_shardings=P())(a_host, b_host),
                                    "in_shardings=P()")
        return problems

    def partition_spec_without_mesh_is_refused():
        program = jaxpr_cc.trace(f, a_host, b_host)
        try:
            jaxpr_cc.compile(program, in_shardings=P("x"))
        except RuntimeError as e:
            text = str(e)
            return [] if "set_mesh" in text and "\n" not in text else [f"message: {text}"]
        return ["a PartitionSpec without a mesh was accepted"]

    def abstract_types_need_a_mesh():
        # A program whose types carry a mesh but no concrete placement: it compiles
        # under jax.set_mesh, and outside says what to do in one line.
        with jax.set_mesh(explicit):
            a = jax.device_put(a_host, P("x", "y"))
            b = jax.device_put(b_host, P())
            program = jaxpr_cc.trace(f, a, b).replace(arg_shardings=None)
            ref = jax.jit(f)(a, b)
            problems = _check_same(jaxpr_cc.compile(program)(a, b), ref, "under set_mesh")
        try:
            jaxpr_cc.compile(program)
            problems.append("compiled without any concrete mesh")
        except ValueError as e:
            if "set_mesh" not in str(e) or "\n" in str(e):
                problems.append(f"message: {e}")
        return problems

    def shape_dtype_structs_with_shardings():
        # Traced from types with placements (as jax.jit(f).lower(*specs) takes them).
        a_s, b_s = NamedSharding(auto, P("x", "y")), NamedSharding(auto, P("y", None))
        specs = (jax.ShapeDtypeStruct(a_host.shape, a_host.dtype, sharding=a_s),
                 jax.ShapeDtypeStruct(b_host.shape, b_host.dtype, sharding=b_s))
        program = jaxpr_cc.trace(f, *specs)
        a, b = jax.device_put(a_host, a_s), jax.device_put(b_host, b_s)
        ref = jax.jit(f).lower(*specs).compile()(a, b)
        return _round_trips(program, (a, b), ref, out_dir, "specs")

    def single_device_arguments_not_pinned():
        # Committed single-device arrays are not recorded (programs stay portable).
        x = jax.device_put(a_host, jax.devices()[3])
        program = jaxpr_cc.trace(lambda v: v * 2.0, x)
        return [] if program.arg_shardings is None else [f"recorded {program.arg_shardings}"]

    return {fn.__name__: fn for fn in (
        named_inputs_no_in_shardings, traced_under_set_mesh,
        explicit_axes_compiled_outside_set_mesh, partition_spec_in_shardings_under_set_mesh,
        partition_spec_without_mesh_is_refused, abstract_types_need_a_mesh,
        shape_dtype_structs_with_shardings, single_device_arguments_not_pinned)}


CASE_NAMES = ("named_inputs_no_in_shardings", "traced_under_set_mesh",
              "explicit_axes_compiled_outside_set_mesh",
              "partition_spec_in_shardings_under_set_mesh",
              "partition_spec_without_mesh_is_refused", "abstract_types_need_a_mesh",
              "shape_dtype_structs_with_shardings", "single_device_arguments_not_pinned")


def load_with_one_device(out_dir: Path) -> int:
    """In a process with one device: the program saved from 8-device arrays loads
    (its argument placement is dropped: those devices are not here) and compiling
    it asks for a mesh in one line."""
    import jax

    import jaxpr_cc
    assert len(jax.devices()) == 1, jax.devices()
    problems = []
    try:
        program = jaxpr_cc.load(str(out_dir / "named.jxp"))
        if program.arg_shardings is not None:
            problems.append(f"arg_shardings {program.arg_shardings} on one device")
        try:
            jaxpr_cc.compile(program)
            problems.append("an 8-device program compiled on one device")
        except ValueError as e:
            if "set_mesh" not in str(e) or "\n" in str(e):
                problems.append(f"message: {e}")
    except Exception:
        problems.append(traceback.format_exc())
    print(json.dumps({"case": "load_with_one_device", "problems": problems}), flush=True)
    return 1 if problems else 0


def main(out_dir: Path) -> int:
    return run_cases(cases(out_dir), CASE_NAMES)


def run_cases(table: dict, names: tuple) -> int:
    """Run each case on 8 devices, printing one JSON line ``{"case", "problems"}``."""
    import jax
    assert len(jax.devices()) >= 8, jax.devices()
    failed = 0
    assert tuple(table) == names
    for name, run in table.items():
        try:
            problems = run()
        except Exception:
            problems = [traceback.format_exc()]
        failed += bool(problems)
        print(json.dumps({"case": name, "problems": problems}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[2:] == ["--one-device"]:
        sys.exit(load_with_one_device(Path(sys.argv[1])))
    sys.exit(main(Path(sys.argv[1])))
