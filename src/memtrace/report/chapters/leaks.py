"""The Leaks chapter: what each target leaked, on every line that can tell.

malloc (--leaks): blocks no pointer reaches any more, by allocating stack; fds: descriptors
created in the window and still open at its end, by opening stack; threads: joinable threads
that exited without being joined or detached, by creating stack.  The chapter reads the other
chapters' aggregates (``target[tracer]``) and adds a finding that names each leak.
"""

from __future__ import annotations

from typing import Any

from memtrace.analyze.leaks import examined_text, leak_no_stack, skipped_text
from memtrace.report.chapters import frames_cell
from memtrace.reporters.markdown import cell, table
from memtrace.reporters.markdown import lines as cell_lines
from memtrace.units import fmt_bytes, plural

SHOWN = 5


def _malloc(t: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    m = t.get("malloc")
    if not m:
        return []
    return [(t["target"] if m["captures"] == 1 else f"{t['target']} ({r['path']})", r["leaks"])
            for r in m["runs"] if r.get("leaks")]


def _fds(t: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in t.get("fds") or [] if (e.get("open_at_end") or {}).get("count")]


def _threads(t: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in t.get("threads") or [] if (e.get("leaked") or {}).get("count")]


def _where(frames: list[Any]) -> str:
    names = [f.get("function") or f.get("module") or "?" for f in frames[:3]] if frames else ["(no stack)"]
    return " ← ".join(names)


def findings(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items = []
    for t in targets:
        for label, lk in _malloc(t):
            g = lk["leaked"]
            if not g["blocks"]:
                continue
            top = g["by_stack"][0] if g["by_stack"] else None
            where = f", most at {_where(top['frames'])} ({top['blocks']:,} blocks, {fmt_bytes(top['bytes'])})" if top else ""
            items.append({"target": label, "line": "malloc", "count": g["blocks"], "bytes": g["bytes"],
                          "text": f"{label}: malloc leaked {g['blocks']:,} blocks, {fmt_bytes(g['bytes'])}{where}"})
        for e in _fds(t):
            o = e["open_at_end"]
            top = o["by_stack"][0] if o["by_stack"] else None
            where = f", most from {_where(top['frames'])} ({top['count']:,})" if top else ""
            items.append({"target": t["target"], "line": "fds", "count": o["count"],
                          "text": f"{t['target']}: {o['count']:,} file descriptors opened in the window and "
                                  f"still open at its end{where}"})
        for e in _threads(t):
            lk = e["leaked"]
            top = lk["by_stack"][0] if lk["by_stack"] else None
            where = f", most created at {_where(top['frames'])} ({top['count']:,})" if top else ""
            items.append({"target": t["target"], "line": "threads", "count": lk["count"],
                          "text": f"{t['target']}: {lk['count']:,} leaked threads (exited, never joined nor "
                                  f"detached){where}"})
    if not items:
        return []
    return [{"kind": "leaks", "title": "leaks",
             "text": "Memory no pointer reaches, descriptors never closed, threads never joined: each is held until "
                     "the process dies.", "items": items}]


def markdown(targets: list[dict[str, Any]]) -> list[str]:
    rows = []
    for t in targets:
        mallocs = _malloc(t)
        fds = [e["open_at_end"]["count"] for e in t.get("fds") or []]
        threads = [e["leaked"]["count"] for e in t.get("threads") or []]
        if not mallocs and not fds and not threads:
            continue
        malloc_cell = cell_lines(
            f"{lk['leaked']['blocks']:,} blocks, {fmt_bytes(lk['leaked']['bytes'])}"
            + ("" if lk["scan"]["complete"] else " (scan incomplete)") for _, lk in mallocs) or (
            "not scanned (no --leaks)" if t.get("malloc") else "not traced")
        reach = cell_lines(f"{lk['reachable']['blocks']:,} blocks, {fmt_bytes(lk['reachable']['bytes'])}"
                           for _, lk in mallocs) or "—"
        rows.append([t["target"], malloc_cell, reach, " / ".join(f"{n:,}" for n in fds) or "not traced",
                     " / ".join(f"{n:,}" for n in threads) or "not traced"])
    if not rows:
        return []
    lines = ["## Leaks", "",
             "malloc: the --leaks scan (a conservative reachability scan in the target, as valgrind memcheck's "
             "and LeakSanitizer's): leaked = definitely lost (no pointer from live memory -- threads' stacks and "
             "registers, modules' data, TLS, mappings that are not the allocator's heap -- nor from any other "
             "block) + indirectly lost (pointed at only from lost blocks), cycles included; what valgrind "
             "--leak-check=full counts as lost. fds: opened in the window, still open at its end. "
             "threads: exited without being joined or detached.", ""]
    lines += table(["target", "malloc leaked", "malloc still reachable", "fds still open", "threads leaked"],
                   "lrrrr", rows)
    for t in targets:
        for label, lk in _malloc(t):
            if lk["leaked"]["by_stack"]:
                lines += [f"### {cell(label)}: leaked malloc blocks, by allocating stack", ""]
                lines += table(["bytes", "blocks", "frames (innermost first)"], "rrl",
                               [[fmt_bytes(r["bytes"]), f"{r['blocks']:,}",
                                 frames_cell(r["frames"]) if r["frames"] else leak_no_stack(r)]
                                for r in lk["leaked"]["by_stack"][:SHOWN]])
            if lk.get("definitely_lost") is not None:
                lines += [f"{cell(label)}: definitely lost {lk['definitely_lost']['blocks']:,} blocks "
                          f"({fmt_bytes(lk['definitely_lost']['bytes'])}), indirectly lost "
                          f"{lk['indirectly_lost']['blocks']:,} ({fmt_bytes(lk['indirectly_lost']['bytes'])}), "
                          f"possibly lost {lk['possibly_lost']['blocks']:,} "
                          f"({fmt_bytes(lk['possibly_lost']['bytes'])}, not counted as leaked). "
                          f"Examined: {examined_text(lk['scan'])}.", ""]
            scan = lk["scan"]
            skipped = skipped_text({k: v for k, v in (scan.get("skipped") or {}).items()
                                    if k != "candidates_over_capacity"}, fmt_bytes)
            note = (f"Scan at {scan['when']}: {plural(scan['threads_stopped'] or 0, 'thread')} stopped"
                    + (f", {scan['threads_not_stopped']} could not be" if scan.get("threads_not_stopped") else "")
                    + f"; {fmt_bytes(scan['root_bytes'])} of roots and {fmt_bytes(scan['block_bytes'])} of blocks read"
                    + (f"; world stopped {scan['world_stopped_ms']:,} ms, scanning {scan.get('scan_ms') or 0:,} ms"
                       if scan.get("world_stopped_ms") is not None else "")
                    + ("" if scan["complete"] else "; INCOMPLETE: the time budget ran out, leaked means possibly leaked")
                    + ("; not read: " + ", ".join(skipped) if skipped else "") + ".")
            lines += [f"{cell(label)}: {note}", ""]
    return lines
