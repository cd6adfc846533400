"""Program -> the program.json document and its array entries.

Every region of the program (the body first, then nested regions in pre-order) is
one element of ``"regions"``; an equation refers to its nested regions by index, and
a region shared by several equations is written once.
Values are numbered per region in order of definition (constants, inputs, then
equation results), so each number is defined exactly once and every reference is to
an earlier definition.  See docs/format.md for the full schema.
"""
from __future__ import annotations

import json
from typing import Any

from ..closure.ir_rules import IN_PROCESS_PARAMS
from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import NameScope, NameTransform, eqn_context_fields
from . import effects as effects_codec
from ..storage import pytrees
from . import shardings
from .avals import AvalCodec
from ..storage.errors import SaveError
from .param_codecs import ParamEncoder
from .values import ArrayTable, encode_host_value


class _Encoder:
    def __init__(self, program):
        self.program = program
        self.avals = AvalCodec()
        self.arrays = ArrayTable()
        self.regions: list[dict | None] = []
        self.region_ids: dict[int, int] = {}
        self.jaxpr_ids: dict[int, int] = {}
        self.contexts: list[dict] = []
        self.context_ids: dict[int, int] = {}
        self._keep: list[Any] = []
        self.params = ParamEncoder(self._region_ref, self._jaxpr_ref, self._array_ref, self.avals)

    # ------------------------------------------------------------ refs
    def _region_ref(self, region: Region) -> int:
        # A region held by several equations (a custom rule used at many call sites)
        # is written once and read back as one shared object.
        known = self.region_ids.get(id(region))
        if known is not None:
            if known == 0:
                raise SaveError(f"cannot save {self.params.where}: a region calls the program body")
            return known  # written once; a recursive rule refers to itself by index
        where = self.params.where
        index = len(self.regions)
        self.region_ids[id(region)] = index
        self._keep.append(region)
        self.regions.append(None)
        self.regions[index] = self._region(region, f"region {index}")
        self.params.where = where
        return index

    def _jaxpr_ref(self, jaxpr) -> int:
        """A Jaxpr/ClosedJaxpr the IR left as is (not directly in a parameter): saved
        as a region and read back as the same kind of object."""
        from ..frontend.from_jaxpr import region_from_closed_jaxpr, region_from_jaxpr
        from ..jax_adapter import ClosedJaxpr
        # One jaxpr object held in several places is written once (and read back as
        # one object: libraries compare held jaxprs by identity).
        known = self.jaxpr_ids.get(id(jaxpr))
        if known is not None:
            return known
        region = (region_from_closed_jaxpr(jaxpr) if isinstance(jaxpr, ClosedJaxpr)
                  else region_from_jaxpr(jaxpr, None))
        index = self.jaxpr_ids[id(jaxpr)] = self._region_ref(region)
        self._keep.append(jaxpr)
        return index

    def _array_ref(self, value, where: str) -> dict:
        return encode_host_value(value, self.arrays, where)

    def _context(self, ctx) -> Any:
        if ctx is None:
            return None
        index = self.context_ids.get(id(ctx))
        if index is not None:
            return index
        compute_type, threefry, mesh, remove_size_one, metadata = eqn_context_fields(ctx)
        where = "equation context"
        if compute_type is not None and type(compute_type) is not str:
            raise SaveError(f"{where}: compute_type {compute_type!r} cannot be saved")
        saved_where, self.params.where = self.params.where, where
        items = None if metadata is None else [[k, self.params.encode(v)]
                                               for k, v in sorted(metadata.items())]
        self.params.where = saved_where
        encoded = {"compute_type": compute_type, "threefry_partitionable": bool(threefry),
                   "mesh": shardings.encode_abstract_mesh(mesh, where),
                   "remove_size_one_mesh_axis": bool(remove_size_one), "xla_metadata": items}
        from .decode import decode_context
        if decode_context(encoded, self.params_decoder_for_check()) is not ctx:
            raise SaveError(f"{where} {ctx} cannot be saved exactly")
        index = len(self.contexts)
        self.contexts.append(encoded)
        self.context_ids[id(ctx)] = index
        self._keep.append(ctx)
        return index

    def params_decoder_for_check(self):
        from .param_codecs import ParamDecoder

        def no_refs(*_):
            raise SaveError("equation context metadata may only hold plain values")
        return ParamDecoder(no_refs, no_refs, no_refs, self.avals)

    # ---------------------------------------------------------- regions
    def _region(self, region: Region, label: str) -> dict:
        ids: dict[Value, int] = {}
        avals = self.avals
        consts = []
        values = region.consts if region.consts is not None else [None] * len(region.constvars)
        for v, c in zip(region.constvars, values):
            ids[v] = len(ids)
            item = {"id": ids[v], "type": avals.encode(v.aval, f"{label} constant")}
            if v.name is not None:
                item["name"] = v.name
            if region.consts is not None:
                item["value"] = encode_host_value(c, self.arrays, f"{label} constant {ids[v]}")
            consts.append(item)
        invars = []
        for v in region.invars:
            ids[v] = len(ids)
            item = {"id": ids[v], "type": avals.encode(v.aval, f"{label} input")}
            if v.name is not None:
                item["name"] = v.name
            invars.append(item)
        eqns = [self._equation(eqn, ids, f"{label} equation {k}")
                for k, eqn in enumerate(region.topo_order())]
        outvars = [self._atom(a, ids, f"{label} output") for a in region.outvars]
        return {
            "closed": region.consts is not None,
            "consts": consts,
            "invars": invars,
            "eqns": eqns,
            "outvars": outvars,
            "effects": effects_codec.encode_effects(region.effects, f"{label} effects"),
            "debug_info": _debug_info(region.debug_info),
        }

    def _atom(self, atom, ids: dict, where: str):
        if type(atom) is Value:
            try:
                return ids[atom]
            except KeyError:
                raise SaveError(f"{where}: operand {atom!r} is not defined in its region "
                                f"(run program.verify())") from None
        return {"lit": encode_host_value(atom.val, self.arrays, where),
                "type": self.avals.encode(atom.aval, where)}

    def _equation(self, eqn, ids: dict, where: str) -> dict:
        from . import primitives
        problem = primitives.problem_with(eqn.prim)
        if problem:
            raise SaveError(f"cannot save {where}: {problem}")
        ins = [self._atom(a, ids, f"{where} ({eqn.prim.name}) operand") for a in eqn.inputs]
        outs = []
        types = []
        for v in eqn.outputs:
            ids[v] = len(ids)
            outs.append(ids[v])
            types.append(self.avals.encode(v.aval, f"{where} ({eqn.prim.name}) result"))
        out = {"out": outs, "type": types, "op": eqn.prim.name, "in": ins}
        if eqn.params:
            params = {}
            for key, value in eqn.params.items():
                if key in IN_PROCESS_PARAMS:  # in-process objects: not saved
                    continue
                if type(key) is not str:
                    raise SaveError(f"cannot save {where}: parameter name {key!r} is not a string")
                self.params.where = f"{eqn.prim.name} parameter '{key}' ({where})"
                params[key] = self.params.encode(value)
            out["params"] = params
        if eqn.effects:
            out["effects"] = effects_codec.encode_effects(eqn.effects, f"{where} ({eqn.prim.name})")
        ctx = self._context(eqn.ctx)
        if ctx != 0:
            out["ctx"] = ctx
        scope = _name_stack(eqn.source_info, where)
        if scope:
            out["scope"] = scope
        names = [v.name for v in eqn.outputs]
        if any(n is not None for n in names):
            out["names"] = names
        return out

    # --------------------------------------------------------- program
    def document(self) -> dict:
        program = self.program
        try:
            in_tree = pytrees.encode_treedef(program.in_tree, "in_tree", custom_nodes=True)
            out_tree = pytrees.encode_treedef(program.out_tree, "out_tree", custom_nodes=True)
        except SaveError as e:
            raise SaveError(f"cannot save {program.name}: {e}") from None
        if type(program.name) is not str:
            raise SaveError(f"program name {program.name!r} is not a string")
        bound = [encode_host_value(p, self.arrays, f"bound parameter {i}")
                 for i, p in enumerate(program.params)]
        self.regions.append(None)
        self.region_ids[id(program.body)] = 0
        self.regions[0] = self._region(program.body, "body")
        param_sets = _share_param_sets(self.regions)
        doc = {
            "name": program.name,
            "in_tree": in_tree,
            "out_tree": out_tree,
            "params": bound,
            "contexts": self.contexts,
            "arrays": self.arrays.descriptors,
        }
        if param_sets:  # written only when some equations share their params
            doc["param_sets"] = param_sets
        doc["regions"] = self.regions
        if program.arg_shardings is not None:
            # Written only when there are some: files of unsharded programs are unchanged.
            doc["arg_shardings"] = [_arg_sharding(s, f"cannot save {program.name}: argument "
                                                     f"leaf {i} sharding")
                                    for i, s in enumerate(program.arg_shardings)]
        return doc


def _arg_sharding(sharding, where: str):
    import jax
    if sharding is None:
        return None
    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise SaveError(f"{where}: only NamedSharding can be saved, got "
                        f"{type(sharding).__name__}")
    encoded = shardings.encode_named_sharding(sharding, where)
    if shardings.decode_named_sharding(encoded) != sharding:
        raise SaveError(f"{where}: {sharding} cannot be saved exactly")
    return encoded


def _share_param_sets(regions: list) -> list:
    """Store each parameter set that several equations carry once (the calls of one
    function repeat the same params at every site), in order of first use; those
    equations refer to it by index.  Rewrites ``regions`` in place."""
    counts: dict[str, int] = {}
    for region in regions:
        for e in region["eqns"]:
            if "params" in e:
                text = _compact(e["params"])
                counts[text] = counts.get(text, 0) + 1
    index: dict[str, int] = {}
    sets: list = []
    for region in regions:
        for e in region["eqns"]:
            if "params" in e:
                text = _compact(e["params"])
                if counts[text] > 1:
                    k = index.get(text)
                    if k is None:
                        k = index[text] = len(sets)
                        sets.append(e["params"])
                    e["params"] = k
    return sets


def _name_stack(source_info, where: str) -> list:
    if source_info is None:
        return []
    out = []
    for item in source_info.name_stack.stack:
        if type(item) is NameScope:
            out.append(item.name)
        elif type(item) is NameTransform:
            out.append({"transform": item.name})
        else:
            raise SaveError(f"{where}: name stack entry {item!r} cannot be saved")
    return out


def _debug_info(dbg) -> dict | None:
    if dbg is None:
        return None
    paths = dbg.result_paths
    if callable(paths):
        try:
            paths = tuple(paths())
        except Exception:  # a thunk whose store was never filled: paths are unknown
            paths = None
    if not isinstance(paths, tuple) or not all(type(p) is str for p in paths):
        paths = None
    names = dbg.arg_names
    if names is not None and not all(n is None or type(n) is str for n in names):
        names = None
    return {"traced_for": str(dbg.traced_for),
            "func_src_info": None if dbg.func_src_info is None else str(dbg.func_src_info),
            "arg_names": None if names is None else list(names),
            "result_paths": None if paths is None else list(paths)}


# -------------------------------------------------------------- text layout
def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _lines(items: list, indent: str) -> str:
    """A JSON list with one compact element per line, indented under ``indent``."""
    if not items:
        return "[]"
    inner = ",\n".join(indent + "  " + _compact(x) for x in items)
    return "[\n" + inner + "\n" + indent + "]"


def _object(fields: dict, indent: str, expand: dict) -> str:
    """A JSON object with one field per line; ``expand[key]`` lays out a field's value."""
    inner = indent + "  "
    parts = [f"{inner}{_compact(key)}: " + (expand[key](value, inner) if key in expand
                                            else _compact(value))
             for key, value in fields.items()]
    return "{\n" + ",\n".join(parts) + "\n" + indent + "}"


_REGION_LAYOUT = {key: _lines for key in ("consts", "invars", "eqns")}


def _regions(regions: list, indent: str) -> str:
    inner = indent + "  "
    return ("[\n" + ",\n".join(inner + _object(r, inner, _REGION_LAYOUT) for r in regions)
            + "\n" + indent + "]")


_DOCUMENT_LAYOUT = {"params": _lines, "contexts": _lines, "arrays": _lines, "param_sets": _lines,
                    "regions": _regions}


def document_text(doc: dict) -> bytes:
    """program.json text: one line per equation, value binder, context and array, so
    that a change to a program shows as a change to a few lines."""
    return (_object(doc, "", _DOCUMENT_LAYOUT) + "\n").encode("ascii")


def encode_program(program) -> tuple[bytes, list[bytes]]:
    """(program.json bytes, .npy entries) for ``program``; raises SaveError."""
    enc = _Encoder(program)
    try:
        doc = enc.document()
    except ValueError as e:
        if isinstance(e, SaveError):
            raise
        raise SaveError(f"cannot save {program.name}: {e}") from None
    return document_text(doc), enc.arrays.entries

