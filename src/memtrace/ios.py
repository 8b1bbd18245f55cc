"""iOS device boundary: pull JetsamEvent reports (pymobiledevice3), and the device checks
``memtrace doctor`` runs on a real iPhone for what only a device can confirm.

pymobiledevice3 (v8+) is asyncio throughout: ``create_using_usbmux``/``create_using_tcp`` are
coroutines returning a lockdown client (an async context manager), and ``CrashReportsManager``
must be used with ``async with``; its ``ls(path, depth)`` and ``pull(out, entry, ...)`` are
coroutines; ``flush()`` asks the crash report mover to move pending reports into the folder first.
One ``asyncio.run`` drives the whole pull so nothing leaks between event loops.

Tests replace the two factories (``lockdown_factory``, ``manager_factory``); nothing else here
talks to a device.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace.errors import MemtraceError, TargetError

JETSAM_NAME = re.compile(r"^JetsamEvent.*\.ips$")
LOCKDOWN_PORT = 62078
# Reports live at the top of the crash-report folder; older devices move them to Retired/.
LIST_DEPTH = 2

LockdownFactory = Callable[["DeviceTarget"], Awaitable[Any]]
ManagerFactory = Callable[[Any], Any]


class DeviceTarget:
    """Where a lockdown client connects: usbmux (first device or one UDID) or TCP."""

    def __init__(self, udid: str | None = None, host: str | None = None, port: int | None = None) -> None:
        self.udid = udid
        self.host = host
        self.port = port

    def __repr__(self) -> str:
        if self.host:
            return f"remote:{self.host}:{self.port or LOCKDOWN_PORT}"
        return f"id:{self.udid}" if self.udid else "usb"


async def _default_lockdown(target: DeviceTarget) -> Any:
    """Bounded, and never pairing implicitly (launchers.NO_AUTOPAIR says why)."""
    from pymobiledevice3.lockdown import create_using_tcp, create_using_usbmux

    from memtrace.launchers import NO_AUTOPAIR, PMD3_TIMEOUTS, bounded

    connect: Any
    if target.host:
        connect = create_using_tcp(hostname=target.host, port=target.port or LOCKDOWN_PORT, **NO_AUTOPAIR)
    else:
        connect = create_using_usbmux(serial=target.udid, **NO_AUTOPAIR)
    return await bounded(connect, f"lockdown on {target!r}", PMD3_TIMEOUTS["lockdown"])


def _default_manager(lockdown: Any) -> Any:
    from pymobiledevice3.services.crash_reports import CrashReportsManager

    return CrashReportsManager(lockdown)


# One crash report (a few hundred KB) or the mover's flush: bounded, generously.
PULL_TIMEOUT_S = 120.0


async def _pull(target: DeviceTarget, out: Path, lockdown_factory: LockdownFactory,
                manager_factory: ManagerFactory) -> list[Path]:
    from memtrace.launchers import PMD3_TIMEOUTS, bounded

    wait = PMD3_TIMEOUTS["lockdown"]
    lockdown = await lockdown_factory(target)
    pulled: list[Path] = []
    async with lockdown, manager_factory(lockdown) as manager:
        # Reports still pending (a kill moments ago) are moved into the folder first, as the
        # crash report mover does for Xcode.
        await bounded(manager.flush(), "the crash report mover", PULL_TIMEOUT_S)
        entries = await bounded(manager.ls("/", LIST_DEPTH), "listing crash reports", wait)
        for entry in sorted(entries):
            name = posixpath.basename(entry)
            if not JETSAM_NAME.match(name):
                continue
            # pull() of a single file into an existing directory writes <out>/<basename>.
            await bounded(manager.pull(str(out), entry=entry, erase=False, progress_bar=False),
                          f"pulling {name}", PULL_TIMEOUT_S)
            local = out / name
            if local.is_file():
                pulled.append(local)
    return pulled


def pull_jetsam_reports(target: DeviceTarget, out: Path, *,
                        lockdown_factory: LockdownFactory | None = None,
                        manager_factory: ManagerFactory | None = None) -> list[Path]:
    """Copy every ``JetsamEvent*.ips`` from the device's crash reports into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(_pull(target, out, lockdown_factory or _default_lockdown,
                                 manager_factory or _default_manager))
    except TargetError:
        raise
    except Exception as e:  # pymobiledevice3 raises many unrelated types; the user needs one line.
        first = (str(e).splitlines() or [""])[0] or type(e).__name__
        raise TargetError(f"cannot pull crash reports from {target!r}: {first}") from e


# --- device checks (memtrace doctor) ------------------------------------------------------------
#
# What the Linux stand-in cannot confirm, asked of the device itself.  Each check takes the Frida
# device and an app's pid (or the UDID), loads the agent in question for a moment and reports one
# line; nothing is left behind (no hook stays, nothing is mounted).


@dataclass(frozen=True)
class DeviceCheck:
    name: str
    ok: bool
    detail: str


def _init_recon(device: Any, pid: int, agent: str, config: dict[str, Any]) -> dict[str, Any]:
    """An agent's ``init`` in ``pid`` (its recon of the symbols it wants, its info), then unloaded."""
    from memtrace.agentbuild import c_sources
    from memtrace.frida_host import load_agent

    session, script = load_agent(device, pid, agent)
    try:
        return dict(script.exports_sync.init(config, c_sources(agent)))
    finally:
        try:
            script.unload()
            session.detach()
        except Exception:  # noqa: BLE001 - the check's answer is already in hand
            pass


def _found(recon: list[dict[str, Any]]) -> dict[str, str]:
    return {r["name"]: r.get("module") or "?" for r in recon if r.get("status") == "found"}


def check_ca_hooks(device: Any, pid: int) -> DeviceCheck:
    """Issue 15 item 1: QuartzCore's CA::Render::Shmem::new_shmem / set_volatile overloads are found
    (Mach-O 'section' symbols in __TEXT, each overload by its mangled name)."""
    try:
        info = _init_recon(device, pid, "purgeable", {})
    except MemtraceError as e:
        return DeviceCheck("purgeable: Core Animation hooks", False, str(e))
    found = _found(info.get("recon", []))
    shmem = sorted(n for n in found if n.startswith("_ZN2CA6Render5Shmem"))
    ok = any("new_shmem" in n for n in shmem) and any("set_volatile" in n for n in shmem)
    return DeviceCheck("purgeable: Core Animation hooks", ok,
                       ", ".join(f"{n} ({found[n]})" for n in shmem) if shmem
                       else "no CA::Render::Shmem symbol found (the transitions underneath are still traced)")


def check_pressure_source(device: Any, pid: int) -> DeviceCheck:
    """Issue 15 item 5: the limit agent creates its own DISPATCH_SOURCE_TYPE_MEMORYPRESSURE source in
    the app (libdispatch forwards only MSL status to libmalloc's handler on iOS 17/18)."""
    from memtrace.frida_host import load_agent

    try:
        session, script = load_agent(device, pid, "limit")
    except MemtraceError as e:
        return DeviceCheck("limit: memory-pressure source", False, str(e))
    try:
        hooks = list(script.exports_sync.watch())
        script.exports_sync.unwatch()
    finally:
        try:
            script.unload()
            session.detach()
        except Exception:  # noqa: BLE001 - the answer is already in hand
            pass
    ok = any(h.startswith("dispatch_source(") for h in hooks)
    return DeviceCheck("limit: memory-pressure source", ok,
                       ", ".join(hooks) if hooks else "no dispatch source and no pressure hook could be set")


def check_iosurface_hooks(device: Any, pid: int) -> DeviceCheck:
    """Issue 15 item 14 / issue 23: IOSurface.framework's client layer is exported
    (IOSurfaceClientCreateChild for surfaces made without IOSurfaceCreate, the client accessors for
    their geometry, Lookup/Retain/Release + GetID for the reference count that decides a release)."""
    try:
        info = _init_recon(device, pid, "iosurface", {})
    except MemtraceError as e:
        return DeviceCheck("iosurface: client layer", False, str(e))
    found = _found(info.get("recon", []))
    wanted = ("IOSurfaceCreate", "IOSurfaceClientCreateChild", "IOSurfaceClientLookup", "IOSurfaceClientRetain",
              "IOSurfaceClientRelease", "IOSurfaceClientGetID", "IOSurfaceClientGetWidth", "IOSurfaceClientGetHeight",
              "IOSurfaceClientGetBytesPerRow", "IOSurfaceClientGetPixelFormat")
    missing = [n for n in wanted if n not in found]
    return DeviceCheck("iosurface: client layer", not missing,
                       "all found" if not missing else "missing: " + ", ".join(missing))


def check_runtime_facts(device: Any, pid: int) -> DeviceCheck:
    """Issue 23: the app's main image carries an LC_UUID readable in memory (host symbolization,
    dSYMs and the device's shared-cache symbols key on it), libSystem exports OSMemoryBarrier (the
    C core's full fence under TinyCC on arm64), and task_info(TASK_VM_INFO) accepts memtrace's
    exact count (the words filled say which revision the kernel has)."""
    from memtrace.frida_host import load_agent

    try:
        session, script = load_agent(device, pid, "iosurface")
    except MemtraceError as e:
        return DeviceCheck("runtime: UUID, fence, task_info", False, str(e))
    try:
        facts = dict(script.exports_sync.darwin_facts())
    finally:
        try:
            script.unload()
            session.detach()
        except Exception:  # noqa: BLE001 - the answer is already in hand
            pass
    parts, ok = [], True
    uuid = facts.get("uuid")
    parts.append(f"LC_UUID of {facts.get('main')}: {uuid}" if uuid else
                 f"{facts.get('main')}: no LC_UUID in memory (not a Mach-O image?)")
    ok &= bool(uuid)
    parts.append("OSMemoryBarrier: found" if facts.get("fence") else
                 "OSMemoryBarrier: missing (the C core's barriers on arm64 need it under TinyCC)")
    ok &= bool(facts.get("fence"))
    ti = facts.get("task_info")
    if not ti:
        parts.append("task_info: missing")
        ok = False
    elif ti["kr"] != 0:
        parts.append(f"task_info(TASK_VM_INFO, {ti['asked']}): kern_return {ti['kr']}")
        ok = False
    else:
        older = " (an older revision)" if ti["filled"] < ti["asked"] else ""
        parts.append(f"task_info(TASK_VM_INFO, {ti['asked']}): {ti['filled']} words filled{older}")
    return DeviceCheck("runtime: UUID, fence, task_info", ok, "; ".join(parts))


def check_device_symbols(udid: str) -> DeviceCheck:
    """Issue 23: this device's shared-cache symbols are on this machine (its Xcode DeviceSupport
    folder for the model, version and build), so ``memtrace symbolize --device-symbols`` can name
    system frames.  Fetches nothing."""
    from memtrace import launchers
    from memtrace.symbols import device as device_symbols

    async def probe() -> str | None:
        api = launchers.pmd3_api()
        async with launchers._Pmd3Session(api, udid) as provider:
            found = device_symbols.pmd3_symbols_api().find_device_support_symbols(provider)
        return None if found is None else str(found)

    name = "shared-cache symbols"
    try:
        found = asyncio.run(probe())
    except TargetError as e:
        return DeviceCheck(name, False, str(e))
    except Exception as e:  # noqa: BLE001 - pymobiledevice3 raises many types; one line for the user
        return DeviceCheck(name, False, (str(e).splitlines() or [""])[0] or type(e).__name__)
    if found is None:
        return DeviceCheck(name, False, f"not on this machine: memtrace symbolize CAPTURE --fetch-device-symbols {udid} "
                                        f"fetches them once for this OS build")
    return DeviceCheck(name, True, found)


def check_pmd3(udid: str) -> DeviceCheck:
    """Issue 15 item 8: pymobiledevice3 reaches DVT process control on this device (the RemoteXPC
    tunnel of a running tunneld on iOS 17+, lockdown below; the developer image mounted; unlocked).
    Mounts nothing: a launch with --launch pmd3 mounts the image itself."""
    from memtrace import launchers

    async def probe() -> str:
        api = launchers.pmd3_api()
        async with launchers._Pmd3Session(api, udid) as provider:
            try:
                async with launchers._within(api.DvtProvider(provider), "DVT", launchers.PMD3_TIMEOUTS["dvt"]):
                    pass
            except api.PasswordRequiredError:
                raise TargetError(launchers.LOCKED_MESSAGE) from None
            except api.NotPairedError:
                raise TargetError(launchers.NOT_PAIRED_MESSAGE) from None
            via = "tunnel" if launchers._major(provider.product_version) >= launchers.TUNNEL_SINCE_IOS else "lockdown"
            return f"iOS {provider.product_version}: DVT process control reachable over {via}"

    try:
        return DeviceCheck("--launch pmd3", True, asyncio.run(probe()))
    except TargetError as e:
        return DeviceCheck("--launch pmd3", False, str(e))
    except Exception as e:  # noqa: BLE001 - pymobiledevice3 raises many types; one line for the user
        first = (str(e).splitlines() or [""])[0] or type(e).__name__
        return DeviceCheck("--launch pmd3", False, f"DVT not reachable ({first}): is the developer disk image "
                                                   "mounted? (--launch pmd3 mounts it)")
