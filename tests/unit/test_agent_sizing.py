"""Darwin's agent sizing: app extensions are jetsammed in the tens of MB."""

from __future__ import annotations

from memtrace.capture_loop import AGENT_DEFAULTS, agent_config_for

SLOT_BYTES, LIVE_WAYS = 1024, 8


def reserved(config: dict) -> int:
    """Bytes the core maps for a config (runtime/core.js: rings, slots, stack table, live table)."""
    return (config["rings"] * config["ringKb"] * 1024 + config["threadSlots"] * SLOT_BYTES
            + config["stackTable"] * 8 + config["liveTable"] * 8 + 2 * (config["liveTable"] // LIVE_WAYS) * 4)


def test_darwin_targets_get_small_tables_and_user_options_still_win() -> None:
    linux, darwin = agent_config_for("linux", {}), agent_config_for("darwin", {})
    assert linux == AGENT_DEFAULTS
    assert reserved(linux) > 64 << 20
    assert reserved(darwin) < 8 << 20
    assert agent_config_for("darwin", {"ringKb": 1024})["ringKb"] == 1024
    assert agent_config_for("darwin", {"liveThreshold": 1})["liveThreshold"] == 1
    assert agent_config_for(None, {}) == AGENT_DEFAULTS
