"""Stack families: one business name per call stack, from its signature frames.

The rules are data (``families.yaml`` next to this module; a user's file adds to them), the
matching is here.  A stack's *signature frames* are its frames from the innermost outwards once
the allocator and the system runtime are dropped; the first signature frame (within ``depth``)
that some family claims decides, and a stack nobody claims is ``"other: <top signature frame>"``
(its function without the module, so a renamed or rebuilt executable keeps its family names)
-- every stack lands in exactly one family, none is dropped.

Frames are :class:`memtrace.frames.Frame` objects, their JSON form (dicts with ``function``
and ``module``), ``(function, module)`` pairs, or the labels :meth:`Frame.name` produces
(``"function (module)"``, ``"module+0x1f0"``, ``"0x7f..."``).  Pure and cached per distinct frame, so a
live view can call :func:`classify` on every refresh.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from memtrace.errors import InputError
from memtrace.files import load_yaml, read_user_text
from memtrace.frames import Frame

BUILTIN_RULES = Path(__file__).with_name("families.yaml")
OTHER = "other"
NO_STACK = "other: <no stack>"

FrameLike = str | tuple[str | None, str | None] | Any


@dataclass(frozen=True)
class Family:
    name: str
    symbols: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


def _compile(globs: Iterable[str]) -> re.Pattern[str] | None:
    # One alternation per pattern list: a frame is tested once per list, not once per glob.
    parts = [fnmatch.translate(g) for g in globs]
    return re.compile("|".join(parts), re.IGNORECASE) if parts else None


def split_label(frame: FrameLike) -> tuple[str | None, str | None]:
    """(symbol, module) of a frame label; either may be unknown (None)."""
    if isinstance(frame, tuple):
        return frame[0], frame[1]
    if isinstance(frame, dict):
        return frame.get("function"), frame.get("module")
    if not isinstance(frame, str):
        return getattr(frame, "function", None), getattr(frame, "module", None)
    # "symbol (module)": the module is the last parenthesised group, after a space, so C++
    # signatures such as "CA::Render::Shmem::new_shmem(unsigned long) (QuartzCore)" split right.
    if frame.endswith(")") and " (" in frame:
        sym, mod = frame.rsplit(" (", 1)
        return sym, mod[:-1]
    if frame.startswith("0x") or frame.startswith("<"):
        return None, None
    if "+0x" in frame:
        return None, frame.rsplit("+0x", 1)[0]
    return frame, None


@dataclass
class FamilyRules:
    families: list[Family] = field(default_factory=list)
    skip_modules: tuple[str, ...] = ()
    skip_symbols: tuple[str, ...] = ()
    depth: int = 8

    def __post_init__(self) -> None:
        self._skip_mod = _compile(self.skip_modules)
        self._skip_sym = _compile(self.skip_symbols)
        self._compiled = [(f.name, _compile(f.symbols), _compile(f.modules)) for f in self.families]
        self._frame_cache: dict[Any, tuple[bool, str | None]] = {}

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.families]

    def _judge(self, frame: FrameLike) -> tuple[bool, str | None]:
        """(is runtime/allocator, family claiming it) for one frame, cached."""
        key = frame if isinstance(frame, str | tuple) else split_label(frame)
        hit = self._frame_cache.get(key)
        if hit is not None:
            return hit
        sym, mod = split_label(frame)
        skipped = bool((mod and self._skip_mod and self._skip_mod.fullmatch(mod))
                       or (sym and self._skip_sym and self._skip_sym.fullmatch(sym))
                       or (sym is None and mod is None))
        family = None
        if not skipped:
            for name, sym_re, mod_re in self._compiled:
                if (sym and sym_re and sym_re.fullmatch(sym)) or (mod and mod_re and mod_re.fullmatch(mod)):
                    family = name
                    break
        hit = (skipped, family)
        if len(self._frame_cache) < 1 << 16:    # bounded: labels are per distinct address
            self._frame_cache[key] = hit
        return hit

    def signature(self, frames: Sequence[FrameLike]) -> list[FrameLike]:
        """The frames outside the allocator and the runtime, innermost first, at most ``depth``."""
        out = []
        for f in frames:
            if not self._judge(f)[0]:
                out.append(f)
                if len(out) >= self.depth:
                    break
        return out

    def classify(self, frames: Sequence[FrameLike]) -> str:
        sig = self.signature(frames)
        for f in sig:
            family = self._judge(f)[1]
            if family is not None:
                return family
        if sig:
            return f"{OTHER}: {_family_label(sig[0])}"
        # Only runtime frames (or unresolved addresses): still one family, named by the top frame.
        return f"{OTHER}: {_family_label(frames[0])}" if frames else NO_STACK

    def merged(self, user: FamilyRules) -> FamilyRules:
        """``user`` first (same name replaces), skip lists added, depth overridden."""
        names = {f.name for f in user.families}
        return FamilyRules(
            families=list(user.families) + [f for f in self.families if f.name not in names],
            skip_modules=self.skip_modules + user.skip_modules,
            skip_symbols=self.skip_symbols + user.skip_symbols,
            depth=user.depth or self.depth,
        )


def _family_label(frame: FrameLike) -> str:
    """An unclaimed family's name: the function alone when it has one, never its module -- the
    executable's name changes with a rebuild or a rename, and a diff would read every family as new."""
    sym, _ = split_label(frame if not isinstance(frame, dict | Frame) else (
        frame.get("function") if isinstance(frame, dict) else frame.function, None))
    return sym if sym else _label(frame)


def _label(frame: FrameLike) -> str:
    if isinstance(frame, str):
        return frame
    if isinstance(frame, dict):
        frame = Frame.from_json(frame)
    if isinstance(frame, Frame):
        return frame.name()
    sym, mod = split_label(frame)
    return f"{sym} ({mod})" if sym and mod else (sym or mod or "?")


def _str_list(value: Any, where: str, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{source}: {where} must be a list of glob strings")
    return tuple(value)


def parse_rules(doc: Any, source: str) -> FamilyRules:
    """Validate a rules document (already YAML-loaded); every problem is one line naming ``source``."""
    if doc is None:
        return FamilyRules(depth=0)
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected a mapping with 'families' and/or 'skip'")
    unknown = set(doc) - {"families", "skip", "depth"}
    if unknown:
        raise InputError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    families = []
    raw = doc.get("families") or []
    if not isinstance(raw, list):
        raise InputError(f"{source}: 'families' must be a list")
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            raise InputError(f"{source}: families[{i}] needs a 'name' string")
        name = item["name"].strip()
        fam = Family(name, _str_list(item.get("symbols"), f"families[{i}] ({name}).symbols", source),
                     _str_list(item.get("modules"), f"families[{i}] ({name}).modules", source))
        if not fam.symbols and not fam.modules:
            raise InputError(f"{source}: family {name!r} has neither 'symbols' nor 'modules'")
        families.append(fam)
    skip = doc.get("skip") or {}
    if not isinstance(skip, dict):
        raise InputError(f"{source}: 'skip' must be a mapping with 'modules' and/or 'symbols'")
    depth = doc.get("depth", 0)
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise InputError(f"{source}: 'depth' must be a non-negative integer")
    return FamilyRules(families, _str_list(skip.get("modules"), "skip.modules", source),
                       _str_list(skip.get("symbols"), "skip.symbols", source), depth)


def load_file(path: Path | str) -> FamilyRules:
    import yaml  # here: not on a capture's start (issue 21, item 6)

    p = Path(path)
    try:
        text = read_user_text(p, "family rules file")
    except OSError as e:
        raise InputError(f"{p}: cannot read family rules: {e.strerror or e}") from None
    try:
        doc = load_yaml(text, str(p))
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise InputError(f"{p}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    return parse_rules(doc, str(p))


@lru_cache(maxsize=1)
def builtin_rules() -> FamilyRules:
    return load_file(BUILTIN_RULES)


def load_rules(user_file: Path | str | None = None) -> FamilyRules:
    """The built-in rules, with a user's file merged on top when given."""
    base = builtin_rules()
    return base.merged(load_file(user_file)) if user_file is not None else base


def classify(frames: Sequence[FrameLike]) -> str:
    """The family of one stack under the built-in rules (for live views and quick use)."""
    return builtin_rules().classify(frames)
