"""How a target comes to life before memtrace attaches: one interface, chosen with --launch.

    frida  Frida spawn (suspended) + resume: an app by bundle id, or a local program.
    pmd3   pymobiledevice3's DVT process control launches the app suspended and reports its pid;
           iOS 17+ through the RemoteXPC tunnel of a running tunneld, iOS 16 and earlier over
           lockdown, the developer disk image mounted first.  DEVICE-UNVERIFIED: written
           against pymobiledevice3 11.45's source, tested with fakes at that boundary.
    none   attach to what is already running (--pid, --name, or --app's running pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import frida

from memtrace import devices
from memtrace.errors import InputError, TargetError

LAUNCHERS = ("auto", "frida", "pmd3", "none")


@dataclass
class Launched:
    pid: int
    t_launch: float | None      # monotonic time of the launch; None when memtrace did not launch it
    suspended: bool             # still suspended: the engine resumes it after instrumenting
    spawned: bool               # memtrace started it (and so may kill it at the end)
    how: str
    # How to resume it when Frida did not spawn it, before Frida attaches (once attached, Frida's
    # resume is the one that releases it).
    resume: Callable[[], None] | None = None


class Launcher(Protocol):
    name: str

    def launch(self, device: frida.Device, target: Any, stdio_pipe: bool,
               env: dict[str, str] | None = None) -> Launched: ...


def choose(name: str, target: Any) -> Launcher:
    if name not in LAUNCHERS:
        raise InputError(f"--launch {name}: expected one of {', '.join(LAUNCHERS)}")
    if name == "auto":
        name = "none" if (target.pid is not None or target.name is not None) else "frida"
    if name == "pmd3":
        if not target.app:
            raise InputError("--launch pmd3 launches an app: give --app BUNDLE_ID")
        return Pmd3Launcher()
    if name == "none":
        return AttachLauncher()
    if target.pid is not None or target.name is not None:
        raise InputError(f"--launch {name} starts a new process: give --app or -- PROGRAM, not --pid/--name")
    return FridaLauncher()


class FridaLauncher:
    name = "frida"

    def launch(self, device: frida.Device, target: Any, stdio_pipe: bool,
               env: dict[str, str] | None = None) -> Launched:
        if target.app and device.type == "usb":
            # A locked iPhone refuses launches without saying so; ask lockdown first when it can tell.
            try:
                asyncio.run(_check_unlocked_usb(device.id))
            except TargetError:
                raise
            except Exception:  # noqa: BLE001 -- lockdown unreachable: the spawn error will speak
                pass
        if target.app:
            devices.require_ios_for_app(device, target.app)
        t = time.monotonic()
        try:
            if target.app:
                pid = device.spawn(target.app)
            else:
                argv = list(target.argv)
                program = argv[0]
                if device.type == "local" and "/" not in program:
                    # Frida spawns a path; a bare name is looked up on PATH as a shell would.
                    program = shutil.which(program) or program
                if device.type == "local":
                    check_local_program(program)
                # env: added to memtrace's own environment (the hold before constructors, memtrace.hold)
                extra: dict[str, Any] = {"env": env} if env else {}
                # argv as given, argv[0] included, as a shell passes it: Frida's default would be
                # the resolved path, and a program that reads its argv[0] (a multi-call binary, jq's
                # origin, a usage line) would run differently traced (jq allocated 16 B more).
                pid = device.spawn(program, argv=argv, stdio="pipe" if stdio_pipe else "inherit", **extra)
        except SPAWN_ERRORS as e:
            raise TargetError(f"cannot launch {target.describe()}: {_locked_hint(str(e))}") from None
        return Launched(pid, t, suspended=True, spawned=True, how="frida spawn")


# Everything Frida's spawn raises for a program or app it cannot start (a non-executable or
# unparsable file, a missing one, a refused launch, a device gone meanwhile).
SPAWN_ERRORS = (frida.ExecutableNotFoundError, frida.ExecutableNotSupportedError, frida.NotSupportedError,
                frida.PermissionDeniedError, frida.InvalidArgumentError, frida.ProcessNotFoundError,
                frida.InvalidOperationError, frida.TransportError, frida.ServerNotRunningError,
                frida.TimedOutError, frida.ProtocolError)


def check_local_program(path: str, shown: str | None = None) -> None:
    """Refuse, before anything starts, a local file Frida cannot instrument: not an executable
    file, or a statically linked program (no dynamic loader: Frida's injector crashes it, or
    aborts it with "Unable to locate the libc")."""
    import os

    shown = shown or path
    if not os.path.isfile(path):
        return                      # Frida's own "unable to find executable" says it
    if not os.access(path, os.X_OK):
        raise TargetError(f"cannot launch {shown}: not an executable file (no execute permission)")
    try:
        with open(path, "rb") as f:
            interp = _has_interp(f)
    except OSError:
        return
    if interp is False:
        raise TargetError(f"cannot trace {shown}: it is statically linked (no dynamic loader), and Frida can "
                          f"only instrument dynamically linked programs; rebuild it without -static")


def _has_interp(f: Any) -> bool | None:
    """Whether an ELF file has a PT_INTERP program header (a dynamic loader); None: not an ELF
    file (a script: its interpreter is what runs) or one too damaged to tell.  Read with struct,
    not pyelftools: this runs before every local launch (issue 21, item 6: its import was ~0.1 s)."""
    import struct

    head = f.read(64)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    wide, end = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide and len(head) < 64:
        return None
    if wide:        # Elf64_Ehdr: e_phoff at 32, e_phentsize and e_phnum at 54
        (phoff,), (phentsize, phnum) = struct.unpack_from(end + "Q", head, 32), struct.unpack_from(end + "HH", head, 54)
    else:           # Elf32_Ehdr: at 28 and 42
        (phoff,), (phentsize, phnum) = struct.unpack_from(end + "I", head, 28), struct.unpack_from(end + "HH", head, 42)
    if phnum == 0 or phentsize < 4 or phnum > 4096:
        return None if phnum else False
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    if len(table) < phentsize * phnum:
        return None
    return any(struct.unpack_from(end + "I", table, i * phentsize)[0] == 3 for i in range(phnum))   # PT_INTERP


SESSION_MARK = "/memfd:memtrace-session"      # agents/runtime/process.js, claimProcess
# A session that has stopped and is unloading (its mark says "ending") is waited for this long
# before a new one is refused: run back to back (a script, the storm's --pid cycles), the next
# session came while the last one's agent was still unloading on a loaded machine, and was refused.
ENDING_SESSION_WAIT_S = 10.0


def refuse_a_second_session(pid: int) -> None:
    """A local process another memtrace session marked (agents/runtime/process.js, claimProcess)
    is refused here, before Frida injects anything: the agent's own refusal came after a second
    injection, and injecting into a process whose threads run through the first session's hooks
    crashed it (SIGSEGV in Frida's loader, 2 runs in 8 at load 130; issue 27 item 1).  The mark's
    page holds the marking process's pid: a fork child's inherited mark is its parent's, not its
    own.  Then the marking agent's JavaScript thread: a mark whose thread is gone was left by a
    session that ended without taking it off (its teardown failed) -- stale, not refused (the new
    agent takes it off).  Then whether that session has stopped (ending): such a mark is waited
    for, at most ENDING_SESSION_WAIT_S, while its agent unloads.  A page that cannot be read is left
    to the agent to judge, as before."""
    deadline = time.monotonic() + ENDING_SESSION_WAIT_S
    while True:
        live = _live_marks(pid)
        if not live:
            return
        if not all(ending for ending in live) or time.monotonic() >= deadline:
            raise TargetError(f"another memtrace session is tracing process {pid}; one at a time (end the "
                              f"other, or wait for it)")
        time.sleep(0.02)


def _live_marks(pid: int) -> list[bool]:
    """The marks of live sessions in ``pid``: for each, whether its session has stopped and is
    unloading (the agent's stop rpc says so in the mark: its third word)."""
    import struct

    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            starts = [int(line.split("-", 1)[0], 16) for line in f if SESSION_MARK in line]
    except (OSError, ValueError):
        return []
    out: list[bool] = []
    for start in starts:
        try:
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                mem.seek(start)
                head = mem.read(12)
        except (OSError, ValueError, OverflowError):
            continue
        if len(head) != 12:
            continue
        owner, agent_tid, ending = struct.unpack("=III", head)
        if owner != pid:
            continue
        if agent_tid != 0 and not os.path.exists(f"/proc/{pid}/task/{agent_tid}"):
            continue        # stale: its session's agent is gone
        out.append(ending == 1)
    return out


class AttachLauncher:
    name = "none"

    def launch(self, device: frida.Device, target: Any, stdio_pipe: bool,
               env: dict[str, str] | None = None) -> Launched:
        if target.pid is not None:
            if not any(p.pid == target.pid for p in device.enumerate_processes()):
                raise TargetError(f"--pid {target.pid}: no such process on {device.name}")
            if devices.is_local(device):
                check_local_program(f"/proc/{target.pid}/exe", f"pid {target.pid}")
                refuse_a_second_session(target.pid)
            return Launched(target.pid, None, suspended=False, spawned=False, how="attach to pid")
        if target.name is not None:
            # Exact name first; two processes of that name are listed with their pids.
            pid = devices.find_pid(device, target.name)
            if devices.is_local(device):
                check_local_program(f"/proc/{pid}/exe", f"--name {target.name} (pid {pid})")
                refuse_a_second_session(pid)
            return Launched(pid, None, suspended=False, spawned=False, how="attach by name")
        if target.app:
            devices.require_ios_for_app(device, target.app)
            apps = [a for a in device.enumerate_applications(identifiers=[target.app]) if a.pid]
            if not apps:
                raise TargetError(f"--app {target.app}: not running (use --launch frida or pmd3 to start it)")
            return Launched(apps[0].pid, None, suspended=False, spawned=False, how="attach to running app")
        raise InputError("--launch none needs --pid, --name or --app")


class Pmd3Launcher:
    """Launch through Instruments' process control, as Xcode does.  DEVICE-UNVERIFIED.

    The app starts suspended (nothing runs before memtrace decides).  With ``--attach-delay`` > 0
    it is resumed through process control before the wait.  With ``--attach-delay 0`` Frida
    attaches to the suspended task: frida-core (darwin/frida-helper-backend.vala, ``_inject``)
    makes it a spawn instance, runs it to dyld's breakpoint and holds its main thread there until
    Frida's own ``resume(pid)`` -- so the capture resumes it through Frida once the agent is in,
    and process control's resume is not used (FridaHost.resume).  DEVICE-UNVERIFIED."""

    name = "pmd3"

    def launch(self, device: frida.Device, target: Any, stdio_pipe: bool,
               env: dict[str, str] | None = None) -> Launched:
        t = time.monotonic()
        try:
            pid = asyncio.run(pmd3_launch(device.id, target.app, suspended=True))
        except TargetError:
            raise
        except Exception as e:  # noqa: BLE001 -- any transport/service failure becomes one clear line
            raise TargetError(f"pymobiledevice3 could not launch {target.app}: {_locked_hint(str(e))}") from None

        def resume() -> None:
            try:
                asyncio.run(pmd3_resume(device.id, pid))
            except TargetError:
                raise
            except Exception as e:  # noqa: BLE001 -- one clear line
                raise TargetError(f"pymobiledevice3 could not resume pid {pid}: {_locked_hint(str(e))}") from None

        return Launched(pid, t, suspended=True, spawned=True, how="pymobiledevice3 DVT process control",
                        resume=resume)


# iOS 17 moved developer services behind the RemoteXPC tunnel (RSD).
TUNNEL_SINCE_IOS = 17

# Every pymobiledevice3 call that can wait is bounded (seconds): a device that stops answering, a
# half-open tunnel or a Trust dialog nobody taps must end in one line, never a hang.
PMD3_TIMEOUTS = {"lockdown": 15.0, "tunnel": 15.0, "mount": 180.0, "dvt": 20.0, "launch": 30.0, "close": 5.0}
# Never pair implicitly: pymobiledevice3's default (autopair=True, no pair timeout) blocks forever on
# an unpaired host waiting for the device's Trust dialog.  Pairing is the user's explicit step.
NO_AUTOPAIR: dict[str, Any] = {"autopair": False, "pair_timeout": PMD3_TIMEOUTS["lockdown"]}
NOT_PAIRED_MESSAGE = ("this host is not paired with the device: pair it once (python3 -m pymobiledevice3 lockdown "
                      "pair, then tap Trust on the device) and retry")
SIGNING_SERVER_MESSAGE = ("this host cannot reach Apple's signing server to mount the developer disk image "
                          "(iOS 17+ personalizes it online, from gs.apple.com): connect this host to the internet, "
                          "or mount it once where it can (python3 -m pymobiledevice3 mounter auto-mount)")
DEV_SIGNED_MESSAGE = ("the app must be development-signed (get-task-allow) for DVT to launch it; for an App Store "
                      "build use --launch frida on a jailbroken device")
START_TUNNELD = "start one (sudo python3 -m pymobiledevice3 remote tunneld) and retry"


async def bounded(awaitable: Any, what: str, seconds: float) -> Any:
    """``awaitable``, or a TargetError naming what did not answer."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        raise TargetError(f"pymobiledevice3: {what} did not answer within {seconds:g} s "
                          f"(is the device connected, unlocked and trusted?)") from None


@contextlib.asynccontextmanager
async def _within(cm: Any, what: str, seconds: float) -> Any:
    """``async with cm`` with its entry bounded (and its exit, which closes a connection)."""
    entered = await bounded(cm.__aenter__(), what, seconds)
    try:
        yield entered
    except BaseException as e:
        if not await bounded(cm.__aexit__(type(e), e, e.__traceback__), f"closing {what}", PMD3_TIMEOUTS["close"]):
            raise
    else:
        await bounded(cm.__aexit__(None, None, None), f"closing {what}", PMD3_TIMEOUTS["close"])


def pmd3_api() -> SimpleNamespace:
    """The pymobiledevice3 entry points used (the boundary tests replace), from its 11.x source."""
    from pymobiledevice3.exceptions import (
        AlreadyMountedError,
        DeveloperDiskImageNotFoundError,
        DvtException,
        NotPairedError,
        PasswordRequiredError,
        TunneldConnectionError,
    )
    from pymobiledevice3.lockdown import create_using_usbmux
    from pymobiledevice3.services.dvt.instruments.dvt_provider import DvtProvider
    from pymobiledevice3.services.dvt.instruments.process_control import ProcessControl
    from pymobiledevice3.services.mobile_image_mounter import auto_mount
    from pymobiledevice3.tunneld.api import get_tunneld_device_by_udid
    return SimpleNamespace(
        create_using_usbmux=create_using_usbmux, get_tunneld_device_by_udid=get_tunneld_device_by_udid,
        auto_mount=auto_mount, DvtProvider=DvtProvider, ProcessControl=ProcessControl,
        AlreadyMountedError=AlreadyMountedError, DeveloperDiskImageNotFoundError=DeveloperDiskImageNotFoundError,
        PasswordRequiredError=PasswordRequiredError, TunneldConnectionError=TunneldConnectionError,
        NotPairedError=NotPairedError, DvtException=DvtException)


def _major(version: str | None) -> int:
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else 0


async def _close(client: Any) -> None:
    # Closing a connection the device may already have dropped (or that no longer answers).
    if client is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), PMD3_TIMEOUTS["close"])


class _Pmd3Session:
    """A lockdown client and, on iOS 17+, the RSD of the device's tunnel: the provider DVT needs.
    Both closed on exit."""

    def __init__(self, api: SimpleNamespace, udid: str) -> None:
        self.api = api
        self.udid = udid
        self.lockdown: Any = None
        self.rsd: Any = None

    async def __aenter__(self) -> Any:
        api = self.api
        try:
            self.lockdown = await bounded(api.create_using_usbmux(serial=self.udid, **NO_AUTOPAIR),
                                          f"lockdown on {self.udid}", PMD3_TIMEOUTS["lockdown"])
        except api.PasswordRequiredError:
            raise TargetError(LOCKED_MESSAGE) from None
        version = self.lockdown.product_version
        if _major(version) < TUNNEL_SINCE_IOS:
            if getattr(self.lockdown, "paired", True) is False:
                await _close(self.lockdown)
                raise TargetError(NOT_PAIRED_MESSAGE)
            return self.lockdown
        try:
            self.rsd = await bounded(api.get_tunneld_device_by_udid(self.udid), f"the tunnel to {self.udid}",
                                     PMD3_TIMEOUTS["tunnel"])
        except api.TunneldConnectionError:
            await _close(self.lockdown)
            raise TargetError(f"iOS {version} is reached through a RemoteXPC tunnel and no tunneld answers: "
                              f"{START_TUNNELD}") from None
        except IndexError:
            # pymobiledevice3 11.x: tunneld lists the device, but none of its tunnels could be dialled
            # (get_tunneld_device_by_udid indexes an empty list: "list index out of range").
            await _close(self.lockdown)
            raise TargetError(f"tunneld lists {self.udid} but its tunnel cannot be reached: restart tunneld "
                              f"(sudo python3 -m pymobiledevice3 remote tunneld), reconnect the device and "
                              f"retry") from None
        except TargetError:
            await _close(self.lockdown)
            raise
        if self.rsd is None:
            await _close(self.lockdown)
            raise TargetError(f"tunneld is running but has no tunnel to {self.udid} (iOS {version}): "
                              "is the device connected, trusted and in Developer Mode?")
        return self.rsd

    async def __aexit__(self, *exc: object) -> None:
        await _close(self.rsd)
        await _close(self.lockdown)


async def _mount_developer_image(api: SimpleNamespace, provider: Any) -> None:
    """The developer disk image DVT needs (personalized on iOS 17+); already mounted is fine.
    DEVICE-UNVERIFIED: which exception a refused signing request raises (mapped by type and text)."""
    try:
        await bounded(api.auto_mount(provider), "mounting the developer disk image", PMD3_TIMEOUTS["mount"])
    except api.AlreadyMountedError:
        return
    except api.DeveloperDiskImageNotFoundError:
        raise TargetError(f"no developer disk image for iOS {provider.product_version} "
                          "(pymobiledevice3 could not find or download one)") from None
    except TargetError:
        raise
    except Exception as e:  # noqa: BLE001 -- the network part of a personalized mount, or the mount itself
        if _major(provider.product_version) >= TUNNEL_SINCE_IOS and _network_failure(e):
            raise TargetError(f"{SIGNING_SERVER_MESSAGE} ({_first(e)})") from None
        raise TargetError(f"cannot mount the developer disk image on iOS {provider.product_version}: "
                          f"{_first(e)}") from None


def _network_failure(e: BaseException) -> bool:
    """A failure to reach a server (Apple's TSS signing server, the image's download): requests'
    errors, socket errors, pymobiledevice3's TSSError."""
    names = {c.__name__ for c in type(e).__mro__}
    return isinstance(e, OSError) or bool(names & {"RequestException", "ConnectionError", "TSSError", "Timeout"})


def _first(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0] or type(e).__name__


# What DVT's launch says when the app is not development-signed (no get-task-allow) or its profile
# is not trusted.  DEVICE-UNVERIFIED: the exact NSError text differs across iOS releases.
_NOT_DEV_SIGNED = ("get-task-allow", "task_for_pid", "entitlement", "code signature", "explicitly trusted",
                   "security policy", "not permitted", "denied")


async def pmd3_launch(udid: str, bundle_id: str, suspended: bool = True) -> int:
    """Launch ``bundle_id`` through DVT process control and return its pid."""
    api = pmd3_api()
    async with _Pmd3Session(api, udid) as provider:
        await _mount_developer_image(api, provider)
        try:
            async with _within(api.DvtProvider(provider), "DVT", PMD3_TIMEOUTS["dvt"]) as dvt, \
                    _within(api.ProcessControl(dvt), "DVT process control", PMD3_TIMEOUTS["dvt"]) as pc:
                return int(await bounded(pc.launch(bundle_id, kill_existing=True, start_suspended=suspended),
                                         f"DVT launching {bundle_id}", PMD3_TIMEOUTS["launch"]))
        except api.PasswordRequiredError:
            raise TargetError(LOCKED_MESSAGE) from None
        except api.NotPairedError:
            raise TargetError(NOT_PAIRED_MESSAGE) from None
        except (api.DvtException, AssertionError) as e:
            # ProcessControl.launch asserts a non-zero pid: a refused launch returns 0.
            text = str(e)
            if "locked" in text.lower():
                raise TargetError(f"DVT could not launch {bundle_id}: {_locked_hint(text)}") from None
            if isinstance(e, AssertionError) or any(k in text.lower() for k in _NOT_DEV_SIGNED):
                raise TargetError(f"DVT refused to launch {bundle_id}{': ' + _first(e) if text else ''} -- "
                                  f"{DEV_SIGNED_MESSAGE}") from None
            raise TargetError(f"DVT could not launch {bundle_id}: {_first(e)}") from None


async def pmd3_resume(udid: str, pid: int) -> None:
    """Resume a process DVT launched suspended."""
    api = pmd3_api()
    async with _Pmd3Session(api, udid) as provider, \
            _within(api.DvtProvider(provider), "DVT", PMD3_TIMEOUTS["dvt"]) as dvt, \
            _within(api.ProcessControl(dvt), "DVT process control", PMD3_TIMEOUTS["dvt"]) as pc:
        await bounded(pc.resume(pid), f"DVT resuming pid {pid}", PMD3_TIMEOUTS["launch"])


LOCKED_MESSAGE = "the device is locked: unlock it (and keep it unlocked) before launching apps"


async def _check_unlocked_usb(udid: str) -> None:
    """Before a Frida spawn: only a locked device is an error here (no tunnel, no image: the spawn
    does not need them)."""
    api = pmd3_api()
    try:
        async with _Pmd3Session(api, udid) as provider:
            await check_unlocked(api, provider)
    except TargetError as e:
        if str(e) == LOCKED_MESSAGE:
            raise


async def check_unlocked(api: SimpleNamespace, provider: Any) -> None:
    """What pymobiledevice3 documents for a locked device: lockdownd refuses to start a service with
    "PasswordProtected", raised as ``PasswordRequiredError`` ("Device is password protected. Please
    unlock and retry").  FrontBoard's "RequestDenied ... Locked" on the launch itself is the other
    signal, which ``_locked_hint`` turns into the same message.  DEVICE-UNVERIFIED: which services
    lockdownd refuses on a device locked after its first unlock (the DVT service is asked here)."""
    try:
        async with _within(api.DvtProvider(provider), "DVT", PMD3_TIMEOUTS["dvt"]):
            pass
    except api.PasswordRequiredError:
        raise TargetError(LOCKED_MESSAGE) from None
    except Exception:  # noqa: BLE001 -- anything else: the launch itself will say what is wrong
        return


def _locked_hint(message: str) -> str:
    first = message.splitlines()[0] if message else "unknown error"
    if "Locked" in message or "locked" in message:
        return f"{first} -- the device is locked; unlock it and keep it unlocked during the run"
    return first
