"""speedscope's file format (https://www.speedscope.app/file-format-schema.json): one sampled
profile per view the capture has, weights in bytes."""

from __future__ import annotations

import json
from typing import Any

from memtrace.views.profile import profile

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def document(loaded: Any, view: str | None = None) -> dict[str, Any]:
    frames: list[dict[str, Any]] = []
    index: dict[tuple[Any, ...], int] = {}
    profiles = []
    for v in [view] if view else loaded.tracer.views:
        p = profile(loaded, v)
        if p.missing or not p.samples:
            continue
        samples, weights = [], []
        for s in p.samples:
            stack = []
            for f in reversed(s.frames):            # speedscope: root first
                key = f.key()
                i = index.get(key)
                if i is None:
                    i = index[key] = len(frames)
                    entry: dict[str, Any] = {"name": f.name()}
                    if f.file:
                        entry["file"] = f.file
                        if f.line:
                            entry["line"] = f.line
                    frames.append(entry)
                stack.append(i)
            samples.append(stack)
            weights.append(s.bytes)
        profiles.append({"type": "sampled", "name": f"{p.target or loaded.path.parent.name} — {v} bytes",
                         "unit": "bytes", "startValue": 0, "endValue": sum(weights),
                         "samples": samples, "weights": weights})
    return {"$schema": SCHEMA, "shared": {"frames": frames}, "profiles": profiles,
            "name": f"memtrace {loaded.tracer.name}: {loaded.path}", "activeProfileIndex": 0,
            "exporter": "memtrace"}


def export(loaded: Any, view: str) -> bytes:
    # Every view the capture has, the asked-for one first, so speedscope opens on it.
    doc = document(loaded)
    doc["profiles"].sort(key=lambda pr: 0 if pr["name"].endswith(f"— {view} bytes") else 1)
    return json.dumps(doc, ensure_ascii=False).encode()
