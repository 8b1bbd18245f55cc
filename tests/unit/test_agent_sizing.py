"""Darwin's agent sizing: app extensions are jetsammed in the tens of MB."""

from __future__ import annotations

from memtrace import layout, tracers
from memtrace.tracers.malloc import AGENT_DEFAULTS, AGENT_SIZING_DARWIN

MALLOC = tracers.all_tracers()["malloc"]
agent_config_for = MALLOC.agent_config

SLOT_BYTES, GLOBALS_BYTES, CORE_BYTES, DEFS_BYTES = 2048, 65536, 4096, 1 << 20   # runtime/core.js


def reserved(config: dict, darwin: bool = False) -> int:
    """Bytes the core maps for a config, as runtime/core.js does (the default mode: no rings)."""
    stacks = config["stackTable"]
    min_buckets = 1 << (layout.LIVE_MIN_BUCKET_BITS_DARWIN if darwin else layout.LIVE_MIN_BUCKET_BITS)
    buckets = max(min_buckets, config["liveTable"] // layout.LIVE_WAYS)
    rows = stacks + len(layout.PSEUDO_STACKS)
    lanes = config.get("aggLanes", 4)
    rings = config["rings"] * config["ringKb"] * 1024 if config.get("events") else 0
    return (GLOBALS_BYTES + CORE_BYTES + config["threadSlots"] * SLOT_BYTES + rings
            + stacks * (8 + 4) + DEFS_BYTES                                          # stack table, list, definitions
            + buckets * (layout.LIVE_WAYS * layout.LIVE_ENTRY.size + 4 + 1)                  # live table, locks, spills
            + rows * (lanes * layout.AGG_STRIDE * 8 + 1 + 1                              # rows (hot, cold), marks, dirty
                      + (layout.AGG_SHIPPED_HOT + layout.AGG_COLD) * 8 + 8))              # shipped (hot, cold), live


def test_darwin_targets_get_small_tables_and_user_options_still_win() -> None:
    linux, darwin = agent_config_for("linux", {}), agent_config_for("darwin", {})
    assert linux == AGENT_DEFAULTS
    assert reserved(linux) > 64 << 20
    assert reserved(darwin, darwin=True) < 8 << 20
    assert reserved({**darwin, "events": True}, darwin=True) < 12 << 20
    assert agent_config_for("darwin", {"ringKb": 1024})["ringKb"] == 1024
    assert agent_config_for("darwin", {"liveThreshold": 1})["liveThreshold"] == 1
    assert agent_config_for(None, {}) == AGENT_DEFAULTS


def test_only_malloc_is_sent_mallocs_defaults() -> None:
    # The core's sizing and thresholds are malloc's: every other tracer's agent gets its own options only.
    for t in tracers.all_tracers().values():
        config = t.agent_config("darwin", {"censusAt": 5, "top": None})
        if t.name == "malloc":
            assert config == {**AGENT_DEFAULTS, **AGENT_SIZING_DARWIN, "censusAt": 5}
        else:
            assert config == {"censusAt": 5}, t.name
            assert not set(t.agent_config("linux", {})) & set(AGENT_DEFAULTS), t.name
