"""XLA backend and ``jaxpr_cc.jit`` against ``jax.jit`` of the original functions.

Prints, measured in this run:

* run time of ``jaxpr_cc.compile``'s executable / ``jax.jit`` of the original, on an
  MLP (3 layers 512 wide, batch 128) and a scan RNN (hidden 256, 100 steps); per
  call, best of alternating blocks (target <= 1.02); "(noise)" is a second
  ``jax.jit`` of the original against the first, the noise floor of the run, and
  "same HLO" says whether XLA's optimized programs are identical (names aside);
* compile time: ``jaxpr_cc.compile(program)`` / ``jax.jit(f).lower(...).compile()``
  (target <= 1.1), and end to end (trace + passes + compile) for information; best
  of several, alternating;
* cached-call overhead on a tiny function: ``jaxpr_cc.jit`` / ``jax.jit``
  (target <= 1.5).

    .venv/bin/python tools/bench_backends.py [--runs 200] [--quick]
"""
from __future__ import annotations

import argparse
import gc
import re
import sys
import time

import jax
import jax.numpy as jnp

import jaxpr_cc
from jaxpr_cc.jit_function import default_pipeline


# ------------------------------------------------------------------ programs
def mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def mlp_args(width=512, batch=128, layers=3):
    keys = jax.random.split(jax.random.key(0), layers + 1)
    params = [(jax.random.normal(k, (width, width), jnp.float32) / width ** 0.5,
               jnp.full((width,), 0.01, jnp.float32)) for k in keys[:layers]]
    x = jax.random.normal(keys[-1], (batch, width), jnp.float32)
    return params, x


def rnn(params, h0, xs):
    def step(h, x):
        h = jnp.tanh(h @ params["w_h"] + x @ params["w_x"] + params["b"])
        return h, h
    h, hs = jax.lax.scan(step, h0, xs)
    return h, jnp.mean(hs, axis=0)


def rnn_args(hidden=256, steps=100, batch=32, features=64):
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    params = {"w_h": jax.random.normal(k1, (hidden, hidden), jnp.float32) / hidden ** 0.5,
              "w_x": jax.random.normal(k2, (features, hidden), jnp.float32) / features ** 0.5,
              "b": jnp.zeros((hidden,), jnp.float32)}
    xs = jax.random.normal(k3, (steps, batch, features), jnp.float32)
    return params, jnp.zeros((batch, hidden), jnp.float32), xs


def tiny(x, y):
    return x * y + 1.0


# ------------------------------------------------------------ same program?
_FRAME_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _canonical_hlo(text: str) -> list[str]:
    """Optimized HLO without what names and source locations change: metadata,
    the stack-frame tables, the module name and the parameters' names."""
    lines, skipping = [], False
    for line in text.splitlines():
        if line.startswith(_FRAME_TABLES):
            skipping = True
            continue
        if skipping:
            skipping = bool(line.strip())
            continue
        lines.append(line)
    text = "\n".join(lines)
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r"^HloModule \S+", "HloModule", text, flags=re.M)
    for name, index in re.findall(r"%([\w.\-]+) = \S+ parameter\((\d+)\)", text):
        text = re.sub(rf"(?<![\w.\-]){re.escape(name)}(?![\w\-])", f"param{index}", text)
    return [line.strip() for line in text.splitlines() if line.strip()]


def same_optimized_hlo(exe, fun, args) -> bool:
    """Whether XLA produced the same optimized program for both (timings on a busy
    machine are noisy; this is not)."""
    ref = jax.jit(fun).lower(*args).compile().as_text()
    return _canonical_hlo(exe.as_text("hlo")) == _canonical_hlo(ref)


# ------------------------------------------------------------------- timing
def _block_times(fn, args, n):
    """Seconds per call over ``n`` calls, the results waited for."""
    jax.block_until_ready(fn(*args))
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / n
    finally:
        gc.enable()


def alternating(fns, args, *, blocks, per_block):
    """Per-call time of each function: the best of ``blocks`` blocks, measured in
    turn so that load from elsewhere on the machine hits all alike (the best block
    is the one least disturbed by it)."""
    times = [[] for _ in fns]
    order = list(range(len(fns)))
    for _ in range(blocks):
        for i in order:
            times[i].append(_block_times(fns[i], args, per_block))
        order = order[1:] + order[:1]  # rotate: no function always runs first
    return [min(t) for t in times]


def compile_times(fun, args, repeat):
    """Best of ``repeat`` (seconds, alternating): jax.jit lower+compile; our
    compile(program); our trace + passes + compile."""
    pipeline = default_pipeline()
    jax_s, ours_s, e2e_s = [], [], []
    for _ in range(repeat):
        fresh = lambda *a: fun(*a)  # noqa: E731  (a new function: no JAX trace cache hit)
        t0 = time.perf_counter()
        jax.jit(fresh).lower(*args).compile()
        jax_s.append(time.perf_counter() - t0)

        fresh = lambda *a: fun(*a)  # noqa: E731
        t0 = time.perf_counter()
        program = jaxpr_cc.trace(fresh, *args)
        if pipeline:
            program = jaxpr_cc.run_passes(program, pipeline)
        t1 = time.perf_counter()
        jaxpr_cc.compile(program)
        t2 = time.perf_counter()
        ours_s.append(t2 - t1)
        e2e_s.append(t2 - t0)
    return min(jax_s), min(ours_s), min(e2e_s)


def call_overhead(blocks, per_block):
    x, y = jnp.ones(3), jnp.ones(3)
    ref, ours = jax.jit(tiny), jaxpr_cc.jit(tiny)
    ref(x, y), ours(x, y)
    ref_t, ours_t = [], []
    for block in range(blocks):
        pairs = ((ref, ref_t), (ours, ours_t))
        for fn, acc in (pairs if block % 2 else pairs[::-1]):
            gc.disable()
            t0 = time.perf_counter()
            for _ in range(per_block):
                fn(x, y)
            acc.append((time.perf_counter() - t0) / per_block)
            gc.enable()
    # Dispatch is asynchronous: the minimum block is the dispatch cost least
    # disturbed by other work on the machine.
    return min(ref_t), min(ours_t)


# --------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400, help="calls per model (split in blocks)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    opts = ap.parse_args()
    blocks = 4 if opts.quick else 20
    repeat = 1 if opts.quick else 5
    per_block = max(1, opts.runs // blocks)
    pipeline = default_pipeline()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, pipeline '{pipeline}'")

    rows = []
    for name, fun, args in (("mlp 3x512, batch 128", mlp, mlp_args()),
                            ("scan rnn h256 x100", rnn, rnn_args())):
        program = jaxpr_cc.trace(fun, *args)
        if pipeline:
            program = jaxpr_cc.run_passes(program, pipeline)
        exe = jaxpr_cc.compile(program)
        # A second, independent jax.jit of the original: its ratio to the first is
        # the measurement's noise floor on this machine.
        ref, control = jax.jit(fun), jax.jit(lambda *a: fun(*a))
        ref_run, ours_run, control_run = alternating((ref, exe, control), args,
                                                     blocks=blocks, per_block=per_block)
        jax_c, ours_c, e2e_c = compile_times(fun, args, repeat)
        same = same_optimized_hlo(exe, fun, args)
        rows.append((name, ref_run, ours_run, control_run, jax_c, ours_c, e2e_c, same))

    print(f"\n{'program':22} {'jax.jit run':>12} {'exe run':>10} {'run ratio':>10} "
          f"{'(noise)':>8}   {'jax compile':>12} {'our compile':>12} {'ratio':>6} "
          f"{'trace+passes+compile':>21}  same HLO")
    for name, ref_run, ours_run, control_run, jax_c, ours_c, e2e_c, same in rows:
        print(f"{name:22} {ref_run * 1e3:10.3f}ms {ours_run * 1e3:8.3f}ms "
              f"{ours_run / ref_run:10.3f} {control_run / ref_run:8.3f}   "
              f"{jax_c * 1e3:10.1f}ms {ours_c * 1e3:10.1f}ms {ours_c / jax_c:6.3f} "
              f"{e2e_c * 1e3:9.1f}ms ({e2e_c / jax_c:.2f}x)  {'yes' if same else 'NO'}")

    ref_call, ours_call = call_overhead(blocks=blocks * 3, per_block=2000)
    print(f"\ncached call of a tiny function: jax.jit {ref_call * 1e6:.2f}us, "
          f"jaxpr_cc.jit {ours_call * 1e6:.2f}us, ratio {ours_call / ref_call:.3f}")
    print("targets: run ratio <= 1.02, compile ratio <= 1.1, cached-call ratio <= 1.5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
