"""``jaxpr-cc show``: print a program's IR (coloured on a terminal, plain in a pipe)."""
from __future__ import annotations

import os
import re
import sys


def register(sub) -> None:
    p = sub.add_parser("show", help="print the IR of a program",
                       description="Print a program's IR. PROGRAM is a saved program ('-' reads "
                                   "one from stdin), or MODULE_OR_FILE:FUNCTION with --args or "
                                   "--args-from.")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("--args", dest="args_spec", metavar="SPEC",
                   help="example arguments as shapes and dtypes, e.g. 'f32[3], f32[]'")
    p.add_argument("--args-from", metavar="FILE.npz",
                   help="example arguments as arrays named arg0, arg1, ... in an .npz file")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the output: auto (default) colours on a terminal unless "
                        "NO_COLOR is set")
    p.set_defaults(run=run)


def run(args) -> int:
    from .loading import load_program_arg
    from .output import stdout_is_terminal, write_stdout
    program = load_program_arg(args.program, args.args_spec, args.args_from)
    text = str(program)
    if use_colour(args.color, None, is_terminal=stdout_is_terminal()):
        text = colourize(text)
    write_stdout(text)
    return 0


def use_colour(choice: str, stream, is_terminal: bool | None = None) -> bool:
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    if is_terminal is not None:
        return is_terminal
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


_RESET = "\x1b[0m"
_STYLE = {"comment": "\x1b[2m", "keyword": "\x1b[1;35m", "op": "\x1b[1;34m",
          "value": "\x1b[36m", "type": "\x1b[32m", "function": "\x1b[1m"}
_COMMENT = re.compile(r"^(\s*#.*)$")
_KEYWORD = re.compile(r"^(\s*)(func|return|const)\b")
_FUNCTION = re.compile(r"(@[\w.]+)")
_OP = re.compile(r"^(\s*(?:%[\w.]+:\S+(?:, %[\w.]+:\S+)* = )?)([A-Za-z_][\w\-]*)(?=[\[ ]|$)")
_VALUE = re.compile(r"(%[\w.]+)")
_TYPE = re.compile(r"(?<=[\w>\]]):(~?[A-Za-z0-9_<>]+\[[^\]]*\](?:\{[^}]*\})?)")


def _paint(style: str, text: str) -> str:
    return f"{_STYLE[style]}{text}{_RESET}"


def colourize(text: str) -> str:
    """ANSI colours for the printer's text: keywords, primitive names, values, types."""
    out = []
    for line in text.split("\n"):
        if _COMMENT.match(line):
            out.append(_paint("comment", line) if line else line)
            continue
        keyword = _KEYWORD.match(line)
        if keyword:
            line = keyword.group(1) + _paint("keyword", keyword.group(2)) + line[keyword.end():]
            line = _FUNCTION.sub(lambda m: _paint("function", m.group(1)), line)
        else:
            op = _OP.match(line)
            if op and not line.rstrip().endswith(") {") and not line.strip().startswith("}"):
                line = op.group(1) + _paint("op", op.group(2)) + line[op.end():]
        line = _TYPE.sub(lambda m: ":" + _paint("type", m.group(1)), line)
        line = _VALUE.sub(lambda m: _paint("value", m.group(1)), line)
        out.append(line)
    return "\n".join(out)
