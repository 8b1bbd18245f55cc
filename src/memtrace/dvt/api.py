"""The pymobiledevice3 entry points the stock-device backend uses, in one namespace the tests replace.

Connecting (usbmux lockdown, tunneld's RSD on iOS 17+, the developer disk image) is the launcher's
(:mod:`memtrace.launchers`: ``_Pmd3Session``, ``_mount_developer_image``), so ``--launch pmd3`` and
``--backend dvt`` reach a device the same way.
"""

from __future__ import annotations

from types import SimpleNamespace


def dvt_api() -> SimpleNamespace:
    """pymobiledevice3 11.x's classes for Instruments' services, imported when first needed."""
    from pymobiledevice3.services.dvt.instruments.allocations import (
        MALLOC_EVENTS_MASK,
        VM_EVENTS_MASK,
        Allocations,
    )
    from pymobiledevice3.services.dvt.instruments.device_info import DeviceInfo
    from pymobiledevice3.services.dvt.instruments.leaks import Leaks
    from pymobiledevice3.services.dvt.instruments.sysmontap import Sysmontap
    from pymobiledevice3.services.dvt.instruments.vm_tracking import VMTracking
    from pymobiledevice3.services.mobile_image_mounter import MobileImageMounterService
    from pymobiledevice3.services.os_trace import OsTraceService

    from memtrace import launchers

    base = launchers.pmd3_api()
    return SimpleNamespace(**vars(base), Allocations=Allocations, Leaks=Leaks, Sysmontap=Sysmontap,
                           DeviceInfo=DeviceInfo, VMTracking=VMTracking, OsTraceService=OsTraceService,
                           MobileImageMounterService=MobileImageMounterService, MALLOC_EVENTS_MASK=MALLOC_EVENTS_MASK,
                           VM_EVENTS_MASK=VM_EVENTS_MASK)
