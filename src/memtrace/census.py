"""Census collection: every process's memory, measured from outside (no agent in the measured processes).

Linux: /proc/PID/status, /proc/PID/smaps_rollup, /proc/PID/oom_score_adj and the cgroup
memory limit. Footprint on Linux = RssAnon + VmSwap: the anonymous memory the process owns,
resident or swapped out -- what the kernel cannot reclaim by dropping file pages, the
closest analogue of Darwin's phys_footprint (which likewise excludes clean file-backed
pages and includes compressed ones). ``lifetime_max`` is VmHWM (peak RSS, file pages
included, so an upper bound of the peak footprint); ``reusable`` is smaps_rollup LazyFree
(MADV_FREE pages, the Linux counterpart of Darwin's reusable pages).

A process that exits mid-scan is listed with status "vanished"; one whose files cannot be read
with status "denied" (or "partial" when only smaps_rollup is closed). Neither stops the scan.

iOS: ``agents/census.js`` in a single host process (default: Frida's system session inside
frida-server). DEVICE-UNVERIFIED, see docs/census-limit-jetsam.md.

The result is the census document described in :mod:`memtrace.analyze.census`.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace.analyze import census as analysis

Reader = Callable[[Path], str]
# cgroup v1 reports "no limit" as a page-rounded LONG_MAX; anything this large is unlimited.
V1_UNLIMITED = 1 << 62


def read_text(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def parse_kb_fields(text: str) -> dict[str, int]:
    """``Key:   123 kB`` lines (status, smaps_rollup) -> {Key: bytes}; other lines ignored."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * 1024
    return out


def parse_status_name(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("Name:"):
            return line[5:].strip()
    return None


def _is_kernel_thread(pid: int, status_text: str) -> bool:
    fields = dict(line.split(":", 1) for line in status_text.splitlines() if ":" in line)
    if fields.get("Kthread", "").strip() == "1":
        return True
    return pid == 2 or fields.get("PPid", "").strip() == "2"


# --- cgroups ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMount:
    version: int        # 1 or 2
    root: str           # the hierarchy path mounted at ``mountpoint`` (mountinfo field 4)
    mountpoint: Path


def parse_mountinfo(text: str) -> list[CgroupMount]:
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        sep = fields.index("-")
        if sep + 3 > len(fields):
            continue
        fstype, super_opts = fields[sep + 1], fields[sep + 3] if sep + 3 < len(fields) else ""
        root, mountpoint = fields[3], Path(fields[4].replace("\\040", " "))
        if fstype == "cgroup2":
            mounts.append(CgroupMount(2, root, mountpoint))
        elif fstype == "cgroup" and "memory" in super_opts.split(","):
            mounts.append(CgroupMount(1, root, mountpoint))
    return mounts


def parse_proc_cgroup(text: str) -> dict[int, str]:
    """/proc/PID/cgroup -> {1: memory-controller path (v1), 2: unified path}."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and parts[0] == "0":
            out[2] = path
        elif "memory" in controllers.split(","):
            out[1] = path
    return out


@dataclass(frozen=True)
class CgroupLimit:
    limit: int | None       # bytes; None = no limit anywhere up the hierarchy
    usage: int | None       # bytes charged to the cgroup that sets the limit
    path: str | None        # that cgroup's path (or the process's own when unlimited)
    version: int | None


def _cgroup_dir(mount: CgroupMount, path: str) -> Path | None:
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None  # the process's cgroup is outside what this namespace can see
    rel = path[len(root):].lstrip("/")
    return mount.mountpoint / rel if rel else mount.mountpoint


def _read_int(reader: Reader, path: Path) -> int | None | str:
    """An int, "max", or None when missing/unreadable."""
    try:
        text = reader(path).strip()
    except OSError:
        return None
    if text == "max":
        return "max"
    return int(text) if text.lstrip("-").isdigit() else None


def cgroup_limit(mounts: list[CgroupMount], cgroups: dict[int, str], reader: Reader = read_text) -> CgroupLimit:
    """The tightest memory limit over the process's cgroup and its ancestors (v2 first, then v1)."""
    best: CgroupLimit | None = None
    own: tuple[str, int] | None = None
    for mount in sorted(mounts, key=lambda m: -m.version):
        path = cgroups.get(mount.version)
        if path is None:
            continue
        directory = _cgroup_dir(mount, path)
        if directory is None:
            continue
        own = own or (path, mount.version)
        limit_file, usage_file = (("memory.max", "memory.current") if mount.version == 2
                                  else ("memory.limit_in_bytes", "memory.usage_in_bytes"))
        cg_path = path
        while True:
            limit = _read_int(reader, directory / limit_file)
            if isinstance(limit, int) and limit < V1_UNLIMITED and (best is None or best.limit is None
                                                                    or limit < best.limit):
                usage = _read_int(reader, directory / usage_file)
                best = CgroupLimit(limit, usage if isinstance(usage, int) else None, cg_path, mount.version)
            if directory == mount.mountpoint or directory == directory.parent:
                break
            directory = directory.parent
            cg_path = cg_path.rsplit("/", 1)[0] or "/"
    if best is not None:
        return best
    return CgroupLimit(None, None, own[0] if own else None, own[1] if own else None)


# --- Linux scan ------------------------------------------------------------------------------


class LinuxScanner:
    """Reads one /proc tree; ``reader`` is injectable so tests can make files vanish or deny."""

    def __init__(self, proc_root: Path = Path("/proc"), reader: Reader = read_text) -> None:
        self.proc_root = proc_root
        self.reader = reader
        self._cgroup_cache: dict[tuple[tuple[int, str], ...], CgroupLimit] = {}
        try:
            self.mounts = parse_mountinfo(reader(proc_root / "self" / "mountinfo"))
        except OSError:
            self.mounts = []

    def pids(self) -> list[int]:
        try:
            names = os.listdir(self.proc_root)
        except OSError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def _read(self, pid: int, name: str) -> str:
        return self.reader(self.proc_root / str(pid) / name)

    def limit_for(self, pid: int) -> CgroupLimit:
        cgroups = parse_proc_cgroup(self._read(pid, "cgroup"))
        key = tuple(sorted(cgroups.items()))
        if key not in self._cgroup_cache:
            self._cgroup_cache[key] = cgroup_limit(self.mounts, cgroups, self.reader)
        return self._cgroup_cache[key]

    def row(self, pid: int) -> dict[str, Any] | None:
        """One census row; None for kernel threads (no address space, nothing to measure)."""
        row: dict[str, Any] = {"pid": pid, "name": None, "status": "ok"}
        for key in ("footprint", "lifetime_max", "purgeable_volatile", "purgeable_nonvolatile",
                    "reusable", "graphics", "rss", "pss", "swap", "priority", "band", "limit",
                    "limit_source"):
            row[key] = None
        try:
            status_text = self._read(pid, "status")
        except (FileNotFoundError, ProcessLookupError):
            row["status"] = "vanished"
            return row
        except OSError:
            row["status"] = "denied"
            return row
        row["name"] = parse_status_name(status_text)
        status = parse_kb_fields(status_text)
        if "VmRSS" not in status:
            # No address space: a kernel thread (left out) or a zombie whose memory is gone.
            if _is_kernel_thread(pid, status_text):
                return None
            row["status"] = "vanished"
            return row
        row["rss"] = status["VmRSS"]
        row["swap"] = status.get("VmSwap", 0)
        row["footprint"] = status.get("RssAnon", 0) + row["swap"]
        row["lifetime_max"] = status.get("VmHWM")
        # The rest is optional: a file we may not read leaves its fields empty ("partial"); one
        # that is gone means the process is.
        denied = False
        for fill in (self._fill_rollup, self._fill_priority, self._fill_limit):
            try:
                fill(pid, row)
            except (FileNotFoundError, ProcessLookupError):
                row["status"] = "vanished"
                return row
            except OSError:
                denied = True
        if denied:
            row["status"] = "partial"
        return row

    def _fill_rollup(self, pid: int, row: dict[str, Any]) -> None:
        rollup = parse_kb_fields(self._read(pid, "smaps_rollup"))
        row["pss"] = rollup.get("Pss")
        row["reusable"] = rollup.get("LazyFree")

    def _fill_priority(self, pid: int, row: dict[str, Any]) -> None:
        adj = self._read(pid, "oom_score_adj").strip()
        row["priority"] = int(adj) if adj.lstrip("-").isdigit() else None
        row["band"] = analysis.linux_band(row["priority"])

    def _fill_limit(self, pid: int, row: dict[str, Any]) -> None:
        limit = self.limit_for(pid)
        row["limit"] = limit.limit
        row["limit_source"] = f"cgroup v{limit.version}:{limit.path}" if limit.limit is not None else None

    def scan(self) -> tuple[list[dict[str, Any]], int]:
        """(rows, number of kernel threads left out)."""
        rows: list[dict[str, Any]] = []
        kernel_threads = 0
        for pid in self.pids():
            row = self.row(pid)
            if row is None:
                kernel_threads += 1
            else:
                rows.append(row)
        return rows, kernel_threads


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def census_linux(proc_root: Path = Path("/proc"), reader: Reader = read_text) -> dict[str, Any]:
    rows, kernel_threads = LinuxScanner(proc_root, reader).scan()
    return {
        "kind": "census", "version": analysis.FORMAT_VERSION, "platform": "linux",
        "device": {"id": "local", "name": os.uname().nodename, "type": "local"},
        "time": _now(), "host_pid": None,
        "rows": rows, "totals": {**analysis.totals(rows), "kernel_threads": kernel_threads},
        "errors": {},
        "notes": ["Linux footprint = RssAnon + VmSwap; lifetime max = VmHWM (peak RSS); "
                  "reusable = LazyFree; band = oom_score_adj range; limit = tightest cgroup memory limit."],
    }


# --- iOS scan --------------------------------------------------------------------------------


def rows_from_agent(result: dict[str, Any], names: dict[int, str] | None = None,
                    os_version: str | None = None) -> list[dict[str, Any]]:
    """Normalise ``census.js`` output into census rows (pure; tested without a device).  Band names
    follow the device's scale (iOS 16+ priorities are ten times larger)."""
    names = names or {}
    table = analysis.darwin_band_table(os_version, (raw.get("priority") for raw in result.get("rows", [])))
    rows = []
    for raw in result.get("rows", []):
        pid = raw.get("pid")
        row = {
            "pid": pid, "name": names.get(pid) or raw.get("name"), "status": raw.get("status", "ok"),
            "footprint": raw.get("footprint"), "lifetime_max": raw.get("lifetime_max"),
            "purgeable_volatile": raw.get("purgeable_volatile"),
            "purgeable_nonvolatile": raw.get("purgeable_nonvolatile"),
            "reusable": raw.get("reusable"), "graphics": raw.get("graphics"),
            "rss": raw.get("rss"), "pss": None, "swap": None,
            "priority": raw.get("priority"), "band": analysis.darwin_band(raw.get("priority"), table),
            "limit": raw.get("limit"), "limit_source": "memorystatus" if raw.get("limit") else None,
            "state": raw.get("state"),
        }
        rows.append(row)
    return rows


def device_os_version(device: Any) -> str | None:
    """The device's OS version as frida-server reports it (``query_system_parameters``), or None."""
    try:
        os_info = device.query_system_parameters().get("os") or {}
    except Exception:  # noqa: BLE001 - an older frida-server: the priorities decide the scale
        return None
    version = os_info.get("version")
    return str(version) if version else None


def census_device(device: Any, host: str = "0") -> dict[str, Any]:
    """Run ``agents/census.js`` in one host process on an iOS device (DEVICE-UNVERIFIED)."""
    from memtrace.devices import find_pid
    from memtrace.frida_host import load_agent

    host_pid = int(host) if host.isdigit() else find_pid(device, host)
    session, script = load_agent(device, host_pid, "census")
    try:
        result = script.exports_sync.census()
    finally:
        try:
            script.unload()
            session.detach()
        except Exception:  # noqa: BLE001 - the device may already be gone; the data is what matters
            pass
    try:
        names = {p.pid: p.name for p in device.enumerate_processes()}
    except Exception:  # noqa: BLE001 - names are a nicety; proc_name already gave short ones
        names = {}
    os_version = device_os_version(device)
    rows = rows_from_agent(result, names, os_version)
    return {
        "kind": "census", "version": analysis.FORMAT_VERSION, "platform": "darwin",
        "device": {"id": device.id, "name": device.name, "type": device.type, "os_version": os_version},
        "time": _now(), "host_pid": host_pid,
        "rows": rows, "totals": analysis.totals(rows), "errors": result.get("errors", {}),
        "notes": ["DEVICE-UNVERIFIED: iOS census offsets are written from xnu headers; "
                  "graphics = task_vm_info ledger_tag_graphics_footprint (+compressed).",
                  "bands: " + ("xnu-8792+ scale (iOS 16+, FOREGROUND = 100)"
                               if analysis.darwin_band_table(os_version, (r["priority"] for r in rows))
                               is analysis.DARWIN_BANDS else "legacy scale (iOS 15 and earlier, FOREGROUND = 10)")
                  + ("" if os_version else ", chosen from the priorities seen (the OS version was not reported)")],
    }
