"""What to trace and where: the target of a capture, and the options that name it.

memtrace's own spellings (``--device``, ``--app``, ``--pid``, ``--name``, ``-- PROGRAM``) and
frida-tools' (``-U``, ``-R``, ``-D ID``, ``-H HOST``, ``-f TARGET``, ``-n NAME``, ``-N ID``,
``-p PID``) name the same things; :func:`target_from_values` reconciles them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from memtrace import devices
from memtrace.errors import InputError
from memtrace.launchers import LAUNCHERS
from memtrace.tracers.options import Option


@dataclass
class TargetSpec:
    device: str = "auto"
    app: str | None = None
    pid: int | None = None
    name: str | None = None
    argv: list[str] = field(default_factory=list)
    launch: str = "auto"          # auto | frida | pmd3 | none

    def describe(self) -> str:
        if self.app:
            return self.app
        if self.pid is not None:
            return f"pid {self.pid}"
        if self.name:
            return self.name
        return " ".join(self.argv)

    def slug(self) -> str:
        if self.app:
            base = self.app
        elif self.pid is not None:
            base = f"pid{self.pid}"
        elif self.name:
            base = self.name
        else:
            base = Path(self.argv[0]).name if self.argv else "target"
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in base)[:60]

    def validate(self) -> None:
        chosen = sum(x is not None and x != [] for x in (self.app, self.pid, self.name, self.argv or None))
        if chosen == 0:
            raise InputError("no target: give --app BUNDLE_ID, --pid N, --name NAME or -- PROGRAM ARGS")
        if chosen > 1:
            raise InputError("give only one target: --app, --pid, --name or -- PROGRAM")
        if self.pid is not None and self.pid <= 0:
            raise InputError(f"--pid {self.pid}: not a process id")
        devices.parse_device_spec(self.device)


def _positive_pid(value: Any) -> str | None:
    return None if value > 0 else "not a process id"


TARGET_OPTIONS: tuple[Option, ...] = (
    Option("device", str, "auto", "Where the target runs: auto = the USB iOS device if attached, else this machine.",
           metavar=devices.DEVICE_CHOICES),
    Option("usb", bool, False, "frida-tools' -U: the USB device (= --device usb).", is_flag=True, aliases=("-U",),
           in_plans=False),
    Option("remote", bool, False, "frida-tools' -R: frida-server on this host's port 27042.", is_flag=True,
           aliases=("-R",), in_plans=False),
    Option("device_id", str, None, "frida-tools' -D: the device with this id (= --device id:ID).", metavar="ID",
           aliases=("-D",), in_plans=False, show_default=False),
    Option("host", str, None, "frida-tools' -H: frida-server at HOST[:PORT] (= --device remote:HOST).",
           metavar="HOST", aliases=("-H",), in_plans=False, show_default=False),
    Option("app", str, None, "Launch this app on the device and trace it.", metavar="BUNDLE_ID",
           show_default=False),
    Option("file", str, None, "frida-tools' -f: spawn TARGET (a program path here; a bundle id on a device).",
           metavar="TARGET", aliases=("-f",), in_plans=False, show_default=False),
    Option("pid", int, None, "Attach to this running process.", aliases=("-p", "--attach-pid"), check=_positive_pid,
           show_default=False),
    Option("name", str, None, "Attach to the running process with this name.", metavar="NAME",
           aliases=("-n", "--attach-name"), show_default=False),
    Option("attach_identifier", str, None, "frida-tools' -N: attach to the running app with this bundle id.",
           metavar="BUNDLE_ID", aliases=("-N",), in_plans=False, show_default=False),
    Option("launch", click.Choice(LAUNCHERS), "auto",
           "How the target starts: Frida spawn, pymobiledevice3 (DVT), or none (attach to a running one)."),
)


def require_platform(values: Mapping[str, Any], platform: str, what: str, why: str) -> None:
    """Refuse, before anything is launched, an option the target's device cannot honour.

    The device is asked what it runs (Frida's system parameters), so this costs one connection;
    it is only made for options that need a given platform."""
    spec = devices.spec_from_frida_flags(values.get("device"), bool(values.get("usb")), bool(values.get("remote")),
                                         values.get("device_id"), values.get("host"))
    device = devices.resolve(spec)
    found = devices.platform_of(device)
    if found is not None and found != platform:
        raise InputError(f"{what}: {why}, and the target's device ({device.name}) runs {found}; "
                         f"nothing was launched")


def target_from_values(values: Mapping[str, Any], program: list[str] | tuple[str, ...] = ()) -> TargetSpec:
    """A :class:`TargetSpec` from parsed option values (memtrace's and frida-tools' spellings)."""
    device = devices.spec_from_frida_flags(values.get("device"), bool(values.get("usb")), bool(values.get("remote")),
                                           values.get("device_id"), values.get("host"))
    app, argv, launch = values.get("app"), list(program), values.get("launch") or "auto"
    spawn = values.get("file")
    if spawn:
        if app:
            raise InputError("-f names the target: give it or --app, not both")
        # frida-tools' -f is a program on this machine and a bundle id on a device.
        if device == "local" or "/" in spawn or os.path.exists(spawn) or shutil.which(spawn):
            argv = [spawn, *argv]
        elif argv:
            raise InputError(f"-f {spawn}: an app takes no program arguments")
        else:
            app = spawn
    identifier = values.get("attach_identifier")
    if identifier:
        if app or argv:
            raise InputError("-N names a running app: give it alone")
        app, launch = identifier, "none"
    spec = TargetSpec(device=device, app=app, pid=values.get("pid"), name=values.get("name"), argv=argv,
                      launch=launch)
    spec.validate()
    return spec
