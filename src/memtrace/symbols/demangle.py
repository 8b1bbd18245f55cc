"""Readable names for mangled ones: C++ (Itanium, Mach-O's extra ``_`` too), Swift and Rust.

pydemumble wraps demumble (LLVM's Itanium and Microsoft demanglers plus Swift's own), so names
from ELF, Mach-O, dSYMs and older agents' rows all come out the way ``c++filt`` / ``swift
demangle`` print them.  A name that is not mangled (C, Objective-C) is returned unchanged.
"""

from __future__ import annotations

import functools

import pydemumble

# Prefixes of mangled names: Itanium (_Z, Mach-O __Z), Swift 4+ ($s/$S, Mach-O _$s), Swift 3 (_T0),
# Rust v0 (_R).  Checking first keeps plain C names (most frames) away from the demangler.
_MANGLED_PREFIXES = ("_Z", "__Z", "$s", "$S", "_$s", "_$S", "$e", "_$e", "_T0", "_R")


def looks_mangled(name: str) -> bool:
    return name.startswith(_MANGLED_PREFIXES)


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """``_ZN4PoolIdE4fillEid`` -> ``Pool<double>::fill(int, double)``; anything else unchanged."""
    if not looks_mangled(name):
        return name
    return pydemumble.demangle(name) or name
