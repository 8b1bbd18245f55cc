"""One symbolization service for every tracer, the console, JSON and the report.

Addresses are resolved on the host from the modules' files and their separate debug files
(ELF build-id / .gnu_debuglink, Mach-O dSYMs): function names, file:line and inlined calls
through Sentry's symbolic.  Rows keep names as the binaries spell them; readers demangle them
(C++, Swift, Rust) through pydemumble.  Local targets use it at capture time; ``memtrace
symbolize`` re-runs it over any capture later.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memtrace.symbols.demangle import demangle, looks_mangled

if TYPE_CHECKING:
    from memtrace.symbols.locate import ModuleRef, Source
    from memtrace.symbols.service import HostSymbolizer, Symbolizer

__all__ = ["HostSymbolizer", "ModuleRef", "Source", "Symbolizer", "demangle", "looks_mangled"]

# The symbolizer (symbolic, pyelftools) is imported when first asked for: a reader that only
# demangles (analyze.symbols) and a capture's start do not pay for it (issue 21, item 6).
_LAZY = {"ModuleRef": "memtrace.symbols.locate", "Source": "memtrace.symbols.locate",
         "HostSymbolizer": "memtrace.symbols.service", "Symbolizer": "memtrace.symbols.service"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
