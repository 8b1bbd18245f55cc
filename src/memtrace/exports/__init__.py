"""Exports of one capture for other tools (``memtrace export --format ...``).

Each format is one function ``(loaded, view) -> bytes``; jsonl (every record) stays in
``commands/export.py``, which dispatches the others here.  The stack formats read
:func:`memtrace.views.profile.profile`, so their totals are the summary's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memtrace.exports import chrome, folded, parquet, pprof, speedscope

Writer = Callable[[Any, str], bytes]

FORMATS: dict[str, Writer] = {
    "collapsed": folded.export,
    "speedscope": speedscope.export,
    "pprof": pprof.export,
    "chrome-trace": chrome.export,
    "parquet": parquet.export,          # optional: needs pyarrow (memtrace[parquet])
}
BINARY = frozenset({"pprof", "parquet"})
