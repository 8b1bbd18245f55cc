"""How a target comes to life before memtrace attaches: one interface, chosen with --launch.

    frida  Frida spawn (suspended) + resume: an app by bundle id, or a local program.
    pmd3   pymobiledevice3's DVT process control launches the app and reports its pid
           (developer disk image / iOS 17+ tunnel needed).  DEVICE-UNVERIFIED: written
           against pymobiledevice3 11's source, tested with a fake at that boundary.
    none   attach to what is already running (--pid, --name, or --app's running pid).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
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


class Launcher(Protocol):
    name: str

    def launch(self, device: frida.core.Device, target: Any, stdio_pipe: bool) -> Launched: ...


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

    def launch(self, device: frida.core.Device, target: Any, stdio_pipe: bool) -> Launched:
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
                if device.type == "local" and "/" not in argv[0]:
                    # Frida spawns a path; a bare name is looked up on PATH as a shell would.
                    argv[0] = shutil.which(argv[0]) or argv[0]
                if device.type == "local":
                    check_local_program(argv[0])
                pid = device.spawn(argv, stdio="pipe" if stdio_pipe else "inherit")
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
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return              # a script: its interpreter is what runs
            f.seek(0)
            interp = any(s["p_type"] == "PT_INTERP" for s in ELFFile(f).iter_segments())
    except (OSError, ELFError):
        return
    if not interp:
        raise TargetError(f"cannot trace {shown}: it is statically linked (no dynamic loader), and Frida can "
                          f"only instrument dynamically linked programs; rebuild it without -static")


class AttachLauncher:
    name = "none"

    def launch(self, device: frida.core.Device, target: Any, stdio_pipe: bool) -> Launched:
        if target.pid is not None:
            if not any(p.pid == target.pid for p in device.enumerate_processes()):
                raise TargetError(f"--pid {target.pid}: no such process on {device.name}")
            if devices.is_local(device):
                check_local_program(f"/proc/{target.pid}/exe", f"pid {target.pid}")
            return Launched(target.pid, None, suspended=False, spawned=False, how="attach to pid")
        if target.name is not None:
            # Exact name first; two processes of that name are listed with their pids.
            pid = devices.find_pid(device, target.name)
            if devices.is_local(device):
                check_local_program(f"/proc/{pid}/exe", f"--name {target.name} (pid {pid})")
            return Launched(pid, None, suspended=False, spawned=False, how="attach by name")
        if target.app:
            devices.require_ios_for_app(device, target.app)
            apps = [a for a in device.enumerate_applications(identifiers=[target.app]) if a.pid]
            if not apps:
                raise TargetError(f"--app {target.app}: not running (use --launch frida or pmd3 to start it)")
            return Launched(apps[0].pid, None, suspended=False, spawned=False, how="attach to running app")
        raise InputError("--launch none needs --pid, --name or --app")


class Pmd3Launcher:
    """Launch through Instruments' process control, as Xcode does.  DEVICE-UNVERIFIED."""

    name = "pmd3"

    def launch(self, device: frida.core.Device, target: Any, stdio_pipe: bool) -> Launched:
        t = time.monotonic()
        try:
            pid = asyncio.run(pmd3_launch(device.id, target.app))
        except TargetError:
            raise
        except Exception as e:  # noqa: BLE001 -- any transport/service failure becomes one clear line
            raise TargetError(f"pymobiledevice3 could not launch {target.app}: {_locked_hint(str(e))}") from None
        return Launched(pid, t, suspended=False, spawned=True, how="pymobiledevice3 DVT process control")


def pmd3_api() -> tuple[Any, Any, Any]:
    """The pymobiledevice3 entry points used (the boundary tests replace)."""
    from pymobiledevice3.lockdown import create_using_usbmux
    from pymobiledevice3.services.dvt.instruments.dvt_provider import DvtProvider
    from pymobiledevice3.services.dvt.instruments.process_control import ProcessControl
    return create_using_usbmux, DvtProvider, ProcessControl


async def pmd3_launch(udid: str, bundle_id: str) -> int:
    create_using_usbmux, dvt_provider, process_control = pmd3_api()
    lockdown = await create_using_usbmux(serial=udid)
    await check_unlocked(lockdown)
    async with dvt_provider(lockdown) as dvt, process_control(dvt) as pc:
        return int(await pc.launch(bundle_id, kill_existing=True))


async def _check_unlocked_usb(udid: str) -> None:
    create_using_usbmux, _, _ = pmd3_api()
    await check_unlocked(await create_using_usbmux(serial=udid))


async def check_unlocked(lockdown: Any) -> None:
    """Where lockdown can tell: a passcode-protected device that reports itself locked refuses launches.

    lockdown has no documented "is locked" value; ``PasswordProtected`` only says a passcode is
    set.  The definitive signal is FrontBoard's ``RequestDenied: Locked`` on launch, which
    ``_locked_hint`` turns into a clear message.
    """
    try:
        protected = await lockdown.get_value(key="PasswordProtected")
    except Exception:  # noqa: BLE001 -- older devices do not answer; the launch error will say
        return
    if protected and await _reports_locked(lockdown):
        raise TargetError("the device is locked: unlock it (and keep it unlocked) before launching apps")


async def _reports_locked(lockdown: Any) -> bool:
    try:
        value = await lockdown.get_value(domain="com.apple.springboard", key="DeviceLocked")
    except Exception:  # noqa: BLE001
        return False
    return bool(value)


def _locked_hint(message: str) -> str:
    first = message.splitlines()[0] if message else "unknown error"
    if "Locked" in message or "locked" in message:
        return f"{first} -- the device is locked; unlock it and keep it unlocked during the run"
    return first
