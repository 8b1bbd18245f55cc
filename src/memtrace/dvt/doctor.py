"""``memtrace doctor`` for a stock iPhone: which commands work without a jailbreak, and the fix for
each missing piece.

Checked in the order a user fixes them, each on its own line (nothing is mounted or launched):

    lockdown          usbmux reaches the device and it is paired
    developer mode    on (iOS 16+): the developer services and debuggable launches need it
    tunnel            iOS 17+: tunneld serves a RemoteXPC tunnel to this device
    developer image   the developer disk image is mounted (memtrace mounts it when it launches)
    instruments       the DVT service answers
    app               (with --app) the app is development-signed: get-task-allow, which
                      Allocations, Leaks and the VM Tracker need

then one line per stock-device command: ready, or what it waits for.  DEVICE-UNVERIFIED: tested
with fakes bound to pymobiledevice3 11.45's signatures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from memtrace.errors import first_line as _first_line

TIMEOUT_S = 20.0
SECTION = "stock iPhone"
COMMANDS = (
    ("census --source dvt", ("lockdown", "developer mode", "tunnel", "developer image", "instruments")),
    ("limit --source dvt", ("lockdown", "developer mode", "tunnel", "developer image", "instruments")),
    ("malloc --backend dvt --app", ("lockdown", "developer mode", "tunnel", "developer image", "instruments", "app")),
)


async def _probe(api: SimpleNamespace, udid: str, app: str | None) -> list[tuple[str, str, str]]:
    """(check, status, detail) rows; statuses are doctor's OK/WARN/FAIL/SKIP words."""
    from memtrace import launchers

    rows: list[tuple[str, str, str]] = []
    rsd: Any = None
    try:
        lockdown = await api.create_using_usbmux(serial=udid, **launchers.NO_AUTOPAIR)
    except api.PasswordRequiredError:
        return [("lockdown", "FAIL", "the device is locked: unlock it")]
    except Exception as e:  # noqa: BLE001 -- the finding itself
        return [("lockdown", "FAIL", f"not reachable: {_first_line(e)} (connect it by USB, tap Trust, or pair: "
                                     "python3 -m pymobiledevice3 lockdown pair)")]
    if getattr(lockdown, "paired", True) is False:
        await launchers._close(lockdown)
        return [("lockdown", "FAIL", launchers.NOT_PAIRED_MESSAGE)]
    try:
        version = str(getattr(lockdown, "product_version", "") or "")
        major = launchers._major(version)
        rows.append(("lockdown", "OK", f"{getattr(lockdown, 'product_type', '?')}, iOS {version or '?'}"))
        if major >= 16:
            try:
                on = await lockdown.get_value(domain="com.apple.security.mac.amfi", key="DeveloperModeStatus")
            except Exception as e:  # noqa: BLE001
                rows.append(("developer mode", "WARN", f"not reported: {_first_line(e)}"))
            else:
                rows.append(("developer mode", "OK", "on") if on else
                            ("developer mode", "FAIL", "off: turn it on in Settings > Privacy & Security > Developer "
                                                       "Mode (or: python3 -m pymobiledevice3 amfi enable-developer-mode)"))
        else:
            rows.append(("developer mode", "SKIP", f"iOS {version} has none"))
        provider: Any = lockdown
        if major >= launchers.TUNNEL_SINCE_IOS:
            try:
                rsd = await api.get_tunneld_device_by_udid(udid)
            except IndexError:
                # pymobiledevice3 11.x: tunneld lists the device but none of its tunnels can be dialled.
                rows.append(("tunnel", "FAIL", "tunneld lists the device but its tunnel cannot be reached: restart "
                                               "tunneld (sudo python3 -m pymobiledevice3 remote tunneld)"))
                return rows
            except Exception as e:  # noqa: BLE001 -- TunneldConnectionError and friends
                rows.append(("tunnel", "FAIL", f"no tunneld answers ({_first_line(e)}): start one -- "
                                               "sudo python3 -m pymobiledevice3 remote tunneld"))
                return rows
            if rsd is None:
                rows.append(("tunnel", "FAIL", "tunneld runs but has no tunnel to this device: reconnect it, check "
                                               "Developer Mode and trust"))
                return rows
            rows.append(("tunnel", "OK", "tunneld serves a RemoteXPC tunnel"))
            provider = rsd
        else:
            rows.append(("tunnel", "SKIP", f"iOS {version}: lockdown, no tunnel needed"))
        try:
            async with api.MobileImageMounterService(provider) as mounter:
                mounted = await mounter.is_image_mounted("Personalized" if major >= 17 else "Developer")
        except Exception as e:  # noqa: BLE001
            rows.append(("developer image", "WARN", f"could not ask: {_first_line(e)}"))
        else:
            rows.append(("developer image", "OK", "mounted") if mounted else
                        ("developer image", "WARN", "not mounted yet: memtrace mounts it when it first launches "
                                                    "(iOS 17+: this host must reach Apple's signing server)"))
        try:
            async with api.DvtProvider(provider) as dvt:
                rows.append(("instruments", "OK", "the DVT service answers"))
                if app:
                    async with api.ProcessControl(dvt) as pc:
                        pid = await pc.process_identifier_for_bundle_identifier(app)
                        if not pid:
                            rows.append(("app", "SKIP", f"{app} is not running: start it and run doctor again to "
                                                        "check it is development-signed"))
                        elif await pc.is_debuggable(pid):
                            rows.append(("app", "OK", f"{app} (pid {pid}) is debuggable (get-task-allow)"))
                        else:
                            rows.append(("app", "FAIL", f"{app} (pid {pid}) is not debuggable: build and install it "
                                                        "development-signed (get-task-allow), e.g. from Xcode"))
        except Exception as e:  # noqa: BLE001
            rows.append(("instruments", "FAIL", f"the DVT service does not answer: {_first_line(e)}"))
        return rows
    finally:
        await launchers._close(rsd)
        await launchers._close(lockdown)


def stock_checks(report: Any, udid: str, app: str | None,
                 api_factory: Callable[[], SimpleNamespace] | None = None) -> None:
    """Adds the stock-iPhone section to doctor's report."""
    if api_factory is None:
        from memtrace.dvt.api import dvt_api

        api_factory = dvt_api
    status_of = {"OK": "ok", "WARN": "warn", "FAIL": "fail", "SKIP": "skip"}   # doctor.OK ... (no import back)
    try:
        rows = asyncio.run(asyncio.wait_for(_probe(api_factory(), udid, app), TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 -- pymobiledevice3 missing pieces, a hung service
        rows = [("lockdown", "FAIL", f"could not check: {_first_line(e) if str(e) else 'no answer in time'}")]
    seen = {}
    for name, status, detail in rows:
        seen[name] = status
        # Only the stock section's own lines decide the run's verdict when Frida is absent: a FAIL
        # here is a warning for a jailbroken device that does not need these services.
        report.add(SECTION, name, status_of[status] if status != "FAIL" else status_of["WARN"], detail)
    for command, needs in COMMANDS:
        missing = [n for n in needs if seen.get(n) in ("FAIL", None) and not (n == "app" and app is None)]
        if command.endswith("--app") and app is None and not missing:
            report.add(SECTION, f"memtrace {command}", status_of["SKIP"], "name the app (--app BUNDLE_ID) to check it")
            continue
        report.add(SECTION, f"memtrace {command}", status_of["OK"] if not missing else status_of["WARN"],
                   "ready" if not missing else f"waits for: {', '.join(missing)} (see above)")
