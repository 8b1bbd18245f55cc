"""One asyncio event loop on a thread of its own, for pymobiledevice3's clients.

pymobiledevice3 is asyncio throughout and its clients belong to the loop that made them; memtrace's
capture loop and commands are synchronous.  A :class:`ServiceLoop` owns the clients' loop and lets
synchronous code wait for a coroutine with a deadline: a device that stops answering is one line,
never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from memtrace.errors import TargetError

T = TypeVar("T")


class ServiceLoop:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float, what: str) -> T:
        """``coro`` run on the loop; a TargetError naming ``what`` past ``timeout`` seconds."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()
            raise TargetError(f"{what}: the device did not answer in {timeout:g} s") from None

    def soon(self, fn: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def close(self, last: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 10.0) -> None:
        """Run ``last()`` (closing the clients), then stop the loop and its thread."""
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(last(), self.loop).result(timeout=timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
