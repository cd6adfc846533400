"""Loader for the golden program corpus (``golden/programs/NN_name.py``).

Each corpus file is a small JAX program following a fixed contract:

* ``fun`` -- the function under test;
* ``example_args()`` -- a tuple of concrete positional arguments;
* ``example_kwargs()`` -- optional dict of keyword arguments (held fixed by
  every transformation);
* ``TAGS`` -- tuple of feature tags taken from :data:`TAG_VOCABULARY`;
* ``SUPPORTS`` -- which of ``grad``/``jvp``/``vmap``/``jit`` JAX itself
  supports on ``fun`` with the example arguments;
* ``DEVICES`` -- optional number of devices the program needs (default 1);
* ``GRAD_ARGNUMS`` -- optional positions to differentiate with respect to.

This module depends only on the standard library, numpy and jax.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import sys
import types
from typing import Any, Callable


__all__ = [
    "CorpusError",
    "CorpusProgram",
    "KNOWN_TRANSFORMS",
    "TAG_VOCABULARY",
    "corpus_dir",
    "default_grad_argnums",
    "load_corpus",
    "load_program",
]

#: Transformations a program may claim in ``SUPPORTS``.
KNOWN_TRANSFORMS = frozenset({"grad", "jvp", "vmap", "jit"})

#: Every tag a corpus program may use.  The corpus tests require each tag to
#: be used by at least one program, so this doubles as the coverage checklist.
TAG_VOCABULARY = frozenset({
    # elementwise math
    "elementwise", "integer_pow", "where", "clip",
    # linear algebra
    "dot_general", "matmul", "einsum", "batch_dims",
    # convolution
    "conv", "nchw", "nhwc",
    # indexing
    "gather", "scatter", "dynamic_slice", "dynamic_update_slice",
    "take_along_axis",
    # reductions
    "reduction", "argmax", "cumsum", "logsumexp",
    # control flow
    "cond", "switch", "while_loop", "fori_loop", "scan", "scan_reverse",
    "scan_pytree_carry", "rnn",
    # jit structure
    "nested_jit", "static_argnums",
    # custom differentiation
    "custom_jvp", "custom_jvp_nondiff", "custom_jvp_defjvps",
    "custom_jvp_in_scan",
    "custom_vjp", "custom_vjp_nondiff", "custom_vjp_fn_nondiff",
    "custom_vjp_pytree_residuals", "custom_vjp_in_cond",
    "custom_vjp_reused", "custom_vjp_nested",
    "custom_gradient", "linear_call", "fixed_point",
    "checkpoint", "checkpoint_policy", "stop_gradient",
    # effects
    "debug_print", "debug_callback",
    # randomness
    "prng", "prng_key_arg",
    # dtypes
    "bool", "int8", "int16", "int32", "uint8", "uint32",
    "float16", "bfloat16", "float32", "complex64",
    "bitwise", "shift", "cast",
    # pytrees
    "pytree_in", "pytree_out", "dict", "tuple", "namedtuple",
    "nested_pytree",
    # programs that are themselves transformed functions
    "transformed_grad", "transformed_vmap", "transformed_hessian",
    # model building blocks
    "mlp", "softmax", "layernorm",
    # devices
    "sharding", "shard_map", "multi_device",
    # argument / constant kinds
    "large_constant", "python_scalar", "weak_type", "kwargs",
})

_MODULE_PREFIX = "jaxpr_cc_corpus"


class CorpusError(Exception):
    """A corpus file is missing, fails to import, or breaks the contract."""


@dataclasses.dataclass(frozen=True)
class CorpusProgram:
    name: str
    path: pathlib.Path
    module: types.ModuleType
    fun: Callable[..., Any]
    args: tuple
    kwargs: dict
    tags: tuple
    supports: frozenset
    devices: int
    grad_argnums: tuple

    def __repr__(self) -> str:  # keep pytest ids / failure messages short
        return f"CorpusProgram({self.name!r})"


def corpus_dir() -> pathlib.Path:
    """Directory of the golden programs (``$JAXPR_CC_CORPUS`` overrides)."""
    override = os.environ.get("JAXPR_CC_CORPUS")
    if override:
        return pathlib.Path(override).resolve()
    return pathlib.Path(__file__).resolve().parents[2] / "golden" / "programs"


def _is_inexact_leaf(leaf: Any) -> bool:
    if isinstance(leaf, bool):
        return False
    if isinstance(leaf, (float, complex)):
        return True
    if isinstance(leaf, int):
        return False
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        return False
    import jax

    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return False  # PRNG key arrays
    return bool(jax.numpy.issubdtype(dtype, jax.numpy.inexact))


def default_grad_argnums(args: tuple) -> tuple:
    """Positions of args whose leaves are all inexact (float/complex)."""
    import jax

    out = []
    for i, arg in enumerate(args):
        leaves = jax.tree_util.tree_leaves(arg)
        if leaves and all(_is_inexact_leaf(leaf) for leaf in leaves):
            out.append(i)
    return tuple(out)


def _module_name(path: pathlib.Path) -> str:
    stem = "".join(c if (c.isalnum() or c == "_") else "_" for c in path.stem)
    return f"{_MODULE_PREFIX}.{stem}"


# Each program file is imported once per process (again only if it changed): classes
# it defines, such as namedtuples in its pytrees, must be the same objects for every
# suite that loads the corpus, or their tree structures would not compare equal.
_MODULES: dict[pathlib.Path, tuple[tuple[int, int], types.ModuleType]] = {}


def _import_file(path: pathlib.Path) -> types.ModuleType:
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _MODULES.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    module = _exec_file(path)
    _MODULES[path] = (stamp, module)
    return module


def _exec_file(path: pathlib.Path) -> types.ModuleType:
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CorpusError(f"{path}: cannot create an import spec")
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        if previous is not None:
            sys.modules[name] = previous
        else:
            sys.modules.pop(name, None)
        raise CorpusError(
            f"{path}: failed to import corpus program: "
            f"{type(exc).__name__}: {exc}") from exc
    return module


def load_program(path) -> CorpusProgram:
    """Import one corpus file and validate its contract."""
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise CorpusError(f"{path}: no such corpus file")
    module = _import_file(path)

    def bad(msg: str) -> CorpusError:
        return CorpusError(f"{path}: {msg}")

    fun = getattr(module, "fun", None)
    if not callable(fun):
        raise bad("missing callable `fun`")
    make_args = getattr(module, "example_args", None)
    if not callable(make_args):
        raise bad("missing callable `example_args`")
    try:
        args = make_args()
    except Exception as exc:
        raise bad(f"example_args() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(args, tuple):
        raise bad(f"example_args() must return a tuple, got {type(args).__name__}")
    make_kwargs = getattr(module, "example_kwargs", None)
    kwargs: dict = {}
    if make_kwargs is not None:
        try:
            kwargs = make_kwargs()
        except Exception as exc:
            raise bad(f"example_kwargs() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(kwargs, dict):
            raise bad("example_kwargs() must return a dict")

    import jax

    for leaf in jax.tree_util.tree_leaves((args, kwargs)):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise bad("example arguments must be concrete values, not ShapeDtypeStruct")

    tags = getattr(module, "TAGS", None)
    if not isinstance(tags, tuple) or not all(isinstance(t, str) for t in tags):
        raise bad("TAGS must be a tuple of strings")
    unknown = sorted(set(tags) - TAG_VOCABULARY)
    if unknown:
        raise bad(f"unknown tags {unknown} (see jaxpr_cc.golden.corpus.TAG_VOCABULARY)")
    supports = getattr(module, "SUPPORTS", None)
    if not isinstance(supports, tuple) or not all(isinstance(s, str) for s in supports):
        raise bad("SUPPORTS must be a tuple of strings")
    unknown = sorted(set(supports) - KNOWN_TRANSFORMS)
    if unknown:
        raise bad(f"unknown SUPPORTS entries {unknown}")
    devices = getattr(module, "DEVICES", 1)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise bad("DEVICES must be a positive int")
    grad_argnums = getattr(module, "GRAD_ARGNUMS", None)
    if grad_argnums is None:
        grad_argnums = default_grad_argnums(args)
    else:
        if isinstance(grad_argnums, int):
            grad_argnums = (grad_argnums,)
        grad_argnums = tuple(grad_argnums)
        if not all(isinstance(i, int) and 0 <= i < len(args) for i in grad_argnums):
            raise bad(f"GRAD_ARGNUMS {grad_argnums} out of range for {len(args)} args")

    return CorpusProgram(
        name=path.stem,
        path=path,
        module=module,
        fun=fun,
        args=args,
        kwargs=dict(kwargs),
        tags=tags,
        supports=frozenset(supports),
        devices=devices,
        grad_argnums=grad_argnums,
    )


def load_corpus(directory=None, *, skip_unavailable: bool = False) -> list:
    """Load every ``*.py`` program in ``directory`` (default: :func:`corpus_dir`).

    Programs needing more devices than ``jax.devices()`` provides raise a
    :class:`CorpusError` unless ``skip_unavailable=True``, in which case they
    are left out.
    """
    directory = pathlib.Path(directory) if directory is not None else corpus_dir()
    if not directory.is_dir():
        raise CorpusError(f"{directory}: corpus directory does not exist")
    import jax

    n_devices = len(jax.devices())
    programs = []
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        prog = load_program(path)
        if prog.devices > n_devices:
            if skip_unavailable:
                continue
            raise CorpusError(
                f"{path}: needs {prog.devices} devices but only {n_devices} are "
                "available; set XLA_FLAGS=--xla_force_host_platform_device_count="
                f"{prog.devices} before importing jax, or pass skip_unavailable=True")
        programs.append(prog)
    programs.sort(key=lambda p: p.name)
    return programs
