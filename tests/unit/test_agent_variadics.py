"""Every NativeFunction an agent makes for a variadic C function declares its variadic part.

On Apple arm64 variadic arguments are passed on the stack (Apple, "Writing ARM64 code for Apple
platforms"): a NativeFunction declared without ``'...'`` passes them in registers, and the callee
reads a stale stack slot instead (``fcntl(fd, F_GETPATH, buf)`` would copy 1 KB to a wrong address).
"""

from __future__ import annotations

import re

from memtrace.agentbuild import AGENT_DIR

# Variadic in <fcntl.h>, <sys/ioctl.h>, <unistd.h>: the callees an agent may reach.
VARIADIC = ("fcntl", "open", "openat", "ioctl", "syscall", "prctl")


def _native_functions(text: str) -> list[tuple[str, str]]:
    """(callee variable, argument list) of every ``new NativeFunction(var, ret, [args])``."""
    return re.findall(r"new NativeFunction\((\w+),\s*'[^']*',\s*(\[[^\]]*\])", text)


def _callee_names(text: str, var: str) -> set[str]:
    """The C names a variable was looked up by (``const fcntlP = findExport('fcntl')`` and alike)."""
    return set(re.findall(rf"\b{var}\s*=\s*[\w.]*(?:Export|export)\w*\('([\w$]+)'", text))


def test_variadic_callees_declare_their_variadic_part() -> None:
    checked = 0
    for path in sorted(AGENT_DIR.rglob("*.js")):
        text = path.read_text()
        for var, args in _native_functions(text):
            names = _callee_names(text, var)
            if names & set(VARIADIC):
                checked += 1
                assert "'...'" in args, f"{path.name}: NativeFunction for {sorted(names)} lacks '...': {args}"
    assert checked >= 2      # fds.js: fcntl (Darwin census); runtime/platform.js: syscall (/proc listings)
