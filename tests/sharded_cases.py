"""Sharded programs for tests/test_sharded.py, run in fresh processes (the host
device count must be set before JAX is imported).

``python sharded_cases.py single OUT_DIR``
    On 8 host devices, for every case: ``jax.jit`` of the function is the reference;
    the function goes trace -> default pass pipeline -> compile -> save -> load -> run,
    and also ``jaxpr_cc.jit`` -> ``.executable`` -> save -> load -> run; values must
    equal the reference bit for bit and every output keeps the reference's sharding.
    Saves each case's executable and reference outputs in OUT_DIR for the next mode.
    Prints one JSON line per case.

``python sharded_cases.py distributed OUT_DIR PORT PROCESS_ID NUM_PROCESSES``
    One of NUM_PROCESSES ``jax.distributed`` CPU processes (gloo collectives,
    coordinator on 127.0.0.1:PORT) that together have 8 devices: loads each saved
    executable, runs it on global arrays built from the same inputs and checks every
    shard this process holds against the single-process reference.
"""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np

N_DEVICES = 8
CASE_NAMES = ("named_inputs", "sharding_constraint", "shard_map", "jit_in_out_shardings",
              "set_mesh_explicit")


def _inputs():
    rng = np.random.default_rng(0)
    return {
        "a": rng.standard_normal((16, 8)).astype(np.float32),
        "b": rng.standard_normal((8, 12)).astype(np.float32),
        "v": rng.standard_normal((32,)).astype(np.float32),
    }


def cases():
    """name -> (function, argument names, {argument name: PartitionSpec} placement,
    jit keywords, explicit-axes mesh?).  Built lazily: needs jax."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = _mesh(explicit=False)
    table = np.linspace(-1.0, 1.0, 12, dtype=np.float32)  # hoisted into a parameter

    def named_inputs(a, b):
        # Shardings come from the committed arguments only.
        return jnp.tanh(a @ b) + table, jnp.sin(a).sum(axis=1)

    def constraint(a, b):
        h = jax.lax.with_sharding_constraint(a @ b, NamedSharding(mesh, P(None, "y")))
        return jnp.cos(h) * 2.0, jax.lax.with_sharding_constraint(a.T, NamedSharding(mesh,
                                                                                    P("y", "x")))

    def shard_mapped(v):
        def body(block):
            local = jnp.sin(block) * 2.0
            return local, jax.lax.psum(local.sum(), "x")
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P()))(v)

    def with_jit_shardings(a, b):
        return jnp.exp(a) @ b, a * 3.0

    def explicit(a, b):
        # Sharding in types (jax.set_mesh with Explicit axes): a's rows stay split.
        return jnp.sin(a) * 2.0 + 1.0, (a @ b).sum(axis=0)

    rows, cols = P("x", None), P(None, "y")
    return {
        "named_inputs": (named_inputs, ("a", "b"), {"a": P("x", "y"), "b": P()}, {}, False),
        "sharding_constraint": (constraint, ("a", "b"), {"a": rows}, {}, False),
        "shard_map": (shard_mapped, ("v",), {"v": P("x")}, {}, False),
        "jit_in_out_shardings": (
            with_jit_shardings, ("a", "b"), {},
            {"in_shardings": (NamedSharding(mesh, rows), NamedSharding(mesh, P())),
             "out_shardings": (NamedSharding(mesh, cols), NamedSharding(mesh, P("y", "x")))},
            False),
        "set_mesh_explicit": (explicit, ("a", "b"), {"a": rows, "b": P()}, {}, True),
    }


def _mesh(explicit: bool):
    import jax
    types = (jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((4, 2), ("x", "y"), axis_types=types, devices=jax.devices()[:N_DEVICES])


def _place(values: dict, names, placement, mesh):
    """The case's arguments: committed NamedSharding arrays where it places them
    (built shard by shard, so this also works when devices span processes), else
    host arrays."""
    import jax
    from jax.sharding import NamedSharding
    out = []
    for n in names:
        host = values[n]
        if n in placement:
            sharding = NamedSharding(mesh, placement[n])
            out.append(jax.make_array_from_callback(host.shape, sharding, lambda i, h=host: h[i]))
        else:
            out.append(host)
    return out


def _sharding_code(s) -> list:
    return [str(s.spec), sorted(d.id for d in s.device_set)]


def _check_same(out, ref, where: str) -> list:
    import jax
    problems = []
    out_leaves, out_tree = jax.tree.flatten(out)
    ref_leaves, ref_tree = jax.tree.flatten(ref)
    if out_tree != ref_tree:
        return [f"{where}: result structure {out_tree} != {ref_tree}"]
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        if o.shape != r.shape or o.dtype != r.dtype:
            problems.append(f"{where}: output {i} is {o.dtype}{o.shape}, jax.jit's "
                            f"{r.dtype}{r.shape}")
            continue
        if not np.array_equal(np.asarray(o), np.asarray(r)):
            err = float(np.max(np.abs(np.asarray(o, np.float64) - np.asarray(r, np.float64))))
            problems.append(f"{where}: output {i} differs from jax.jit by up to {err:g}")
        if not o.sharding.is_equivalent_to(r.sharding, o.ndim):
            problems.append(f"{where}: output {i} sharding {o.sharding} is not jax.jit's "
                            f"{r.sharding}")
    return problems


def run_single(out_dir: Path) -> int:
    import jax

    import jaxpr_cc
    from jaxpr_cc.backends.xla import load_executable
    from jaxpr_cc.jit_function import default_pipeline
    assert len(jax.devices()) >= N_DEVICES, jax.devices()
    values = _inputs()
    np.savez(out_dir / "inputs.npz", **values)
    failed = 0
    assert tuple(cases()) == CASE_NAMES
    for name, (fun, names, placement, jit_kw, explicit) in cases().items():
        problems: list[str] = []
        try:
            mesh = _mesh(explicit)
            with jax.set_mesh(mesh) if explicit else _no_context():
                args = _place(values, names, placement, mesh)
                ref = jax.jit(fun, **jit_kw)(*args)
                # trace -> passes -> compile -> save -> load -> run
                program = jaxpr_cc.run_passes(jaxpr_cc.trace(fun, *args), default_pipeline())
                in_shardings = jit_kw.get("in_shardings") or tuple(
                    a.sharding if isinstance(a, jax.Array) else None for a in args)
                exe = jaxpr_cc.compile(program, in_shardings=in_shardings,
                                       out_shardings=jit_kw.get("out_shardings"))
                path = out_dir / f"{name}.jxe"
                exe.save(str(path))
                jaxpr_cc.save(program, str(out_dir / f"{name}.jcc"))
                loaded = load_executable(str(path))
                problems += _check_same(exe(*args), ref, "compiled")
                problems += _check_same(loaded(*args), ref, "saved and loaded")
                # jaxpr_cc.jit: called, and its executable saved and loaded
                ours = jaxpr_cc.jit(fun, **jit_kw)
                problems += _check_same(ours(*args), ref, "jaxpr_cc.jit")
                jit_path = out_dir / f"{name}.jit.jxe"
                ours.executable(*args).save(str(jit_path))
                problems += _check_same(load_executable(str(jit_path))(*args), ref,
                                        "jaxpr_cc.jit executable saved and loaded")
                leaves = jax.tree.leaves(ref)
                np.savez(out_dir / f"{name}.expected.npz",
                         **{f"out{i}": np.asarray(x) for i, x in enumerate(leaves)})
                shardings = [_sharding_code(x.sharding) for x in leaves]
                devices = sorted({d.id for x in leaves for d in x.sharding.device_set})
        except Exception:
            problems.append(traceback.format_exc())
            shardings, devices = [], []
        failed += bool(problems)
        print(json.dumps({"case": name, "problems": problems, "out_shardings": shardings,
                          "devices": devices}), flush=True)
    return 1 if failed else 0


class _no_context:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run_distributed(out_dir: Path, port: int, process_id: int, n_processes: int) -> int:
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=n_processes, process_id=process_id,
                               initialization_timeout=120)
    import jaxpr_cc
    from jaxpr_cc.backends.xla import load_executable
    assert jax.process_count() == n_processes and len(jax.devices()) == N_DEVICES, (
        jax.process_count(), jax.devices())
    values = dict(np.load(out_dir / "inputs.npz"))
    failed = 0
    for name, (fun, names, placement, jit_kw, explicit) in cases().items():
        problems: list[str] = []
        reordered: list[str] = []
        checked = 0
        try:
            mesh = _mesh(explicit)
            with jax.set_mesh(mesh) if explicit else _no_context():
                if "in_shardings" in jit_kw:
                    placement = {n: s.spec for n, s in zip(names, jit_kw["in_shardings"])}
                args = _place(values, names, placement, mesh)
                loaded = load_executable(str(out_dir / f"{name}.jxe"))
                out = jax.tree.leaves(loaded(*args))
                # jax.jit of the function in these same processes.
                ref = jax.tree.leaves(jax.jit(fun, **jit_kw)(*args))
                # The saved program (not its executable), loaded and compiled here:
                # its mesh is found among this process's devices.
                program = jaxpr_cc.load(str(out_dir / f"{name}.jcc"))
                exe = jaxpr_cc.compile(
                    program, in_shardings=jit_kw.get("in_shardings") or tuple(
                        a.sharding if isinstance(a, jax.Array) else None for a in args),
                    out_shardings=jit_kw.get("out_shardings"))
                for i, (x, r) in enumerate(zip(jax.tree.leaves(exe(*args)), ref)):
                    want = {s.device.id: np.asarray(s.data) for s in r.addressable_shards}
                    if any(not np.allclose(np.asarray(s.data), want[s.device.id], rtol=1e-6)
                           for s in x.addressable_shards):
                        problems.append(f"loaded program, output {i}: differs from jax.jit's")
            expected = np.load(out_dir / f"{name}.expected.npz")
            for i, (x, r) in enumerate(zip(out, ref)):
                want = expected[f"out{i}"]
                if x.shape != want.shape:
                    problems.append(f"output {i}: shape {x.shape}, one process gave {want.shape}")
                    continue
                if not x.sharding.is_equivalent_to(r.sharding, x.ndim):
                    problems.append(f"output {i}: sharding {x.sharding} is not jax.jit's "
                                    f"{r.sharding}")
                ref_shards = {s.device.id: np.asarray(s.data) for s in r.addressable_shards}
                for shard in x.addressable_shards:
                    checked += 1
                    got = np.asarray(shard.data)
                    if not np.array_equal(got, ref_shards[shard.device.id]):
                        problems.append(f"output {i}: shard {shard.index} on device "
                                        f"{shard.device.id} differs from jax.jit's")
                    if np.array_equal(ref_shards[shard.device.id], want[shard.index]):
                        same_as_one = np.array_equal(got, want[shard.index])
                    else:
                        # jax.jit itself differs from one process here: a reduction
                        # across processes (gloo) adds in another order.  Then the
                        # numbers are jax.jit's (checked above), within 2 ulps of
                        # one process.
                        reordered.append(f"output {i}")
                        same_as_one = np.allclose(got, want[shard.index], rtol=0,
                                                  atol=2 * float(np.max(np.spacing(
                                                      np.abs(want[shard.index])))))
                    if not same_as_one:
                        err = float(np.max(np.abs(got.astype(np.float64) - want[shard.index])))
                        ulp = float(np.max(np.spacing(np.abs(want[shard.index]))))
                        problems.append(f"output {i}: shard {shard.index} on device "
                                        f"{shard.device.id} differs from one process by "
                                        f"{err:g} (ulp {ulp:g})")
        except Exception:
            problems.append(traceback.format_exc())
        failed += bool(problems)
        print(json.dumps({"case": name, "process": process_id, "problems": problems,
                          "shards_checked": checked,
                          "local_devices": [d.id for d in jax.local_devices()],
                          "reduced_across_processes": sorted(set(reordered))}), flush=True)
    jax.distributed.shutdown()
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    mode, out_dir = argv[0], Path(argv[1])
    if mode == "single":
        return run_single(out_dir)
    if mode == "distributed":
        return run_distributed(out_dir, int(argv[2]), int(argv[3]), int(argv[4]))
    raise SystemExit(f"unknown mode {mode!r}: single or distributed")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
