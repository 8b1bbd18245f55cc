"""Integration tests: real programs traced on Frida's local device through the real CLI.

Every test here is marked ``integration`` (the hook below), so a tier can be chosen by marker
expression: ``make test-fast`` runs the unit tests and only the integration tests marked
``smoke`` (a few representative ones, each a few seconds); ``make test`` runs them all.  See
CONTRIBUTING.md, "The test tiers".
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees the whole session's items: mark only this folder's.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
            # make test-fast leaves slow tests out, so a slow smoke test would silently run nowhere fast.
            if item.get_closest_marker("smoke") and item.get_closest_marker("slow"):
                raise pytest.UsageError(f"{item.nodeid} is marked both smoke and slow: a smoke test must be fast")
