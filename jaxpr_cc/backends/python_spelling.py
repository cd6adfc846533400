"""Python source spellings of the data a program holds: literals, parameters, arrays.

Each spelling evaluates, in an emitted module (``import jax``, ``import jax.numpy as
jnp``, ``from jax import lax``, ``import numpy as np``, ``P = PartitionSpec``), to a
value equal to the original.  Values with no faithful source form raise
:class:`SpellingError`, which callers turn into a message naming the primitive and
the parameter.
"""
from __future__ import annotations

import enum
import functools
import math
import sys
import types
from typing import Any

import numpy as np

import jax
import jax.extend.core
from jax import lax

from ..ir import library_refs, param_types
from ..ir.arrays import to_numpy


class SpellingError(ValueError):
    """A value has no Python source spelling."""


# ----------------------------------------------------------------- dtypes
_NUMPY_DTYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
})


def dtype_source(dtype) -> str:
    """``np.float32`` / ``jnp.bfloat16``: a scalar type accepted wherever JAX takes a dtype."""
    d = np.dtype(dtype)
    if d.name in _NUMPY_DTYPES:
        return "np.bool_" if d.name == "bool" else f"np.{d.name}"
    if hasattr(jax.numpy, d.name):  # ml_dtypes types JAX re-exports (bfloat16, float8_*...)
        return f"jnp.{d.name}"
    raise SpellingError(f"dtype {d} has no jax.numpy spelling")


def dtype_object_source(dtype) -> str:
    """``np.dtype("float32")``: an actual dtype object, as primitive parameters hold."""
    d = np.dtype(dtype)
    if d.name in _NUMPY_DTYPES:
        return f"np.dtype({d.name!r})"
    if hasattr(jax.numpy, d.name):
        return f"jnp.dtype({d.name!r})"
    raise SpellingError(f"dtype {d} has no jax.numpy spelling")


def is_dtype(value: Any) -> bool:
    if isinstance(value, np.dtype):
        return True
    return isinstance(value, type) and issubclass(value, np.generic)


# ---------------------------------------------------------------- scalars
_CANONICAL_NAN_BITS = int(np.array(np.nan, np.float64).view(np.uint64))


def float_source(x: float) -> str:
    if math.isnan(x):
        bits = int(np.array(x, np.float64).view(np.uint64))
        if bits == _CANONICAL_NAN_BITS:
            return "np.nan"
        # A NaN's sign and payload are data (copysign, signbit, bitcasts read them);
        # narrowing this double to the literal's dtype keeps them.
        return f"float(np.uint64({bits:#x}).view(np.float64))"
    if math.isinf(x):
        return "np.inf" if x > 0 else "-np.inf"
    return repr(float(x))


def python_scalar_source(x: Any) -> str:
    """Source for a Python/numpy scalar as a plain Python number (no dtype)."""
    if isinstance(x, (bool, np.bool_)):
        return repr(bool(x))
    if isinstance(x, (int, np.integer)):
        return repr(int(x))
    if isinstance(x, (complex, np.complexfloating)):
        c = complex(x)
        return f"complex({float_source(c.real)}, {float_source(c.imag)})"
    return float_source(float(x))


# Dtypes a weakly typed Python scalar takes when it stands alone (x64 disabled).
_WEAK_DEFAULTS = {bool: "bool", int: "int32", float: "float32", complex: "complex64"}


def literal_source(val: Any, aval) -> str:
    """A literal that JAX stages as the same ``Literal`` (value, dtype, weak type).

    Weakly typed literals are spelled as Python numbers (JAX gives them the dtype of
    the operand they meet, as the original program did); strongly typed ones as numpy
    scalars of their dtype.
    """
    dtype = np.dtype(aval.dtype)
    if dtype == jax.dtypes.float0:
        # The tangent of an integer value (a staged jvp's output): it holds no data.
        return f"np.zeros({tuple(np.shape(val))!r}, jax.dtypes.float0)"
    if np.ndim(val):
        # An array a trace lifted to a constant and a pass wrote back in place.
        return array_literal_source(np.asarray(val, dtype))
    scalar = np.asarray(val).reshape(()).item() if not isinstance(val, (bool, int, float, complex)) \
        else val
    if dtype == np.bool_:
        return repr(bool(scalar))
    if getattr(aval, "weak_type", False):
        return python_scalar_source(scalar)
    return f"{dtype_source(dtype)}({python_scalar_source(scalar)})"


# ----------------------------------------------------------------- arrays
def array_literal_source(x: Any) -> str:
    """``np.array([...], dtype=np.float32).reshape((2, 3))`` (exact for every element)."""
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(x))
        return f"jax.random.wrap_key_data({array_literal_source(jax.random.key_data(x))}, impl={impl!r})"
    a = to_numpy(x)
    dtype = np.dtype(getattr(x, "dtype", a.dtype))
    if _odd_nans(a, dtype):
        # Through a double a signalling NaN comes back quiet: spell the bits.
        bits = a.view(np.dtype(f"uint{dtype.itemsize * 8}"))
        body = "[" + ", ".join(str(int(b)) for b in bits.reshape(-1)) + "]" if a.ndim \
            else str(int(bits))
        src = f"np.array({body}, dtype=np.{bits.dtype.name}).view({dtype_source(dtype)})"
    else:
        flat = [python_scalar_source(v) for v in a.reshape(-1).tolist()] \
            if dtype.name in _NUMPY_DTYPES \
            else [python_scalar_source(float(v)) for v in a.reshape(-1).astype(np.float64).tolist()]
        body = "[" + ", ".join(flat) + "]" if a.ndim else flat[0]
        src = f"np.array({body}, dtype={dtype_source(dtype)})"
    if a.ndim > 1 or (a.ndim == 1 and a.size == 0):
        src += f".reshape({tuple(a.shape)!r})"
    return src


def _odd_nans(a: np.ndarray, dtype) -> bool:
    """Does the real floating array ``a`` hold a signalling NaN?  Spelled as a
    double, which is narrowed to ``dtype``, it would come back quiet."""
    if dtype.kind != "f" and dtype.name != "bfloat16":
        return False
    if not np.any(np.isnan(a)):
        return False
    uint = np.dtype(f"uint{dtype.itemsize * 8}")
    quiet_bit = int(np.array(np.nan, dtype).view(uint)) & ~int(np.array(np.inf, dtype).view(uint))
    return bool(np.any(np.isnan(a) & ((a.view(uint) & quiet_bit) == 0)))


def sidecar_array(x: Any) -> tuple[np.ndarray, str]:
    """What to store in the ``.npz`` for ``x`` and the suffix that restores it.

    ``np.savez`` keeps only numpy's own dtypes; others (bfloat16...) are stored as
    their bits and viewed back; PRNG keys as their key data and re-wrapped.
    """
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(x))
        data, suffix = sidecar_array(jax.random.key_data(x))
        return data, f"{suffix}|wrap:{impl}"
    a = np.ascontiguousarray(to_numpy(x))
    dtype = np.dtype(getattr(x, "dtype", a.dtype))
    if dtype.name in _NUMPY_DTYPES:
        return a, ""
    bits = np.dtype(f"uint{dtype.itemsize * 8}")
    return a.view(bits), f".view({dtype_source(dtype)})"


def restore_expression(load: str, suffix: str) -> str:
    """Apply the restore suffix of :func:`sidecar_array` to the expression ``load``."""
    view, _, wrap = suffix.partition("|wrap:")
    expr = load + view
    if wrap:
        expr = f"jax.random.wrap_key_data({expr}, impl={wrap!r})"
    return expr


# ------------------------------------------------------------- parameters
class _Speller:
    """The context spelling aspects recurse through (``ir.param_types``)."""
    __slots__ = ("dtype_objects", "held_jaxpr", "shared")

    def __init__(self, dtype_objects: bool, held_jaxpr=None, shared=None):
        self.dtype_objects = dtype_objects
        self.held_jaxpr = held_jaxpr  # the emitter's writer of a jaxpr held as data
        self.shared = shared  # the emitter's binder of one object used in several places

    def share(self, value: Any, source: str) -> str:
        """``source`` for ``value``, an object compared by identity: the emitter binds it
        once, so every use is the same object, as in the traced program."""
        return source if self.shared is None else self.shared(value, source)

    def spell(self, value: Any) -> str:
        entry = param_types.entry_for(value)
        if entry.spell is None:
            t = type(value)
            if isinstance(value, tuple) and hasattr(value, "_fields"):
                raise SpellingError(f"named tuple {t.__qualname__} has no spelling")
            why = f" ({entry.cannot_spell})" if entry.cannot_spell else ""
            raise SpellingError(f"value of type {t.__module__}.{t.__qualname__} has no Python "
                                f"source spelling{why}")
        return entry.spell(value, self)


_SPELLERS = (_Speller(False), _Speller(True))


def param_source(value: Any, *, dtype_objects: bool = False, held_jaxpr=None,
                 shared=None) -> str:
    """Source for a primitive parameter value, through the spelling aspect of its entry
    in the parameter-type registry.

    ``dtype_objects`` spells dtypes as ``np.dtype(...)`` objects (what ``bind``
    needs) rather than scalar types (what the ``lax`` functions take).  ``held_jaxpr``
    writes a jaxpr a parameter holds as data (a library primitive's) and returns the
    expression that stages it again.
    """
    if held_jaxpr is not None or shared is not None:
        return _Speller(bool(dtype_objects), held_jaxpr, shared).spell(value)
    return _SPELLERS[bool(dtype_objects)].spell(value)


def _spell_held_jaxpr(value, sp) -> str:
    if sp.held_jaxpr is None:
        raise SpellingError("a jaxpr held as data is written by the emitter of the equation "
                            "that holds it")
    return sp.held_jaxpr(value)


def _spell_repr(value, sp) -> str:
    return repr(value)


def _spell_number(value, sp) -> str:
    return python_scalar_source(value)


def _spell_numpy_scalar(value, sp) -> str:
    if isinstance(value, (np.integer, np.bool_)):
        return python_scalar_source(value)  # JAX treats integer params by value
    return f"{dtype_source(value.dtype)}({python_scalar_source(value)})"


def _spell_dtype(value, sp) -> str:
    return dtype_object_source(value) if sp.dtype_objects else dtype_source(value)


def _spell_dtype_like(value, sp) -> str:
    if hasattr(value, "dtype") and type(value).__name__.endswith("DType"):
        return _spell_dtype(value, sp)
    raise SpellingError(f"value of type {type(value).__module__}.{type(value).__qualname__} "
                        f"has no Python source spelling")


def _spell_lax_named_tuple(qualified: str):
    def spell(value, sp) -> str:
        inner = ", ".join(f"{f}={param_source(getattr(value, f))}" for f in value._fields)
        return f"{qualified}({inner})"
    return spell


def _spell_partition_spec(value, sp) -> str:
    parts = ", ".join(sp.spell(p) if not isinstance(p, tuple) else
                      "(" + ", ".join(map(repr, p)) + ("," if len(p) == 1 else "") + ")"
                      for p in value)
    extra = ""
    unreduced = getattr(value, "unreduced", None)
    if unreduced:
        extra += f"{', ' if parts else ''}unreduced={sp.spell(frozenset(unreduced))}"
    return f"P({parts}{extra})"


def _spell_named_sharding(value, sp) -> str:
    kind = "" if value.memory_kind in (None, "device") else f", memory_kind={value.memory_kind!r}"
    return f"jax.sharding.NamedSharding({mesh_source(value.mesh)}, {sp.spell(value.spec)}{kind})"


def _spell_set(value, sp) -> str:
    items = sorted(sp.spell(v) for v in value)
    return "frozenset({" + ", ".join(items) + "})" if items else "frozenset()"


def _spell_prng_impl(value, sp) -> str:
    from ..jax_adapter import prng_impl_by_name
    if prng_impl_by_name(value.name) is not value:
        raise SpellingError(f"PRNG implementation {value.name!r} is not registered with JAX "
                            f"under that name")
    return f"_prng_impl({value.name!r})"


def _spell_tuple(value, sp) -> str:
    inner = ", ".join(sp.spell(v) for v in value)
    return f"({inner}{',' if len(value) == 1 else ''})"


def _spell_list(value, sp) -> str:
    return "[" + ", ".join(sp.spell(v) for v in value) + "]"


def _spell_dict(value, sp) -> str:
    return "{" + ", ".join(f"{sp.spell(k)}: {sp.spell(v)}" for k, v in value.items()) + "}"


def _spell_ragged(value, sp) -> str:
    return (f"lax.RaggedDotDimensionNumbers(dot_dimension_numbers="
            f"{sp.spell(value.dot_dimension_numbers)}, lhs_ragged_dimensions="
            f"{sp.spell(value.lhs_ragged_dimensions)}, rhs_group_dimensions="
            f"{sp.spell(value.rhs_group_dimensions)})")


def _spell_tolerance(value, sp) -> str:
    return f"lax.Tolerance(atol={sp.spell(value.atol)}, rtol={sp.spell(value.rtol)}, " \
           f"ulps={sp.spell(value.ulps)})"


def _library_reference_source(value) -> str:
    ref = library_refs.reference(value)
    src = f"_import_callable({ref[0]!r}, {ref[1]!r}, None)"
    return f"type({src})" if len(ref) == 3 else src


def _spell_library_object(value, sp) -> str:
    """The default rule: an object of a numerical library by name (identity kept), else
    its class and fields (``ir.library_refs``)."""
    try:
        return _library_reference_source(value)
    except library_refs.NotReachable:
        pass
    state = library_refs.instance_state(value)
    if state is None:
        t = type(value)
        raise SpellingError(f"value of type {t.__module__}.{t.__qualname__} has no Python "
                            f"source spelling")
    try:
        cls = _library_reference_source(type(value))
    except library_refs.NotReachable as e:
        raise SpellingError(str(e)) from None
    fields = ", ".join(f"{k!r}: {sp.spell(v)}" for k, v in state.items())
    return sp.share(value, f"_library_instance({cls}, {{{fields}}})")


def _spell_library_class(value, sp) -> str:
    if issubclass(value, np.generic):
        return _spell_dtype(value, sp)
    try:
        return _library_reference_source(value)
    except library_refs.NotReachable:
        raise SpellingError(f"the class {value.__qualname__} has no Python source "
                            f"spelling") from None


def library_primitive_source(prim) -> str | None:
    """``_import_callable(module, name, None)`` for a primitive a numerical library
    (``ir.library_refs``) defines, found by identity among the libraries' module
    attributes (an index kept by ``library_refs``); None for JAX's own primitives."""
    if not any(library_refs.in_library(name) for name in sys.modules):
        return None
    if id(prim) in _jax_primitive_ids():  # JAX's own, even if a library re-exports it
        return None
    try:
        module, name = library_refs.reference(prim)[:2]
    except library_refs.NotReachable:
        return None
    return f"_import_callable({module!r}, {name!r}, None)"


_JAX_PRIMITIVE_IDS: set[int] = set()


def _jax_primitive_ids() -> set[int]:
    if not _JAX_PRIMITIVE_IDS:
        from ..jax_adapter import primitives_registry
        _JAX_PRIMITIVE_IDS.update(id(p) for found in primitives_registry().values() for p in found)
    return _JAX_PRIMITIVE_IDS


def _spell_primitive(value, sp) -> str:
    """A primitive parameter (equinox's vprim holds the primitive it batches): a
    library's by name, JAX's from its registry."""
    return library_primitive_source(value) or f"_primitive({value.name!r})"


def _spell_sentinel(value, sp) -> str:
    from ..jax_adapter import JAX_SENTINELS, jax_sentinel_name
    name = jax_sentinel_name(value)
    if name is None:  # a library's marker (equinox's), as any library object
        return _spell_library_object(value, sp)
    module, attribute, _ = JAX_SENTINELS[name]
    return f"_import_callable({module!r}, {attribute!r}, None)"


def _spell_function(value, sp) -> str:
    try:
        return _library_reference_source(value)
    except library_refs.NotReachable as e:
        raise SpellingError(f"the Python callable {getattr(value, '__qualname__', value)} is "
                            f"code, not data ({e})") from None


def _spell_partial(value, sp) -> str:
    return sp.share(value, f"_partial({sp.spell(value.func)}, {sp.spell(tuple(value.args))}, "
                           f"{sp.spell(dict(value.keywords))})")


_BUILTIN_NODES = {tuple: "tuple", list: "list", dict: "dict", type(None): "type(None)"}


def _spell_treedef(value, sp) -> str:
    def node(treedef) -> str:
        data = treedef.node_data()
        if data is None:
            return "'*'"
        node_type, aux = data
        head = _BUILTIN_NODES.get(node_type)
        if head is None:
            try:
                head = _library_reference_source(node_type)
            except library_refs.NotReachable as e:
                raise SpellingError(f"pytree node {node_type.__qualname__}: {e}") from None
        children = "".join(node(c) + ", " for c in treedef.children())
        return f"({head}, {sp.spell(aux)}, ({children}))"
    return f"_treedef({node(value)})"


def _spell_shape_dtype_struct(value, sp) -> str:
    if getattr(value, "sharding", None) is not None:
        raise SpellingError("a ShapeDtypeStruct with a sharding has no spelling")
    return (f"jax.ShapeDtypeStruct({tuple(value.shape)!r}, {dtype_object_source(value.dtype)}, "
            f"weak_type={bool(value.weak_type)!r})")


def _register_spellings() -> None:
    from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

    from ..jax_adapter import (ExtendedDType, TypedComplex, TypedFloat, TypedInt, WrappedFun,
                               prng_impl_type)
    spell = param_types.extend
    spell((type(None), bool, str), spell=_spell_repr)
    spell((int, float, complex, TypedInt, TypedFloat, TypedComplex), spell=_spell_number)
    spell(enum.Enum, spell=lambda v, sp: _enum_source(v))
    spell(np.generic, spell=_spell_numpy_scalar)
    spell(np.dtype, spell=_spell_dtype)
    spell(ExtendedDType, spell=_spell_dtype_like)
    spell(param_types.DTYPE_LIKE, spell=_spell_dtype_like)
    spell(type, spell=_spell_library_class)
    spell(param_types.DEFAULT, spell=_spell_library_object)
    spell(param_types.SENTINEL, spell=_spell_sentinel)
    spell(types.FunctionType, spell=_spell_function)
    spell(functools.partial, spell=_spell_partial)
    spell(type(jax.tree_util.tree_structure(0)), spell=_spell_treedef)
    spell(jax.ShapeDtypeStruct, spell=_spell_shape_dtype_struct)
    for name, qualified in (("GatherDimensionNumbers", "lax.GatherDimensionNumbers"),
                            ("ScatterDimensionNumbers", "lax.ScatterDimensionNumbers"),
                            ("ConvDimensionNumbers", "lax.ConvDimensionNumbers")):
        spell(getattr(lax, name), spell=_spell_lax_named_tuple(qualified))
    spell(PartitionSpec, spell=_spell_partition_spec)
    spell(NamedSharding, spell=_spell_named_sharding)
    spell((Mesh, AbstractMesh), spell=lambda v, sp: mesh_source(v))
    spell((frozenset, set), spell=_spell_set)
    spell(prng_impl_type(), spell=_spell_prng_impl)
    spell(tuple, spell=_spell_tuple)
    spell(list, spell=_spell_list)
    spell(dict, spell=_spell_dict)
    spell((np.ndarray, jax.Array), spell=lambda v, sp: array_literal_source(v))
    spell(lax.RaggedDotDimensionNumbers, spell=_spell_ragged)
    spell(lax.Tolerance, spell=_spell_tolerance)
    spell(jax.extend.core.Primitive, spell=_spell_primitive)

    # Values an equation's emission rule writes as the public call that stages them
    # (a region as a nested def, a debug callback's effect as jax.debug.callback...).
    from ..ir.region import Region
    from ..jax_adapter import (AbstractToken, ClosedJaxpr, Effect, Jaxpr, ShapedArray,
                               UnspecifiedValue, dots_saveable_type, linear_solve_tuple_type,
                               named_policy_types)
    by_rule = "written by its primitive's emission rule, not as a value"
    spell((Jaxpr, ClosedJaxpr), spell=_spell_held_jaxpr)
    for t in (Region, linear_solve_tuple_type(), dots_saveable_type(), Effect,
              ShapedArray, AbstractToken, jax.sharding.SingleDeviceSharding, jax.Device,
              UnspecifiedValue, type(PartitionSpec.UNCONSTRAINED), lax.DotAlgorithm,
              *named_policy_types()):
        spell(t, cannot_spell=by_rule)
    spell((types.MethodType, types.BuiltinFunctionType),
          cannot_spell="a Python callable is code; rules that take one import it by name")
    spell(WrappedFun, cannot_spell="a custom rule JAX staged is code: run the closure-convert "
                                   "pass to make it first-order")
    spell(param_types.NAMEDTUPLE, cannot_spell="a named tuple JAX does not export")


def _enum_source(value: enum.Enum) -> str:
    """``lax.Precision.HIGHEST``: the public class when JAX exports it; else the class
    imported by module and name (``_import_callable``) for the parameter enums JAX
    keeps private."""
    cls = type(value)
    name = cls.__name__
    import jax.lax.linalg
    public = (("lax", lax), ("jax.lax.linalg", jax.lax.linalg), ("jax.sharding", jax.sharding),
              ("jax.memory", getattr(jax, "memory", None)))
    for prefix, module in public:
        if module is not None and getattr(module, name, None) is cls:
            return f"{prefix}.{name}.{value.name}"
    from ..jax_adapter import array_copy_semantics_type, param_enum_types
    if cls is array_copy_semantics_type():
        return f"_copy_semantics({value.name!r})"
    if cls in param_enum_types():
        return f"_import_callable({cls.__module__!r}, {cls.__qualname__!r}, None).{value.name}"
    raise SpellingError(f"enum {type(value).__module__}.{type(value).__qualname__} has no spelling")


def mesh_source(mesh) -> str:
    """A concrete mesh as ``_mesh(...)`` (device ids kept); an abstract one directly."""
    types = "(" + "".join(param_source(t) + ", " for t in mesh.axis_types) + ")" \
        if mesh.axis_types else "()"
    if type(mesh).__name__ == "AbstractMesh":
        # The abstract device (kind, platform) is part of the mesh's identity: JAX
        # compares a program's meshes with the context mesh, which has one.
        device = getattr(mesh, "abstract_device", None)
        kind = "" if device is None else (
            f", abstract_device=_import_callable('jax._src.mesh', 'AbstractDevice', None)("
            f"device_kind={device.device_kind!r}, num_cores={device.num_cores!r}, "
            f"platform={device.platform!r})")
        return (f"jax.sharding.AbstractMesh({tuple(mesh.axis_sizes)!r}, {tuple(mesh.axis_names)!r}, "
                f"axis_types={types}{kind})")
    if not mesh.axis_names:
        return "jax.sharding.Mesh(np.empty((0,), dtype=object), ())"
    ids = [int(d.id) for d in mesh.devices.flat]
    return (f"_mesh({tuple(mesh.devices.shape)!r}, {tuple(mesh.axis_names)!r}, {ids!r}, "
            f"{types})")


_register_spellings()
