"""What a capture says about how its hooks went in and out: the warnings of a patch made or code
freed without a clear stop (agents/runtime/world.js's words)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memtrace.capture import RecordType

# "... the agent unloads regardless", "... hooks in: not patched", "... with the world running".
UNCLEAN_STOP_WORDS = ("unloads regardless", "not patched", "world running")


def unclean_stop_warnings(records: Iterable[Any]) -> list[str]:
    """The capture's warnings that say a patch or an unload went without a clear stop."""
    warnings = [r.body.get("message", "") for r in records if r.type == RecordType.WARNING]
    return [w for w in warnings if any(k in w for k in UNCLEAN_STOP_WORDS)]
