"""A tracer's summary folded while its capture is written, instead of read back at the end.

A tracer command prints the summary of the capture it has just written.  Reading the whole
capture back for it (decompressing every drain, decoding every agent record again) was about
half of the host's CPU of a run, paid after the target ended -- 1 s for CPython's 1.6 MB capture
(issue 21: fixed cost).  The records pass through the host as they are written: the writer hands
each piece of the file it appends (:attr:`memtrace.capture.CaptureWriter.observer`) to a
:class:`SummaryFold`, whose thread decodes them as :func:`memtrace.capture.read_records` would
read them from the file (:func:`memtrace.capture.frame_records`) and feeds them to the tracer's
own ``summarize``: the summary is the one a read of the finished file makes, built meanwhile.
A short local target's records are held unwritten while it runs (capture_loop, _start_quiet), and
its fold starts with the end's work instead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from memtrace.capture import CaptureInfo, Record, frame_records


class SummaryFold:
    """``summarize`` (a tracer's: records in, summary out) run on a thread of its own over the
    records of one capture as its writer appends them.

    :meth:`feed` is the writer's observer; :meth:`start` lets the thread run (until then the pieces
    wait: the summary's modules are not imported, nor its work done, before the target runs);
    :meth:`result`, once the writer is closed, is the summary -- or None when the fold failed, and
    the caller reads the capture back as before."""

    def __init__(self, summarize: Callable[[Iterable[Record]], Any], path: Path) -> None:
        self._summarize = summarize
        self._path = path
        self.info = CaptureInfo(path)       # what the fold skipped, as a read of the file would say
        self._pieces: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()     # None: closed
        self._thread: threading.Thread | None = None
        self._summary: Any = None
        self._failed = False
        self._finished = False
        self._closed = False

    def feed(self, piece: bytes) -> None:
        if not self._finished and not self._closed:
            self._pieces.put(piece)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="memtrace-summary")
            self._thread.start()

    def close(self) -> None:
        """The capture is closed: nothing more comes (idempotent)."""
        if not self._closed:
            self._closed = True
            self._pieces.put(None)

    def result(self) -> Any:
        """The summary of everything fed (closes the fold and waits for its thread)."""
        self.close()
        self.start()
        assert self._thread is not None
        self._thread.join()
        return None if self._failed else self._summary

    def damage(self) -> str | None:
        """Why the records folded are not all the writer wrote (records skipped as damaged, a
        stack used but never defined), in one phrase; None when nothing was lost."""
        return self.info.damage

    def _run(self) -> None:
        try:
            self._summary = self._summarize(frame_records(self._until_done(), self._path, self.info))
        except Exception:  # noqa: BLE001 -- the summary is then read back from the file, which says what is wrong
            self._failed = True
        finally:
            self._finished = True       # (a summarize that stopped reading: what is still fed is of no use)

    def _until_done(self) -> Iterator[bytes]:
        while (piece := self._pieces.get()) is not None:
            yield piece
