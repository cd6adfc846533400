"""A FileCheck engine for printed IR (the subset of LLVM FileCheck that goldens use).

Directives are lines ``CHECK: pattern`` (optionally behind a ``#``, ``//`` or ``;``
comment marker), matched in order against an input text:

* ``CHECK:`` the pattern occurs at or after the end of the previous match;
* ``CHECK-NEXT:`` ... on the line right after the previous match;
* ``CHECK-SAME:`` ... on the same line as the previous match, after it;
* ``CHECK-NOT:`` the pattern does not occur between the previous match and the
  next one (or the end of the input / of the block);
* ``CHECK-LABEL:`` the input is first cut into blocks at the lines matching the
  labels (in order); the directives after a label must match inside its block.

A pattern is literal text (runs of blanks match any run of blanks) with two escapes:
``{{regex}}`` is a Python regular expression, ``[[NAME:regex]]`` captures what the
regex matched as variable ``NAME`` and ``[[NAME]]`` must match the captured text
exactly -- so checks survive the renumbering of values.  A pattern matches within
one line.  ``prefix`` renames ``CHECK`` (``TRACE:``, ``TRACE-NEXT:`` ...).

A failure raises :class:`FileCheckFailure` whose message names the directive
(``file:line``), shows the closest matching input line and the input around the
place the search started.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Iterable, Sequence

__all__ = ["Directive", "FileCheckFailure", "FileCheckSyntaxError", "KINDS",
           "filecheck", "match_directives", "parse_directives"]

KINDS = ("", "-NEXT", "-SAME", "-NOT", "-LABEL")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PREFIX_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
CONTEXT_LINES = 3
# Failure messages score at most this many input lines for the closest match.
_CLOSEST_SCAN_LIMIT = 20000


class FileCheckSyntaxError(ValueError):
    """A malformed directive: ``file:line: what is wrong``."""


class FileCheckFailure(AssertionError):
    """A directive did not hold; the message explains where and why."""

    def __init__(self, message: str, directive: "Directive"):
        super().__init__(message)
        self.directive = directive


@dataclasses.dataclass(frozen=True)
class _Piece:
    kind: str      # "text" | "regex" | "def" | "use"
    text: str      # literal text, regex source, or variable name
    regex: str = ""  # for "def": the capture's regex


@dataclasses.dataclass(frozen=True)
class Directive:
    """One directive line: ``kind`` is ``CHECK``, ``CHECK-NEXT``, ... (with the
    prefix in use), ``suffix`` the part after the prefix ("" or "-NEXT" ...)."""
    kind: str
    suffix: str
    pattern: str
    path: str
    line: int
    pieces: tuple = ()

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def defines(self) -> list[str]:
        return [p.text for p in self.pieces if p.kind == "def"]

    def uses(self) -> list[str]:
        return [p.text for p in self.pieces if p.kind == "use"]


# ---------------------------------------------------------------------------- parsing
def _directive_regex(prefix: str) -> re.Pattern:
    return re.compile(r"^\s*(?:#|//|;)?\s*" + re.escape(prefix)
                      + r"(?P<suffix>-[A-Za-z]+)?:(?P<rest>.*)$")


def parse_directives(text: str, *, path: str = "<checks>",
                     prefix: str = "CHECK") -> list[Directive]:
    """The directives with ``prefix`` in ``text`` (other lines are ignored)."""
    if not _PREFIX_NAME.match(prefix):
        raise FileCheckSyntaxError(f"{path}: check prefix {prefix!r} must start with a letter "
                                   f"and use only letters, digits, '_' and '-'")
    pattern = _directive_regex(prefix)
    directives: list[Directive] = []
    for number, line in enumerate(text.splitlines(), start=1):
        m = pattern.match(line)
        if not m:
            continue
        suffix = (m.group("suffix") or "").upper()
        kind = prefix + suffix
        where = f"{path}:{number}"
        if suffix not in KINDS:
            known = ", ".join(prefix + k for k in KINDS)
            raise FileCheckSyntaxError(f"{where}: unknown directive {prefix}{m.group('suffix')}: "
                                       f"(known: {known})")
        body = m.group("rest").strip()
        if not body:
            raise FileCheckSyntaxError(f"{where}: {kind}: has an empty pattern; write the text "
                                       f"to look for after the colon")
        pieces = tuple(_parse_pattern(body, where, kind))
        directive = Directive(kind, suffix, body, path, number, pieces)
        if suffix in ("-NOT", "-LABEL") and directive.defines():
            raise FileCheckSyntaxError(f"{where}: {kind}: cannot define variables "
                                       f"([[NAME:regex]]); capture them in a CHECK line")
        if suffix == "-LABEL" and directive.uses():
            raise FileCheckSyntaxError(f"{where}: {kind}: cannot use variables: labels are "
                                       f"matched before the other directives")
        directives.append(directive)
    _check_order(directives)
    return directives


def _check_order(directives: Sequence[Directive]) -> None:
    defined: set[str] = set()
    previous_positive = False
    for d in directives:
        if d.suffix in ("-NEXT", "-SAME") and not previous_positive:
            raise FileCheckSyntaxError(f"{d.where}: {d.kind}: has no previous match to follow; "
                                       f"start with a CHECK or CHECK-LABEL line")
        seen_here: set[str] = set()
        for piece in d.pieces:
            if piece.kind == "def":
                seen_here.add(piece.text)
            elif piece.kind == "use" and piece.text not in defined | seen_here:
                raise FileCheckSyntaxError(f"{d.where}: {d.kind}: uses variable [[{piece.text}]] "
                                           f"before any directive defines it "
                                           f"([[{piece.text}:regex]])")
        defined |= seen_here
        if d.suffix != "-NOT":
            previous_positive = True


def _parse_pattern(body: str, where: str, kind: str) -> Iterable[_Piece]:
    i, literal = 0, []
    while i < len(body):
        if body.startswith("{{", i):
            end = body.find("}}", i + 2)
            if end < 0:
                raise FileCheckSyntaxError(f"{where}: {kind}: '{{{{' is never closed by '}}}}'")
            source = body[i + 2:end]
            _compile(source, where, kind)
            if literal:
                yield _Piece("text", "".join(literal))
                literal = []
            yield _Piece("regex", source)
            i = end + 2
        elif body.startswith("[[", i):
            end = _variable_end(body, i + 2)
            if end < 0:
                raise FileCheckSyntaxError(f"{where}: {kind}: '[[' is never closed by ']]'")
            inner = body[i + 2:end]
            name, colon, regex = inner.partition(":")
            if not _VAR_NAME.match(name):
                raise FileCheckSyntaxError(f"{where}: {kind}: bad variable name {name!r} in "
                                           f"[[{inner}]] (use letters, digits and '_')")
            if literal:
                yield _Piece("text", "".join(literal))
                literal = []
            if colon:
                if not regex:
                    raise FileCheckSyntaxError(f"{where}: {kind}: [[{name}:]] needs a regex "
                                               f"after the colon, e.g. [[{name}:%[0-9]+]]")
                _compile(regex, where, kind)
                yield _Piece("def", name, regex)
            else:
                yield _Piece("use", name)
            i = end + 2
        else:
            literal.append(body[i])
            i += 1
    if literal:
        yield _Piece("text", "".join(literal))


def _variable_end(body: str, start: int) -> int:
    """Index of the ``]]`` closing a ``[[...`` opened before ``start``; brackets of a
    regex character class (``[a-z]``) and escaped characters do not close it."""
    i, in_class = start, False
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif body.startswith("]]", i):
            return i
        elif c == "[":
            in_class = True
            if body.startswith("]", i + 1) or body.startswith("^]", i + 1):
                i += 2 if body[i + 1] == "]" else 3  # a leading ']' is part of the class
                continue
        i += 1
    return -1


def _compile(source: str, where: str, kind: str) -> re.Pattern:
    try:
        return re.compile(source)
    except re.error as e:
        raise FileCheckSyntaxError(f"{where}: {kind}: invalid regex {source!r}: {e}") from None


def _literal_regex(text: str) -> str:
    return "".join("[ \t]+" if part.isspace() else re.escape(part)
                   for part in re.split(r"([ \t]+)", text) if part)


def _group(name: str) -> str:
    return f"v_{name}"


def _compile_directive(d: Directive, variables: dict[str, str]) -> re.Pattern:
    parts, here = [], set()
    for piece in d.pieces:
        if piece.kind == "text":
            parts.append(_literal_regex(piece.text))
        elif piece.kind == "regex":
            parts.append(f"(?:{piece.text})")
        elif piece.kind == "def":
            if piece.text in here:  # redefined within one pattern: the last one wins
                parts.append(f"(?:{piece.regex})")
            else:
                parts.append(f"(?P<{_group(piece.text)}>{piece.regex})")
                here.add(piece.text)
        else:
            if piece.text in here:
                parts.append(f"(?P={_group(piece.text)})")
            else:
                parts.append(re.escape(variables[piece.text]))
    return re.compile("".join(parts))


def _display(d: Directive, variables: dict[str, str]) -> str:
    """The pattern as text, with known variables substituted (for similarity scores)."""
    out = []
    for piece in d.pieces:
        if piece.kind == "text":
            out.append(piece.text)
        elif piece.kind == "use":
            out.append(variables.get(piece.text, piece.text))
        else:
            out.append(piece.regex if piece.kind == "def" else piece.text)
    return "".join(out)


# ---------------------------------------------------------------------------- matching
@dataclasses.dataclass(frozen=True, order=True)
class _Pos:
    line: int
    col: int


@dataclasses.dataclass(frozen=True)
class _Match:
    line: int
    start: int
    end: int
    groups: dict

    @property
    def begin(self) -> _Pos:
        return _Pos(self.line, self.start)

    @property
    def finish(self) -> _Pos:
        return _Pos(self.line, self.end)


class _Matcher:
    def __init__(self, lines: list[str], input_name: str):
        self.lines = lines
        self.input_name = input_name
        self.variables: dict[str, str] = {}

    def search(self, regex: re.Pattern, start: _Pos, end: _Pos) -> _Match | None:
        for number in range(start.line, min(end.line, len(self.lines) - 1) + 1):
            text = self.lines[number]
            col = start.col if number == start.line else 0
            stop = end.col if number == end.line else len(text)
            m = regex.search(text, col, stop)
            if m is not None:
                return _Match(number, m.start(), m.end(), m.groupdict())
        return None

    def bind(self, d: Directive, m: _Match) -> None:
        for name in d.defines():
            value = m.groups.get(_group(name))
            if value is not None:
                self.variables[name] = value

    # ------------------------------------------------------------------ failures
    def fail(self, d: Directive, reason: str, at: _Pos, end: _Pos, *,
             found: _Match | None = None, note: str = "") -> FileCheckFailure:
        lines = [f"{d.where}: error: {d.kind}: {reason}",
                 f"  {d.kind}: {d.pattern}"]
        used = [n for n in dict.fromkeys(d.uses()) if n in self.variables]
        for name in used:
            lines.append(f"  with [[{name}]] = {self.variables[name]!r}")
        if note:
            lines.append(f"  {note}")
        if found is None:
            closest = self.closest(d, at, end)
            if closest is not None:
                number, ratio = closest
                lines.append(f"  closest match ({self.input_name} line {number + 1}, "
                             f"{ratio:.0%} similar):")
                lines.append(f"    {self.lines[number].strip()}")
            center = at.line
            lines.append(f"  {self.input_name} around line {center + 1} "
                         f"(> where the search started):")
        else:
            center = found.line
            lines.append(f"  {self.input_name} around line {center + 1} "
                         f"(> the match, ^ where the search started):")
        lines.extend(self.context(center, at.line))
        return FileCheckFailure("\n".join(lines), d)

    def closest(self, d: Directive, start: _Pos, end: _Pos) -> tuple[int, float] | None:
        wanted = " ".join(_display(d, self.variables).split())
        best: tuple[int, float] | None = None
        last = min(end.line, len(self.lines) - 1, start.line + _CLOSEST_SCAN_LIMIT)
        for number in range(start.line, last + 1):
            candidate = " ".join(self.lines[number].split())
            if not candidate:
                continue
            sm = difflib.SequenceMatcher(None, wanted, candidate, autojunk=False)
            if best is not None and sm.real_quick_ratio() <= best[1]:
                continue
            if best is not None and sm.quick_ratio() <= best[1]:
                continue
            ratio = sm.ratio()
            if best is None or ratio > best[1]:
                best = (number, ratio)
        return best

    def context(self, center: int, search_line: int) -> list[str]:
        lo = max(0, center - CONTEXT_LINES)
        hi = min(len(self.lines), center + CONTEXT_LINES + 1)
        width = len(str(hi))
        out = []
        for number in range(lo, hi):
            mark = ">" if number == center else ("^" if number == search_line else " ")
            out.append(f"  {mark} {number + 1:>{width}} | {self.lines[number]}".rstrip())
        if not out:
            out.append("    (the input is empty)")
        return out


def match_directives(directives: Sequence[Directive], text: str, *,
                     input_name: str = "input") -> dict[str, str]:
    """Match parsed directives against ``text``; return the captured variables.
    Raises :class:`FileCheckFailure` at the first directive that does not hold."""
    if not directives:
        raise FileCheckSyntaxError("no check directives to match")
    lines = text.split("\n")
    if lines and lines[-1] == "" and len(lines) > 1:
        lines.pop()  # the newline that ends the last line does not start another
    m = _Matcher(lines, input_name)
    end_of_input = _Pos(len(lines) - 1, len(lines[-1]) if lines else 0)
    labels = [d for d in directives if d.suffix == "-LABEL"]
    label_matches: dict[int, _Match] = {}
    pos = _Pos(0, 0)
    for d in labels:
        found = m.search(_compile_directive(d, m.variables), pos, end_of_input)
        if found is None:
            raise m.fail(d, "expected label not found in input", pos, end_of_input)
        label_matches[id(d)] = found
        pos = found.finish
    # Blocks: the directives before the first label, then each label's directives.
    block_end = end_of_input
    previous: _Match | None = None
    pending_nots: list[Directive] = []
    label_index = 0
    pos = _Pos(0, 0)
    if labels:
        block_end = label_matches[id(labels[0])].begin

    def check_nots(until: _Pos) -> None:
        for nd in pending_nots:
            hit = m.search(_compile_directive(nd, m.variables), pos, until)
            if hit is not None:
                raise m.fail(nd, "excluded string found in input", pos, until, found=hit)
        pending_nots.clear()

    for d in directives:
        if d.suffix == "-LABEL":
            check_nots(block_end)
            found = label_matches[id(d)]
            label_index += 1
            block_end = (label_matches[id(labels[label_index])].begin
                         if label_index < len(labels) else end_of_input)
            previous, pos = found, found.finish
            continue
        if d.suffix == "-NOT":
            pending_nots.append(d)
            continue
        regex = _compile_directive(d, m.variables)
        found = m.search(regex, pos, block_end)
        if found is None:
            raise m.fail(d, "expected string not found in input", pos, block_end)
        if d.suffix == "-NEXT" and found.line != previous.line + 1:
            where = ("on the same line as" if found.line == previous.line
                     else f"{found.line - previous.line} lines after")
            raise m.fail(d, f"is not on the line after the previous match (found {where} it, "
                            f"at line {found.line + 1})", _Pos(previous.line + 1, 0), block_end,
                         found=found, note=f"previous match: {input_name} line {previous.line + 1}")
        if d.suffix == "-SAME" and found.line != previous.line:
            raise m.fail(d, f"is not on the same line as the previous match (found at line "
                            f"{found.line + 1})", pos, block_end, found=found,
                         note=f"previous match: {input_name} line {previous.line + 1}")
        check_nots(found.begin)
        m.bind(d, found)
        previous, pos = found, found.finish
    check_nots(block_end)
    return dict(m.variables)


def filecheck(checks: "str | Sequence[Directive]", text: str, *, path: str = "<checks>",
              prefix: str = "CHECK", input_name: str = "input") -> dict[str, str]:
    """Match FileCheck directives (a text to parse, or parsed :class:`Directive`s)
    against ``text``; returns the captured variables."""
    directives = (parse_directives(checks, path=path, prefix=prefix)
                  if isinstance(checks, str) else list(checks))
    if not directives:
        raise FileCheckSyntaxError(f"{path}: no {prefix}: directives found")
    return match_directives(directives, text, input_name=input_name)
