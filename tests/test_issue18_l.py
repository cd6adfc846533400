"""Issue 18 adversary adv18l's findings, each against jax.jit itself: tracebacks and
source locations show the user's frames only; jax.jit's deprecation warnings
survive when it refuses the keywords; jit(f).clear_cache() clears what every
jit(f) uses, also after jax.clear_caches(); `opt --list-passes` refuses other
arguments and --print-ir-before refuses an empty pass name, as -p does."""
import sys
import traceback
import warnings

import jax
import jax.numpy as jnp
import pytest

import jaxpr_cc
from test_cli import one_line_error, run


def _frames_of(jit, f, *args) -> list[str]:
    try:
        jit(f)(*args)
    except TypeError as e:
        return [frame.filename for frame in traceback.extract_tb(e.__traceback__)]
    raise AssertionError("no error raised")


def test_a_traceback_shows_the_users_frames_as_jax_jit_does():
    def f(x):
        return jnp.dot(x, jnp.ones(4))  # a shape error raised while tracing
    ours = _frames_of(jaxpr_cc.jit, f, jnp.ones(3))
    assert not [p for p in ours if "jaxpr_cc" in p], ours
    assert ours == _frames_of(jax.jit, f, jnp.ones(3))


def test_debug_info_locations_name_the_users_frames():
    def f(x):
        return jnp.sin(x) * 2

    def stack_files(jit):
        text = jit(f).lower(jnp.ones(3)).as_text(debug_info=True)
        return sorted({part for line in text.splitlines() if line.startswith("#loc")
                       for part in line.split('"') if part.endswith(".py")})
    ours = stack_files(jaxpr_cc.jit)
    assert not [p for p in ours if "jaxpr_cc" in p], ours
    assert ours == stack_files(jax.jit)


def test_deprecation_warnings_survive_a_refusal():
    def caught(jit):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            with pytest.raises(ValueError) as e:
                jit(lambda a: a, device=jax.devices()[0], backend="cpu")
        return [(w.category, str(w.message)) for w in got], str(e.value)
    assert caught(jaxpr_cc.jit) == caught(jax.jit)


def test_clear_cache_of_one_jit_clears_every_jit_of_the_function():
    def ran(jit):
        scale = {"k": 1.0}

        def f(a):
            return a * scale["k"]
        g = jit(f)
        g(1.0)
        jax.clear_caches()
        h = jit(f)
        before = float(h.lower(1.0).compile()(1.0))
        scale["k"] = 2.0
        g.clear_cache()
        return before, float(h.lower(1.0).compile()(1.0))
    assert ran(jaxpr_cc.jit) == ran(jax.jit) == (1.0, 2.0)


def test_opt_list_passes_refuses_other_arguments(tmp_path):
    (tmp_path / "m.py").write_text("def f(x):\n    return x * 2\n")
    run("trace", "m.py:f", "--args", "f32[3]", "-o", "p.jcc", cwd=tmp_path)
    proc = run("opt", "p.jcc", "-p", "cse", "-o", "o.jcc", "--list-passes", cwd=tmp_path,
               check_code=2)
    assert "--list-passes" in one_line_error(proc)
    assert not (tmp_path / "o.jcc").exists()
    proc = run("opt", "p.jcc", "-p", "cse", "--print-ir-before", "cse,", cwd=tmp_path,
               check_code=2)
    assert "empty pass name" in one_line_error(proc)
