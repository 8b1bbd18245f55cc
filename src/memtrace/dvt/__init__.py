"""A stock iPhone: what Apple's developer services give without a jailbreak, through pymobiledevice3.

Instruments' services (DVT) answer on any device in Developer Mode (iOS 17+ through tunneld's
RemoteXPC tunnel; the developer disk image mounted); the per-process ones -- Allocations, Leaks --
need the app to be debuggable (development-signed, ``get-task-allow``):

    allocations.py  Allocations events (MALLOC / REALLOC / FREE / VM, with backtraces) turned into
                    the capture's own per-event records, so the malloc analyzer, report, flame
                    graph and diff read a DVT capture as they read a Frida one
    host.py         ``DvtHost``: the capture loop's AgentHost over those services (launch with the
                    recording environment, attach, stream; Leaks' memory graph for ``--leaks``)
    census.py       every process's footprint, purgeable and compressed memory from Sysmontap
    limit.py        one process's footprint over time and the device's memory-pressure messages
    api.py          the pymobiledevice3 entry points used, in one place the tests replace

DEVICE-UNVERIFIED: written against pymobiledevice3 11.45's classes and signatures (the tests bind
every fake to them with ``inspect.signature``) and fed event streams in the service's own wire
format through pymobiledevice3's real parser; never run against a device.
"""
