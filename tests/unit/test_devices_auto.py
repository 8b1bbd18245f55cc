"""``--device auto`` against a fake Frida device manager: waits briefly for a USB device still being
enumerated, only where usbmuxd runs, and falls back to this machine."""

from __future__ import annotations

from typing import Any

from memtrace import devices


class FakeDevice:
    def __init__(self, type_: str, id_: str) -> None:
        self.type, self.id, self.name = type_, id_, id_


class FakeFrida:
    """Each enumerate_devices() call returns the next listing (the last one repeats)."""

    def __init__(self, listings: list[list[FakeDevice]]) -> None:
        self.listings = listings
        self.calls = 0
        self.local = FakeDevice("local", "local")

    def enumerate_devices(self) -> list[FakeDevice]:
        self.calls += 1
        return self.listings[min(self.calls - 1, len(self.listings) - 1)]

    def get_local_device(self) -> FakeDevice:
        return self.local


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def auto(frida: FakeFrida, clock: Clock, usbmuxd: bool) -> Any:
    return devices._auto(frida, clock=clock, sleep=clock.sleep, usbmuxd=lambda: usbmuxd)


def test_a_device_enumerated_after_a_moment_is_taken() -> None:
    iphone = FakeDevice("usb", "00008110-000A")
    frida, clock = FakeFrida([[FakeDevice("local", "local")]] * 6 + [[FakeDevice("local", "local"), iphone]]), Clock()
    assert auto(frida, clock, usbmuxd=True) is iphone
    assert frida.calls == 7 and round(clock.now - 100.0, 3) == 0.6


def test_no_usb_device_falls_back_to_local_after_the_wait() -> None:
    frida, clock = FakeFrida([[FakeDevice("local", "local"), FakeDevice("remote", "socket")]]), Clock()
    assert auto(frida, clock, usbmuxd=True) is frida.local
    waited = clock.now - 100.0
    assert devices.AUTO_USB_WAIT <= waited < devices.AUTO_USB_WAIT + 2 * devices.AUTO_USB_POLL
    assert frida.calls >= devices.AUTO_USB_WAIT / devices.AUTO_USB_POLL


def test_without_usbmuxd_nothing_is_waited_for() -> None:
    frida, clock = FakeFrida([[FakeDevice("local", "local")]]), Clock()
    assert auto(frida, clock, usbmuxd=False) is frida.local
    assert frida.calls == 1 and clock.now == 100.0


def test_an_attached_device_is_taken_at_once() -> None:
    iphone = FakeDevice("usb", "x")
    frida, clock = FakeFrida([[iphone]]), Clock()
    assert auto(frida, clock, usbmuxd=False) is iphone and clock.now == 100.0


def test_usbmuxd_socket_location_can_be_overridden(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(devices.sys, "platform", "linux")
    monkeypatch.setenv("USBMUXD_SOCKET_ADDRESS", str(tmp_path / "nope"))
    assert devices.usbmuxd_present() is False
    (tmp_path / "sock").write_text("")
    monkeypatch.setenv("USBMUXD_SOCKET_ADDRESS", str(tmp_path / "sock"))
    assert devices.usbmuxd_present() is True
