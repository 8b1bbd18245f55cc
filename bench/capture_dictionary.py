"""Train the zstd dictionary a capture's frames are made with (capture.DICTIONARY_FILES) from
captures of other programs than the ones it is measured on:

    python bench/capture_dictionary.py OUT.zdict CAPTURE...            # format 8's recipe
    python bench/capture_dictionary.py --cover OUT.zdict CAPTURE...    # format 7's

The samples are what the writer compresses, each record as this memtrace would write it now: a
JSON record's text, a drain's JSON and agent records, a group's records (columns and all) grouped
as they were in the capture.  Left out: in META, the host's name and the target's command line.

Format 7's dictionary (``--cover``) is zstd's own training on the samples, SYMBOLS rows left out
(one machine's library functions).  Format 8's is built by hand, then given zstd's statistics
from the samples: a short run's capture is mostly records written once a run (META, RECON,
CALIBRATION, MODULES, the first SNAPSHOT, END) and the names of its stacks' library frames, which
zstd's training (it keeps what repeats across many samples) left out.  Its content, the nearest
last (a match near the end of a dictionary is cheaper): format 7's dictionary; the SYMBOLS rows
of the shared libraries every program loads (libc, the dynamic loader, libstdc++, libgcc, libm:
their functions, source files and lines, without the row's address, which ASLR changes every
run), and the symbol images' entries, build ids and paths scrubbed; then each record written once
a run, from the captures of FIXED_FROM -- programs in C and in C++.  A dictionary is never
changed once shipped (a capture names it by id): a new one is a new file beside the others.
"""

from __future__ import annotations

import re
import struct
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from memtrace import capture
from memtrace.capture import RecordType

SIZE = 64 << 10
# The shared libraries whose symbol rows go into the dictionary (any program's stacks pass through them).
SHARED = re.compile(r"^(libc\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so|libm\.so|libpthread\.so)")
# The records a run writes once; taken from the captures whose program's name is here.
ONCE = (RecordType.META, RecordType.RECON, RecordType.CALIBRATION, RecordType.MODULES, RecordType.SNAPSHOT,
        RecordType.END)
FIXED_FROM = ("heaptrack_print", "sort", "tar")


def records(path: Path) -> list[tuple[int, list[tuple[RecordType, Any, bytes]]]]:
    """The capture's records as stored: (stored type, the records it holds)."""
    p = capture.resolve_capture_path(path)
    b = p.read_bytes()
    version = struct.unpack_from("<H", b, 8)[0]
    out = []
    at = capture.HEADER.size
    while at + capture.RECORD_HEADER.size <= len(b):
        rtype, _, _, n, _ = capture.RECORD_HEADER.unpack_from(b, at)
        payload = b[at + capture.RECORD_HEADER.size:at + capture.RECORD_HEADER.size + n]
        at += capture.RECORD_HEADER.size + n
        try:
            decoded = capture._decode(rtype, payload, version)
        except capture._Damaged:
            continue
        if decoded is not None:
            held = decoded if isinstance(decoded, list) else [decoded]
            out.append((rtype, [(r.type, scrub(r.type, r.body), bytes(r.data) if r.data else b"") for r in held]))
    return out


def samples(path: Path, symbols: bool = True) -> list[bytes]:
    out: list[bytes] = []
    for rtype, held in records(path):
        kept = [r for r in held if symbols or r[0] != RecordType.SYMBOLS]
        if rtype == RecordType.GROUP and len(kept) > 1:
            out.append(capture.group_bytes(kept))
        else:
            out.extend(capture._dumps(body) + data for _, body, data in kept)
    return out


def scrub(rtype: RecordType, body: Any) -> Any:
    if rtype != RecordType.META or not isinstance(body, dict):
        return body
    body = dict(body)
    if isinstance(body.get("host"), dict):
        body["host"] = {**body["host"], "hostname": "host"}
    if isinstance(body.get("target"), dict):
        argv = body["target"].get("argv") or ["program"]
        body["target"] = {**body["target"], "argv": [Path(str(argv[0])).name]}
    return body


HEX_ID = re.compile(rb"[0-9a-f]{32,}")


def content(paths: list[Path]) -> bytes:
    """Format 8's dictionary content (module docstring), the nearest last."""
    rows: Counter[bytes] = Counter()
    images: dict[bytes, None] = {}
    once: list[bytes] = []
    for path in paths:
        stored = records(path)
        for _, held in stored:
            for rtype, body, _ in held:
                if rtype != RecordType.SYMBOLS or not isinstance(body, dict):
                    continue
                for row in body.get("rows") or []:
                    if isinstance(row, list) and len(row) > 2 and SHARED.match(str(row[1])):
                        rows[capture._dumps(row[1:])] += 1
                for image in body.get("images") or []:
                    if isinstance(image, dict) and SHARED.match(str(image.get("module"))):
                        images[HEX_ID.sub(lambda m: b"0" * len(m.group()), capture._dumps(image))] = None
        if path.name in FIXED_FROM or path.parent.name in FIXED_FROM:
            # The records before the first drain as the writer groups them (capture.OPENING), then
            # the others written once.
            flat = [r for _, held in stored for r in held]
            first = next((i for i, r in enumerate(flat) if r[0] == RecordType.BATCH), len(flat))
            opening = [r for r in flat[:first] if r[0] in capture.GROUPED_V8]
            if len(opening) > 1:
                once.append(capture.group_bytes(opening))
            seen = {r[0] for r in opening}
            for t, body, data in flat[first:]:
                if t in ONCE and t not in seen:
                    seen.add(t)
                    once.append(capture._dumps(body) + data)
    # The rows seen in most captures nearest the end.
    common = b"".join(row for row, _ in sorted(rows.items(), key=lambda kv: kv[1]))
    return capture.DICTIONARY_FILES[7].read_bytes() + common + b"".join(images) + b"".join(once)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    cover = "--cover" in args
    if cover:
        args.remove("--cover")
    out, paths = Path(args[0]), [Path(a) for a in args[1:]]
    zstd = capture._zstd
    assert zstd is not None
    found = [s for p in paths for s in samples(p, symbols=not cover)]
    if cover:
        trained = zstd.train_dict(found, 16 << 10)
    else:
        raw = content(paths)[-SIZE:]
        trained = zstd.finalize_dict(zstd.ZstdDict(raw, is_raw=True), found, SIZE, capture.ZSTD_SMALL_LEVEL)
    made = trained.dict_content
    if not cover:
        # Its id is the format's: below 256, a frame names it in one byte where a random id takes
        # four (format 7's are random).  (The id is not part of any checksum: the same dictionary.)
        made = made[:4] + struct.pack("<I", capture.FORMAT_VERSION) + made[8:]
    out.write_bytes(made)
    print(f"{out}: {len(found)} samples, {sum(map(len, found)):,} bytes; "
          f"dictionary id {zstd.ZstdDict(made).dict_id}")


if __name__ == "__main__":
    main()
