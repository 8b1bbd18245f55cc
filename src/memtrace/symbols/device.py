"""System frames of an iOS capture named on the host, from the device's own shared-cache symbols.

iOS system libraries live in the dyld shared cache, which is on the device only.  pymobiledevice3
fetches it (``DtFetchSymbols`` below iOS 17, ``RemoteFetchSymbolsService`` over the tunnel from 17)
and splits it into one Mach-O per image in Xcode's ``DeviceSupport/<model> <version> (<build>)/Symbols``
folder -- so it is fetched once per OS build and reused (``fetch``).  ``DeviceSymbols`` reads such a
tree with pymobiledevice3's ``DeviceSupportSymbols``: an image is found by the UUID the agent read
from its in-memory header, and a module offset becomes the image's unslid address.  Names only
(the shared cache carries no line tables).  DEVICE-UNVERIFIED: the fetch runs against fakes bound to
pymobiledevice3 11.45's signatures; the tree lookup runs on Mach-O files built here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from memtrace.errors import InputError, TargetError

# Fetching a shared cache moves gigabytes: bounded, but generously.
FETCH_TIMEOUT_S = 3600.0


class DeviceSymbols:
    """A DeviceSupport ``Symbols`` tree, looked up by image UUID and module offset."""

    def __init__(self, root: Path, index_dir: Path | None = None) -> None:
        from pymobiledevice3.services.dvt.instruments.device_support_symbols import DeviceSupportSymbols

        if not root.is_dir():
            raise InputError(f"--device-symbols {root}: no such folder")
        self.root = root
        self.tree = DeviceSupportSymbols.load(root, index_dir)
        self.named = 0

    def __len__(self) -> int:
        return len(self.tree.images)

    def name(self, uuids: tuple[str, ...], offset: int) -> str | None:
        """The function at ``offset`` (a return address's, looked up one byte back) in the image
        with one of ``uuids``; None when the tree has no such image or no symbol there."""
        for uuid in uuids:
            image = self.tree.image_by_uuid(_dashed(uuid))
            if image is None:
                continue
            found = self.tree.symbolicate(image, image.vmaddr + offset - 1)
            if found is not None and found[0]:
                self.named += 1
                name = str(found[0])
                # The symbol table's C-level name ("_malloc"), as symbolic gives every other row.
                return name[1:] if name.startswith("_") else name
            return None
        return None


def local_tree(device_info: dict[str, Any]) -> Path | None:
    """This device's DeviceSupport ``Symbols`` folder, when it is already on this machine (fetched
    before, by ``memtrace symbolize --fetch-device-symbols`` or Xcode), from what Frida says the
    device is (model, iOS version and build); None otherwise.  Fetches nothing.  DEVICE-UNVERIFIED:
    that Frida's system parameters carry ``os.build`` and ``hardware.product`` on every iOS."""
    os_info = device_info.get("os") or {}
    product = (device_info.get("hardware") or {}).get("product")
    version, build = os_info.get("version"), os_info.get("build")
    if os_info.get("id") != "ios" or not (product and version and build):
        return None
    from ipsw_parser.dsc import get_device_support_path

    tree = get_device_support_path(str(product), str(version), str(build)) / "Symbols"
    return tree if tree.is_dir() else None


def _dashed(uuid: str) -> str:
    """pymobiledevice3 keys images by ``str(uuid.UUID(...))``: lower-case, dashed."""
    h = uuid.replace("-", "").lower()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" if len(h) == 32 else uuid.lower()


def pmd3_symbols_api() -> SimpleNamespace:
    """The pymobiledevice3 entry points used (the boundary tests replace)."""
    from pymobiledevice3.cli.developer.fetch_symbols import fetch_symbols_download_task
    from pymobiledevice3.services.dvt.instruments.device_support_symbols import find_device_support_symbols

    return SimpleNamespace(fetch_symbols_download_task=fetch_symbols_download_task,
                           find_device_support_symbols=find_device_support_symbols)


def fetch(udid: str, timeout: float = FETCH_TIMEOUT_S) -> Path:
    """The device's shared-cache symbols, split per image, in its DeviceSupport folder: downloaded
    once per OS build (pymobiledevice3 keeps a finished folder), and its ``Symbols`` path."""
    from memtrace import launchers

    async def run() -> Path:
        api = launchers.pmd3_api()
        sym = pmd3_symbols_api()
        async with launchers._Pmd3Session(api, udid) as provider:
            await launchers.bounded(sym.fetch_symbols_download_task(provider), "fetching the shared-cache symbols",
                                    timeout)
            found: Any = sym.find_device_support_symbols(provider)
        if found is None:
            raise TargetError(f"pymobiledevice3 fetched no symbols folder for {udid}")
        return Path(found)

    try:
        return asyncio.run(run())
    except TargetError:
        raise
    except Exception as e:  # noqa: BLE001 -- pymobiledevice3 raises many types; one line for the user
        first = (str(e).splitlines() or [""])[0] or type(e).__name__
        raise TargetError(f"cannot fetch the shared-cache symbols of {udid}: {first}") from None
