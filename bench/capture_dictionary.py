"""Train the zstd dictionary a capture's frames are made with (capture.DICTIONARY_FILES) from
captures of other programs than the ones it is measured on:

    python bench/capture_dictionary.py OUT.zdict CAPTURE...

The samples are what the writer compresses, each record as this memtrace would write it now: a
JSON record's text, a drain's JSON and agent records, a group's records (version 7: columns and
all) grouped as they were in the capture.  Left out: SYMBOLS rows (they name one machine's library
functions) and, in META, the host's name and the target's command line.  A dictionary is never
changed once shipped (a capture names it by id): a new one is a new file beside the others.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

from memtrace import capture
from memtrace.capture import RecordType


def samples(path: Path) -> list[bytes]:
    out: list[bytes] = []
    p = capture.resolve_capture_path(path)
    b = p.read_bytes()
    version = struct.unpack_from("<H", b, 8)[0]
    at = capture.HEADER.size
    while at + capture.RECORD_HEADER.size <= len(b):
        rtype, _, _, n, _ = capture.RECORD_HEADER.unpack_from(b, at)
        payload = b[at + capture.RECORD_HEADER.size:at + capture.RECORD_HEADER.size + n]
        at += capture.RECORD_HEADER.size + n
        try:
            decoded = capture._decode(rtype, payload, version)
        except capture._Damaged:
            continue
        if decoded is None:
            continue
        records = decoded if isinstance(decoded, list) else [decoded]
        kept = [(r.type, scrub(r.type, r.body), bytes(r.data) if r.data else b"") for r in records
                if r.type != RecordType.SYMBOLS]
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


def main() -> None:
    out, paths = Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]]
    assert capture._zstd is not None
    found = [s for p in paths for s in samples(p)]
    trained = capture._zstd.train_dict(found, 16 << 10)
    out.write_bytes(trained.dict_content)
    print(f"{out}: {len(found)} samples, {sum(map(len, found)):,} bytes; dictionary id {trained.dict_id}")


if __name__ == "__main__":
    main()
