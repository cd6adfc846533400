"""The pass interface and the registry of passes by name.

A pass is a frozen dataclass whose fields are its options (``hoist-consts{min-bytes=1024}``
sets field ``min_bytes``), registered under a pipeline name with ``@register_pass``.
``run`` receives the pass manager's working copy of the program, may change it in
place, and returns the resulting program; it records what it did in ``ctx.stats``.
The pass manager copies the user's program first, so passes never mutate their
caller's input.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

PASS_REGISTRY: dict[str, type["Pass"]] = {}


class PassOptionError(ValueError):
    """A pass option names something the program does not have (``loops=`` a loop it
    lacks): bad input, reported as it is, not as a failing pass."""


@dataclass
class PassContext:
    """What a running pass may read and report."""
    stats: dict[str, int | float] = field(default_factory=dict)
    changed: bool | None = None  # a pass may say whether it changed the program

    def count(self, key: str, n: int | float = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n


@dataclass(frozen=True)
class Pass:
    """Base class of passes. Subclasses are frozen dataclasses; fields are options."""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def run(self, program, ctx: PassContext):
        raise TypeError(f"pass {type(self).__name__} does not define run()")

    @classmethod
    def options(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    def __str__(self) -> str:
        """The pipeline-string form: ``name{opt=value ...}`` (non-default options only)."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            if value != default:
                parts.append(f"{f.name.replace('_', '-')}={format_option(value)}")
        return self.name + ("{" + " ".join(parts) + "}" if parts else "")


def format_option(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(format_option(v) for v in value)
    return str(value)


def register_pass(name: str):
    """Class decorator: register a Pass subclass under ``name`` in the pipeline syntax."""
    def wrap(cls):
        if not (isinstance(cls, type) and issubclass(cls, Pass)):
            raise TypeError(f"@register_pass({name!r}) must decorate a Pass subclass")
        if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
            raise TypeError(f"pass {name!r}: {cls.__name__} must be a frozen dataclass")
        existing = PASS_REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"a pass named {name!r} is already registered ({existing.__qualname__})")
        cls.name = name
        PASS_REGISTRY[name] = cls
        return cls
    return wrap
