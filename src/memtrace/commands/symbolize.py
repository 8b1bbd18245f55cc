"""memtrace symbolize: resolve a capture's addresses again, offline, and rewrite its symbol table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from memtrace.symbols.resymbolize import Outcome, resymbolize


@click.command("symbolize")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--symbols", "symbol_dirs", multiple=True, type=click.Path(path_type=Path), metavar="DIR",
              help="Where to look for symbol files: dSYM bundles, .app bundles, separate debug files, "
                   ".build-id trees (repeatable; searched recursively).")
@click.option("--device-symbols", type=click.Path(path_type=Path), metavar="DIR",
              help="An iOS device's shared-cache symbols split per image (an Xcode DeviceSupport "
                   "'Symbols' folder): names system frames by their modules' UUIDs.")
@click.option("--fetch-device-symbols", "fetch_udid", metavar="UDID",
              help="Fetch that USB device's shared-cache symbols through pymobiledevice3 first (once per "
                   "OS build, kept in its DeviceSupport folder) and use them as --device-symbols.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def symbolize(capture: Path, symbol_dirs: tuple[Path, ...], device_symbols: Path | None, fetch_udid: str | None,
              as_json: bool) -> int:
    """Re-symbolize CAPTURE (a capture file or folder): function names, file:line and inlined calls
    for every address it references, from the modules' files on this machine, their separate debug
    files (build-id, .gnu_debuglink) and the --symbols folders.  The capture's symbol table is
    replaced atomically; names the capture had that nothing here can redo are kept."""
    if fetch_udid:
        from memtrace.symbols import device

        device_symbols = device.fetch(fetch_udid)
    out = resymbolize(capture, symbol_dirs, device_symbols)
    if as_json:
        sys.stdout.write(json.dumps(out.to_json(), indent=1) + "\n")
    else:
        _print(out)
    if out.truncated:
        click.echo(f"memtrace: warning: {out.capture}: {out.truncated} (kept as it was)", err=True)
        return 1
    return 0


def _print(out: Outcome) -> None:
    click.echo(f"{out.capture}: {out.addresses:,} addresses, {out.named:,} named "
               f"({out.with_lines:,} with file:line, {out.inlined:,} with inlined calls), "
               f"{out.kept:,} kept from the capture, {out.unresolved:,} unresolved")
    width = max((len(im["module"]) for im in out.images), default=0)
    for im in out.images:
        source = f"{im['file']} ({im['how']})" if im["file"] else "no symbol file"
        click.echo(f"  {im['module']:<{width}}  {im['named']:>6,}/{im['addresses']:<6,} named, "
                   f"{im['with_lines']:>6,} with lines  <- {source}")
        if im["note"]:
            click.echo(f"  {'':<{width}}  {im['note']}")
    t = out.timing
    click.echo(f"  {t['total_s']:.2f} s (read {t['read_s']:.2f}, symbolize {t['symbolize_s']:.2f} of which "
               f"loading symbol files {t['load_s']:.2f}, write {t['write_s']:.2f})")
    c = out.symbol_cache
    if c:
        click.echo(f"  symbol caches: {c['hits']} from the store, {c['built']} built")


command = symbolize
