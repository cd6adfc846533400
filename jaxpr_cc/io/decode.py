"""The program.json document and its array entries -> Program.

Strict: every field is required (or has a documented default when absent), unknown
fields are refused, every value number is checked to be the next one defined or an
earlier one of the same region, every region is used exactly once.  Anything that
does not fit raises ``FormatError`` naming where in the document it is.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..ir.equation import Equation
from ..ir.graph_build import GraphLoader
from ..ir.program import Program
from ..ir.module import endless_cycle
from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import (DebugInfo, Literal, NameScope, NameStack, NameTransform,
                           make_eqn_context, make_source_info)
from . import effects as effects_codec
from ..storage import pytrees
from . import primitives, shardings
from .avals import AvalCodec
from ..storage.errors import FormatError
from .param_codecs import ParamDecoder
from .values import ArraySource, decode_host_value

_DOC_KEYS = {"name", "in_tree", "out_tree", "params", "contexts", "arrays", "regions"}
_REGION_KEYS = {"closed", "consts", "invars", "eqns", "outvars", "effects", "debug_info"}
_EQN_REQUIRED = {"out", "type", "op", "in"}
_OPTIONAL_DOC_KEYS = {"arg_shardings", "param_sets"}  # param_sets: format version 2
_EQN_KEYS = _EQN_REQUIRED | {"params", "effects", "ctx", "scope", "names"}
_MAX_NESTING = 64
_NO_CONTEXT = object()
_CONTEXT_KEYS = {"compute_type", "threefry_partitionable", "mesh", "remove_size_one_mesh_axis",
                 "xla_metadata"}


def decode_context(obj: Any, params: ParamDecoder):
    if not isinstance(obj, dict) or set(obj) != _CONTEXT_KEYS:
        raise FormatError("malformed equation context")
    compute_type = obj["compute_type"]
    if compute_type is not None and type(compute_type) is not str:
        raise FormatError("equation context compute_type must be a string or null")
    for key in ("threefry_partitionable", "remove_size_one_mesh_axis"):
        if type(obj[key]) is not bool:
            raise FormatError(f"equation context {key} must be true or false")
    items = obj["xla_metadata"]
    metadata = None
    if items is not None:
        if not isinstance(items, list) or not all(
                isinstance(p, list) and len(p) == 2 and type(p[0]) is str for p in items):
            raise FormatError("equation context xla_metadata must be a list of [name, value]")
        metadata = tuple((k, params.decode(v)) for k, v in items)
        if [k for k, _ in metadata] != sorted({k for k, _ in metadata}):
            raise FormatError("equation context xla_metadata keys must be sorted and unique")
    return make_eqn_context(compute_type, obj["threefry_partitionable"],
                            shardings.decode_abstract_mesh(obj["mesh"]),
                            obj["remove_size_one_mesh_axis"], metadata)


def _decode_debug_info(obj: Any):
    if obj is None:
        return None
    if not isinstance(obj, dict) or set(obj) != {"traced_for", "func_src_info", "arg_names",
                                                 "result_paths"}:
        raise FormatError("malformed debug_info")
    if type(obj["traced_for"]) is not str or not (obj["func_src_info"] is None
                                                  or type(obj["func_src_info"]) is str):
        raise FormatError("malformed debug_info")
    names, paths = obj["arg_names"], obj["result_paths"]
    if names is not None:
        if not isinstance(names, list) or not all(n is None or type(n) is str for n in names):
            raise FormatError("malformed debug_info arg_names")
        names = tuple(names)
    if paths is not None:
        if not isinstance(paths, list) or not all(type(p) is str for p in paths):
            raise FormatError("malformed debug_info result_paths")
        paths = tuple(paths)
    return DebugInfo(obj["traced_for"], obj["func_src_info"], names, paths)


class _Decoder:
    def __init__(self, doc: dict, arrays: ArraySource):
        self.arrays = arrays
        self.avals = AvalCodec()
        regions = doc["regions"]
        if not isinstance(regions, list) or not regions:
            raise FormatError("'regions' must be a non-empty list (region 0 is the body)")
        self.regions_json = regions
        self.state = [0] * len(regions)  # 0 unused, 1 being read, 2 read
        self.shared: dict[int, Region] = {}
        self.held_jaxprs: dict[tuple, Any] = {}
        self.nesting = 0
        self.params = ParamDecoder(self._region_param, self._jaxpr_param, self._host_value,
                                   self.avals)
        contexts = doc["contexts"]
        if not isinstance(contexts, list):
            raise FormatError("'contexts' must be a list")
        self.contexts = [decode_context(c, self.params) for c in contexts]
        self.prims: dict[str, Any] = {}
        sets = doc.get("param_sets", [])
        if not isinstance(sets, list) or not all(type(x) is dict and x for x in sets):
            raise FormatError("'param_sets' must be a list of non-empty objects")
        self.param_sets_json = sets
        self.param_sets: dict[int, dict] = {}  # decoded on first use
        self.default_source = make_source_info(NameStack())
        self.sources: dict[tuple, Any] = {}

    # ------------------------------------------------------------- refs
    def _host_value(self, obj):
        return decode_host_value(obj, self.arrays)

    def _region_param(self, index: Any) -> Region:
        if type(index) is not int or not 1 <= index < len(self.regions_json):
            raise FormatError(f"reference to region {str(index)[:20]}, which does not exist "
                              f"(regions 1..{len(self.regions_json) - 1} can be nested)")
        if self.state[index] != 0:  # shared by several equations, or recursive: one object
            return self.shared[index]
        region = self.shared[index] = self.region(index)
        return region

    def _jaxpr_param(self, index: Any, closed: bool):
        from ..backends.jaxpr import region_to_closed_jaxpr, region_to_jaxpr
        region = self._region_param(index)
        if closed != region.closed:
            raise FormatError(f"region {index} is {'open' if closed else 'closed'}, but is used "
                              f"as a {'closed' if closed else 'open'} jaxpr")
        # A jaxpr held by a parameter (custom_linear_solve's) is out of reach of the
        # program's per-equation type check: check its equations here.
        from .typecheck import check_held_region_types
        check_held_region_types(region, index)
        # One saved jaxpr is one object again (libraries compare held jaxprs by identity).
        found = self.held_jaxprs.get((index, closed))
        if found is None:
            found = self.held_jaxprs[(index, closed)] = (
                region_to_closed_jaxpr(region) if closed else region_to_jaxpr(region)[0])
        return found

    def _prim(self, name: Any, where: str):
        prim = self.prims.get(name) if type(name) is str else None
        if prim is None:
            if type(name) is not str:
                raise FormatError(f"{where}: primitive name must be a string")
            prim = primitives.lookup(name)
            if prim is None:
                raise FormatError(f"{where}: unknown primitive {name[:60]!r} (not one of the "
                                  f"primitives of the installed JAX)")
            self.prims[name] = prim
        return prim

    def _source(self, scope: Any, where: str):
        if not isinstance(scope, list) or not scope:
            raise FormatError(f"{where}: 'scope' must be a non-empty list")
        key = tuple(s if type(s) is str else json.dumps(s, sort_keys=True) for s in scope)
        info = self.sources.get(key)
        if info is None:
            stack = []
            for s in scope:
                if type(s) is str:
                    stack.append(NameScope(s))
                elif isinstance(s, dict) and set(s) == {"transform"} and type(s["transform"]) is str:
                    stack.append(NameTransform(s["transform"]))
                else:
                    raise FormatError(f"{where}: malformed scope entry {str(s)[:40]}")
            info = self.sources[key] = make_source_info(NameStack(tuple(stack)))
        return info

    def _literal(self, obj: Any, where: str):
        if not isinstance(obj, dict) or set(obj) != {"lit", "type"}:
            raise FormatError(f"{where}: operand {str(obj)[:40]} is neither a value number "
                              f"defined earlier in this region nor a literal")
        val = decode_host_value(obj["lit"], self.arrays)
        aval = self.avals.decode(obj["type"])
        shape = getattr(aval, "shape", None)
        if shape is None or np.shape(val) != shape:
            raise FormatError(f"{where}: literal of shape {np.shape(val)} declared as {aval}")
        dtype = getattr(val, "dtype", None)
        if dtype is not None and not isinstance(val, (int, float, complex)) and dtype != aval.dtype:
            raise FormatError(f"{where}: literal of dtype {dtype} declared as {aval}")
        return Literal(val, aval)

    # ---------------------------------------------------------- regions
    def _binders(self, items: Any, region: Region, env: list, *, const: bool, closed: bool,
                 where: str) -> None:
        if not isinstance(items, list):
            raise FormatError(f"{where} must be a list")
        expected = {"id", "type"} | ({"value"} if const and closed else set())
        for item in items:
            if not isinstance(item, dict) or not expected <= set(item) <= expected | {"name"}:
                raise FormatError(f"{where}: malformed binder {str(item)[:60]}")
            if item["id"] != len(env) or type(item["id"]) is not int:
                raise FormatError(f"{where}: value number {str(item['id'])[:20]} where "
                                  f"{len(env)} is next")
            name = item.get("name")
            if name is not None and type(name) is not str:
                raise FormatError(f"{where}: value name must be a string")
            if "name" in item and name is None:
                raise FormatError(f"{where}: a missing name is written by leaving out 'name'")
            aval = self.avals.decode(item["type"])
            v = Value(aval, region.entry, len(env), name)
            env.append(v)
            if const:
                region.constvars.append(v)
                if closed:
                    value = decode_host_value(item["value"], self.arrays)
                    if np.shape(value) != getattr(aval, "shape", None) or (
                            getattr(value, "dtype", aval.dtype) != aval.dtype
                            and not isinstance(value, (bool, int, float, complex))):
                        raise FormatError(f"{where} {item['id']}: value does not have type {aval}")
                    region.consts.append(value)
            else:
                region.invars.append(v)

    def region(self, index: int) -> Region:
        self.state[index] = 1
        self.nesting += 1
        if self.nesting > _MAX_NESTING:
            raise FormatError(f"regions nested more than {_MAX_NESTING} deep")
        where = f"region {index}"
        r = self.regions_json[index]
        if not isinstance(r, dict) or set(r) != _REGION_KEYS:
            raise FormatError(f"{where}: malformed region (fields {sorted(r)[:10] if isinstance(r, dict) else type(r).__name__})")
        closed = r["closed"]
        if type(closed) is not bool:
            raise FormatError(f"{where}: 'closed' must be true or false")
        region = Region(closed=closed, effects=effects_codec.decode_effects(r["effects"]),
                        debug_info=_decode_debug_info(r["debug_info"]))
        self.shared[index] = region  # a recursive rule's body refers to it while it is read
        env: list[Value] = []
        self._binders(r["consts"], region, env, const=True, closed=closed, where=f"{where} consts")
        self._binders(r["invars"], region, env, const=False, closed=closed, where=f"{where} invars")
        self._equations(r["eqns"], region, env, where)
        outvars = r["outvars"]
        if not isinstance(outvars, list):
            raise FormatError(f"{where}: 'outvars' must be a list")
        n = len(env)
        outs = [env[a] if type(a) is int and 0 <= a < n else self._literal(a, f"{where} output")
                for a in outvars]
        loader = GraphLoader(region.graph)
        for pos, atom in enumerate(outs):
            if type(atom) is Value:
                loader.add_edge(atom.producer, region.exit, pos, atom)
        region.outvars = outs
        self.nesting -= 1
        self.state[index] = 2
        return region

    def _equations(self, eqns: Any, region: Region, env: list, where: str) -> None:
        if not isinstance(eqns, list):
            raise FormatError(f"{where}: 'eqns' must be a list")
        succ, pred, node = region.graph._succ, region.graph._pred, region.graph._node
        order: dict[Equation, None] = {}
        aval_cache = self.avals._decoded
        decode_aval = self.avals.decode
        prims = self.prims
        contexts = self.contexts
        n_contexts = len(contexts)
        # Context 0 is every equation's default; with no contexts at all, each
        # equation must say "ctx": null itself (as the writer does).
        default_ctx = contexts[0] if contexts else _NO_CONTEXT
        default_source = self.default_source
        for k, e in enumerate(eqns):
            if type(e) is not dict:
                raise FormatError(f"{where} equation {k}: not a JSON object")
            try:
                op, ins, outs, types = e["op"], e["in"], e["out"], e["type"]
            except KeyError as err:
                raise FormatError(f"{where} equation {k}: missing field {err}") from None
            if len(e) > 4 and not e.keys() <= _EQN_KEYS:
                raise FormatError(f"{where} equation {k}: unknown fields "
                                  f"{sorted(set(e) - _EQN_KEYS)[:5]}")
            prim = prims.get(op) if type(op) is str else None
            if prim is None:
                prim = self._prim(op, f"{where} equation {k}")
            if type(ins) is not list or type(outs) is not list or type(types) is not list \
                    or len(outs) != len(types):
                raise FormatError(f"{where} equation {k} ({op}): malformed in/out/type lists")
            n = len(env)
            inputs = [env[a] if type(a) is int and 0 <= a < n
                      else self._literal(a, f"{where} equation {k} ({op}) operand") for a in ins]
            outputs = []
            for j, t in enumerate(types):
                if outs[j] != n + j or type(outs[j]) is not int:
                    raise FormatError(f"{where} equation {k} ({op}): result number "
                                      f"{str(outs[j])[:20]} where {n + j} is next")
                aval = aval_cache.get(t) if type(t) is str else None
                outputs.append(Value(aval if aval is not None else decode_aval(t)))
            if len(e) > 4:
                params, effects, ctx, source = self._extras(e, k, op, where, default_ctx,
                                                            n_contexts)
                names = e.get("names")
                if names is not None:
                    if not isinstance(names, list) or len(names) != len(outputs) or not all(
                            x is None or type(x) is str for x in names) or all(x is None for x in names):
                        raise FormatError(f"{where} equation {k} ({op}): malformed 'names'")
                    for v, name in zip(outputs, names):
                        v.name = name
            else:
                params, effects, ctx, source = {}, effects_codec.no_effects, default_ctx, default_source
            if ctx is _NO_CONTEXT:
                raise FormatError(f"{where} equation {k} ({op}): refers to context 0, but the "
                                  f"document has no contexts")
            env.extend(outputs)
            eqn = Equation(prim, inputs, outputs, params, effects, source, ctx)
            eqn.region = region
            order[eqn] = None
            node[eqn] = {}
            succ[eqn] = {}
            pe = pred[eqn] = {}
            for pos, atom in enumerate(inputs):
                if type(atom) is Value:
                    src = atom.producer
                    keydict = pe.get(src)
                    if keydict is None:
                        keydict = pe[src] = succ[src][eqn] = {}
                    keydict[pos] = {"value": atom}
        region._order = order

    def _extras(self, e: dict, k: int, op: str, where: str, default_ctx, n_contexts):
        raw = e.get("params")
        if raw is None:
            params = {}
            if "params" in e:
                raise FormatError(f"{where} equation {k} ({op}): empty 'params' are left out")
        elif type(raw) is int:
            if not 0 <= raw < len(self.param_sets_json):
                raise FormatError(f"{where} equation {k} ({op}): parameter set {raw} does not "
                                  f"exist ({len(self.param_sets_json)} in 'param_sets')")
            shared = self.param_sets.get(raw)
            if shared is None:
                shared = self.param_sets[raw] = self._params(self.param_sets_json[raw], k, op,
                                                             where)
            params = dict(shared)  # equations own their params dict; values are shared
        else:
            if type(raw) is not dict or not raw:
                raise FormatError(f"{where} equation {k} ({op}): 'params' must be a non-empty "
                                  f"object or the index of a parameter set")
            params = self._params(raw, k, op, where)
        fx = e.get("effects")
        if fx is None:
            effects = effects_codec.no_effects
            if "effects" in e:
                raise FormatError(f"{where} equation {k} ({op}): 'effects' must be a list")
        else:
            if not fx:
                raise FormatError(f"{where} equation {k} ({op}): empty 'effects' are left out")
            effects = effects_codec.decode_effects(fx)
        ctx = default_ctx
        if "ctx" in e:
            c = e["ctx"]
            if c is None:
                ctx = None
            elif type(c) is int and 0 < c < n_contexts:
                ctx = self.contexts[c]
            else:
                raise FormatError(f"{where} equation {k} ({op}): context {str(c)[:20]} does not "
                                  f"exist (context 0 is written by leaving out 'ctx')")
        source = self.default_source
        if "scope" in e:
            source = self._source(e["scope"], f"{where} equation {k} ({op})")
        return params, effects, ctx, source

    def _params(self, raw: dict, k: int, op: str, where: str) -> dict:
        params = {}
        for key, value in raw.items():
            try:
                params[key] = self.params.decode(value)
            except FormatError as err:
                raise FormatError(f"{where} equation {k} ({op}) parameter '{key[:40]}': "
                                  f"{err}") from None
        return params

    # --------------------------------------------------------- program
    def program(self, doc: dict) -> Program:
        name = doc["name"]
        if type(name) is not str or not name:
            raise FormatError("'name' must be a non-empty string")
        in_tree = pytrees.decode_treedef(doc["in_tree"], custom_nodes=True)
        out_tree = pytrees.decode_treedef(doc["out_tree"], custom_nodes=True)
        top = in_tree.node_data()
        kids = in_tree.children()
        if top is None or top[0] is not tuple or len(kids) != 2 or kids[0].node_data() is None \
                or kids[0].node_data()[0] is not tuple or kids[1].node_data() is None \
                or kids[1].node_data()[0] is not dict:
            raise FormatError("in_tree must be the structure of an (args tuple, kwargs dict) pair")
        bound = doc["params"]
        if not isinstance(bound, list):
            raise FormatError("'params' must be a list")
        params = [decode_host_value(p, self.arrays) for p in bound]
        body = self.region(0)
        unused = [i for i, s in enumerate(self.state) if s != 2]
        if unused:
            raise FormatError(f"region {unused[0]} is not used by any equation")
        cycle = endless_cycle(body)
        if cycle is not None:
            raise FormatError(f"a region contains itself ({cycle}); only a custom rule's body "
                              f"may call its own function")
        unused_sets = [i for i in range(len(self.param_sets_json)) if i not in self.param_sets]
        if unused_sets:
            raise FormatError(f"parameter set {unused_sets[0]} is not used by any equation")
        if self.arrays.descriptors and len(self.arrays._host) != len(self.arrays.descriptors):
            missing = [i for i in range(len(self.arrays.descriptors)) if i not in self.arrays._host]
            raise FormatError(f"array {missing[0]} is not used by the program")
        n_args = len(body.invars) - len(params)
        if body.closed is False:
            raise FormatError("region 0 (the body) must be closed")
        if n_args != in_tree.num_leaves:
            raise FormatError(f"the body has {n_args} argument inputs but in_tree has "
                              f"{in_tree.num_leaves} leaves")
        if len(body.outvars) != out_tree.num_leaves:
            raise FormatError(f"the body has {len(body.outvars)} outputs but out_tree has "
                              f"{out_tree.num_leaves} leaves")
        for i, (value, var) in enumerate(zip(params, body.invars)):
            if np.shape(value) != getattr(var.aval, "shape", None):
                raise FormatError(f"bound parameter {i} does not have the type {var.aval} of "
                                  f"input {i}")
        arg_shardings = doc.get("arg_shardings")
        if arg_shardings is not None:
            if not isinstance(arg_shardings, list) or len(arg_shardings) != n_args:
                raise FormatError(f"'arg_shardings' must list one sharding or null per argument "
                                  f"leaf ({n_args})")
            try:
                arg_shardings = [None if s is None else shardings.decode_named_sharding(s)
                                 for s in arg_shardings]
            except shardings.MissingDevicesError:
                # Where the arguments were placed is a default for compile, not part
                # of the program: a process without those devices can still load,
                # inspect and transform it (compile then asks for a mesh).
                arg_shardings = None
        return Program(body, in_tree, out_tree, name=name, params=params,
                       arg_shardings=arg_shardings)


def decode_program(doc: Any, arrays: ArraySource) -> Program:
    if not isinstance(doc, dict):
        raise FormatError("program.json is not a JSON object")
    if not _DOC_KEYS <= set(doc) <= _DOC_KEYS | _OPTIONAL_DOC_KEYS:
        raise FormatError(f"program.json has fields {sorted(doc)[:10]}; expected {sorted(_DOC_KEYS)} "
                          f"and optionally {sorted(_OPTIONAL_DOC_KEYS)}")
    return _Decoder(doc, arrays).program(doc)
