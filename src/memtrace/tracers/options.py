"""Options declared once: the same declaration makes the click option and checks a batch plan key.

An :class:`Option` names a value (``stack_threshold``), its type (a click parameter type, so the
command line and a plan convert and range-check it the same way), its default, an extra check
and its help.  ``agent_key`` says where the value goes in the agent's configuration; options
without one stay on the host (``top``, ``markdown``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from memtrace.errors import InputError

Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Option:
    name: str                            # keyword and plan key: stack_threshold
    type: Any                            # click.ParamType (or a Python type click knows)
    default: Any
    help: str
    agent_key: str | None = None         # key in the agent's config; None: a host-side option
    metavar: str | None = None
    is_flag: bool = False
    check: Check | None = None           # beyond the type: returns the problem, or None
    aliases: tuple[str, ...] = ()        # extra flags, e.g. frida-tools' "-p"
    in_plans: bool = True                # False: command line only (--json, --out, ...)
    show_default: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def decorator(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The click option for this declaration."""
        kw: dict[str, Any] = {"help": self.help, "default": self.default}
        if self.is_flag:
            kw["is_flag"] = True
        else:
            kw["type"] = self.type
            kw["show_default"] = self.show_default
            if self.metavar:
                kw["metavar"] = self.metavar
        if self.check is not None:
            kw["callback"] = self._click_check
        return click.option(self.flag, *self.aliases, self.name, **kw)

    def _click_check(self, ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        problem = self.check(value) if self.check is not None and value is not None else None
        if problem:
            raise click.BadParameter(f"{_show(value)}: {problem}")
        return value

    def convert(self, value: Any, where: str) -> Any:
        """A plan's value, converted and checked exactly as the command line would."""
        if self.is_flag:
            if not isinstance(value, bool):
                raise InputError(f"{where}: {self.name}: expected true or false, got {_show(value)}")
            return value
        if isinstance(value, dict | list | tuple) and not _takes_sequences(self.type):
            raise InputError(f"{where}: {self.name}: expected a single value, got {_show(value)}")
        param_type = click.types.convert_type(self.type)
        if isinstance(value, bool) and not isinstance(param_type, click.types.BoolParamType):
            raise InputError(f"{where}: {self.name}: expected {param_type.name}, got {_show(value)}")
        try:
            converted = param_type.convert(value, None, None)
        except click.BadParameter as e:
            raise InputError(f"{where}: {self.name}: {e.format_message()}") from None
        self.validate(converted, where)
        return converted

    def validate(self, value: Any, where: str | None = None) -> None:
        if self.check is None or value is None:
            return
        problem = self.check(value)
        if problem:
            raise InputError(f"{where + ': ' if where else ''}{self.flag} {_show(value)}: {problem}")


def _takes_sequences(param_type: Any) -> bool:
    return isinstance(param_type, click.Tuple)


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


# ---- checks shared by several declarations ----------------------------------------------------


def at_least(low: float) -> Check:
    def check(value: Any) -> str | None:
        return None if value >= low else f"must be {low:g} or more"
    return check


def positive(value: Any) -> str | None:
    # nan compares false with everything: refuse it here, where a window would otherwise never end.
    return None if value > 0 and value != float("inf") else "must be a positive, finite number"


def finite_non_negative(value: Any) -> str | None:
    return None if 0 <= value < float("inf") else "must be zero or a positive, finite number"


# ---- applying declarations ----------------------------------------------------------------------


def apply(options: Iterable[Option], fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``fn`` with every option, first declared shown first in --help."""
    for opt in reversed(list(options)):
        fn = opt.decorator()(fn)
    return fn


def agent_config(options: Iterable[Option], values: Mapping[str, Any]) -> dict[str, Any]:
    """The values that go to the agent, under their agent keys (defaults filled in)."""
    out: dict[str, Any] = {}
    for opt in options:
        if opt.agent_key is not None:
            value = values.get(opt.name, opt.default)
            out[opt.agent_key] = str(value) if isinstance(value, Path) else value
    return out


def convert_plan_values(options: Iterable[Option], raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A plan's ``options:`` mapping, each key a declared option, each value checked as on the command line."""
    by_name = {o.name: o for o in options if o.in_plans}
    unknown = sorted(k for k in raw if k not in by_name)
    if unknown:
        raise InputError(f"{where}: unknown option(s) {', '.join(map(str, unknown))} "
                         f"(known: {', '.join(sorted(by_name)) or 'none'})")
    return {k: by_name[k].convert(v, where) for k, v in raw.items()}
