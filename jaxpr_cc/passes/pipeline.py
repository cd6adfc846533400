"""Pipeline strings: ``closure-convert,hoist-consts{min-bytes=1024 dedupe=true},cse,dce``.

Grammar::

    pipeline := [ pass ( "," pass )* ]
    pass     := NAME [ "{" [ option ( WS option )* ] "}" ]
    option   := NAME "=" value
    value    := a bare word (anything but whitespace, "{", "}", quotes)
              | a quoted string ('...' or "...", backslash escapes the next char)

Option names use dashes and map to the pass's dataclass fields with underscores;
a value is parsed by the field's annotated type: ``int``, ``float``, ``bool``
(``true``/``false``), ``str``, ``tuple[str, ...]`` / ``tuple[int, ...]`` (a comma
list -- inside braces a comma belongs to the value, so options are separated by
whitespace), ``Literal[...]`` (one of the listed values) and ``X | None``
(``none``).  Errors are :class:`PipelineError` (a ``ValueError``) whose message
shows the pipeline with a caret under the offending part.

``str(pipeline)`` prints the options each pass was given (in the order given,
values in canonical form), so a parsed pipeline prints back to the string it
came from; ``pipeline.canonical()`` prints only options that differ from their
defaults.  Parsing either form gives an equal pipeline.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .base import PASS_REGISTRY, Pass, format_option


class PipelineError(ValueError):
    """A malformed pipeline string; the message points at the offending part."""

    def __init__(self, message: str, text: str = "", start: int = 0, end: int | None = None):
        self.message = message
        self.text = text
        self.start = start
        self.end = max(end if end is not None else start + 1, start + 1)
        super().__init__(self._render())

    def _render(self) -> str:
        if not self.text:
            return self.message
        width = min(self.end, len(self.text) + 1) - self.start
        return (f"{self.message}\n  {self.text}\n  {' ' * self.start}{'^' * max(width, 1)}")

    def one_line(self) -> str:
        """The message without the caret picture, for one-line error reports."""
        if not self.text:
            return self.message
        return f"{self.message} (at column {self.start + 1} of {self.text!r})"


@dataclass(frozen=True, eq=False)
class Pipeline:
    """An ordered list of configured passes."""
    passes: tuple[Pass, ...]
    # Per pass, the option fields the user spelled out (printed even at their default).
    explicit: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self):
        if len(self.explicit) != len(self.passes):
            object.__setattr__(self, "explicit", tuple(() for _ in self.passes))

    def __iter__(self):
        return iter(self.passes)

    def __len__(self) -> int:
        return len(self.passes)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Pipeline(self.passes[index], self.explicit[index])
        return self.passes[index]

    def __eq__(self, other) -> bool:
        return isinstance(other, Pipeline) and self.passes == other.passes

    def __hash__(self) -> int:
        return hash(self.passes)

    def __str__(self) -> str:
        return ",".join(_format_pass(p, names) for p, names in zip(self.passes, self.explicit))

    def __repr__(self) -> str:
        return f"Pipeline({str(self)!r})"

    def canonical(self) -> str:
        """Only the options that differ from their defaults."""
        return ",".join(_format_pass(p, ()) for p in self.passes)


def _format_pass(p: Pass, explicit: Sequence[str]) -> str:
    defaults = {f.name: _default(f) for f in dataclasses.fields(p)}
    names = list(explicit) + [n for n in defaults if n not in explicit
                              and getattr(p, n) != defaults[n]]
    if not names:
        return p.name
    opts = " ".join(f"{n.replace('_', '-')}={_format_value(getattr(p, n))}" for n in names)
    return f"{p.name}{{{opts}}}"


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


_BARE_SPECIALS = set(" \t\n{}'\"")


def _format_value(value: Any) -> str:
    text = format_option(value) if not isinstance(value, str) else value
    if value is None:
        return "none"
    if isinstance(value, str) and (not text or any(c in _BARE_SPECIALS for c in text)):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


# --------------------------------------------------------------------------- parsing
def parse_pipeline(text: str, registry: dict[str, type[Pass]] | None = None) -> Pipeline:
    """Parse a pipeline string into a :class:`Pipeline` of configured passes."""
    if not isinstance(text, str):
        raise TypeError(f"a pipeline string must be a str, got {type(text).__name__}")
    if registry is None:
        from . import ensure_plugins_loaded
        ensure_plugins_loaded()
        registry = PASS_REGISTRY
    return _Parser(text, registry).pipeline()


def as_pipeline(spec: "str | Pipeline | Pass | Iterable[str | Pass]") -> Pipeline:
    """Accept a pipeline string, a Pipeline, a Pass, or a sequence of passes/strings."""
    if isinstance(spec, Pipeline):
        return spec
    if isinstance(spec, str):
        return parse_pipeline(spec)
    if isinstance(spec, Pass):
        return Pipeline((spec,))
    if isinstance(spec, type) and issubclass(spec, Pass):
        return Pipeline((spec(),))
    passes: list[Pass] = []
    explicit: list[tuple[str, ...]] = []
    try:
        items = list(spec)
    except TypeError:
        raise TypeError(f"a pipeline must be a string, a Pass or a sequence of them, "
                        f"got {type(spec).__name__}") from None
    for item in items:
        sub = as_pipeline(item)
        passes.extend(sub.passes)
        explicit.extend(sub.explicit)
    return Pipeline(tuple(passes), tuple(explicit))


class _Parser:
    def __init__(self, text: str, registry: dict[str, type[Pass]]):
        self.text = text
        self.registry = registry
        self.i = 0

    def error(self, message: str, start: int, end: int | None = None) -> PipelineError:
        return PipelineError(message, self.text, start, end)

    def skip_ws(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def word(self) -> tuple[str, int]:
        start = self.i
        while self.i < len(self.text) and (self.text[self.i].isalnum() or self.text[self.i] in "-_."):
            self.i += 1
        return self.text[start:self.i], start

    def pipeline(self) -> Pipeline:
        passes, explicit = [], []
        self.skip_ws()
        if self.i == len(self.text):
            return Pipeline((), ())
        while True:
            p, names = self.one_pass()
            passes.append(p)
            explicit.append(names)
            self.skip_ws()
            if self.i == len(self.text):
                break
            if self.text[self.i] != ",":
                raise self.error(f"expected ',' between passes, found {self.text[self.i]!r}", self.i)
            self.i += 1
            self.skip_ws()
            if self.i == len(self.text):
                raise self.error("expected a pass name after ','", self.i - 1)
        return Pipeline(tuple(passes), tuple(explicit))

    def one_pass(self) -> tuple[Pass, tuple[str, ...]]:
        name, start = self.word()
        if not name:
            found = self.text[self.i] if self.i < len(self.text) else "end of string"
            raise self.error(f"expected a pass name, found {found!r}", self.i)
        cls = self.registry.get(name)
        if cls is None:
            known = ", ".join(sorted(self.registry)) or "none registered"
            raise self.error(f"unknown pass {name!r} (known passes: {known})", start, self.i)
        values: dict[str, Any] = {}
        spans: dict[str, tuple[int, int]] = {}
        self.skip_ws()
        if self.i < len(self.text) and self.text[self.i] == "{":
            self.options(cls, name, values, spans)
        try:
            p = cls(**values)
        except (TypeError, ValueError) as e:
            first = min((s for s, _ in spans.values()), default=start)
            last = max((e_ for _, e_ in spans.values()), default=start + len(name))
            raise self.error(f"pass {name!r}: {e}", first if spans else start,
                             last if spans else start + len(name)) from None
        return p, tuple(values)

    def options(self, cls, pass_name: str, values: dict, spans: dict) -> None:
        open_at = self.i
        self.i += 1
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = _type_hints(cls)
        while True:
            self.skip_ws()
            if self.i >= len(self.text):
                raise self.error(f"pass {pass_name!r}: '{{' is never closed", open_at)
            if self.text[self.i] == "}":
                self.i += 1
                return
            key, kstart = self.word()
            if not key:
                raise self.error(f"pass {pass_name!r}: expected an option name, found "
                                 f"{self.text[self.i]!r}", self.i)
            field_name = key.replace("-", "_")
            if "_" in key and field_name in fields:
                raise self.error(f"pass {pass_name!r}: option {key!r} is spelled "
                                 f"{key.replace('_', '-')!r}", kstart, self.i)
            if field_name not in fields or not fields[field_name].init:
                known = ", ".join(f.replace("_", "-") for f in fields if fields[f].init) or "none"
                raise self.error(f"pass {pass_name!r} has no option {key!r} (options: {known})",
                                 kstart, self.i)
            if field_name in values:
                raise self.error(f"pass {pass_name!r}: option {key!r} given twice", kstart, self.i)
            if self.i >= len(self.text) or self.text[self.i] != "=":
                raise self.error(f"pass {pass_name!r}: expected '=' after option {key!r}", self.i)
            self.i += 1
            raw, vstart = self.value()
            try:
                values[field_name] = convert_value(raw, hints.get(field_name, str))
            except ValueError as e:
                raise self.error(f"pass {pass_name!r}, option {key!r}: {e}", vstart,
                                 max(self.i, vstart + 1)) from None
            spans[field_name] = (kstart, self.i)

    def value(self) -> tuple[str, int]:
        start = self.i
        if self.i < len(self.text) and self.text[self.i] in "'\"":
            quote = self.text[self.i]
            self.i += 1
            out = []
            while self.i < len(self.text) and self.text[self.i] != quote:
                if self.text[self.i] == "\\" and self.i + 1 < len(self.text):
                    self.i += 1
                out.append(self.text[self.i])
                self.i += 1
            if self.i >= len(self.text):
                raise self.error("unterminated quoted value", start)
            self.i += 1
            return "".join(out), start
        while self.i < len(self.text) and self.text[self.i] not in _BARE_SPECIALS:
            self.i += 1
        if self.i == start:
            raise self.error("expected a value after '='", start)
        return self.text[start:self.i], start


def _type_hints(cls) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: fall back to the raw ones
        return {f.name: f.type for f in dataclasses.fields(cls)}


def convert_value(raw: str, annotation: Any) -> Any:
    """Parse ``raw`` as a value of type ``annotation``; ValueError says what was expected."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if raw == "none" and len(non_none) < len(args):
            return None
        errors = []
        for a in non_none:
            try:
                return convert_value(raw, a)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(" or ".join(errors))
    if origin is typing.Literal:
        for choice in args:
            if format_option(choice) == raw:
                return choice
        raise ValueError(f"expected one of {', '.join(format_option(a) for a in args)}, got {raw!r}")
    if origin in (tuple, list) or annotation in (tuple, list):
        item_type = args[0] if args else str
        items = [] if raw == "" else raw.split(",")
        out = tuple(convert_value(x.strip(), item_type) for x in items)
        return out if origin is not list and annotation is not list else list(out)
    if annotation is bool:
        if raw in ("true", "false"):
            return raw == "true"
        raise ValueError(f"expected true or false, got {raw!r}")
    if annotation is int:
        try:
            return int(raw, 0) if raw.lower().startswith(("0x", "0o", "0b")) else int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
    if annotation is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
    if annotation is str or annotation is Any:
        return raw
    raise ValueError(f"options of type {annotation!r} cannot be given in a pipeline string")
