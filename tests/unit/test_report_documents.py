"""``memtrace report`` over census/jetsam JSON documents of the wrong shape: skipped with the key
that is wrong, never a traceback; the documents memtrace itself writes pass the same check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.conftest import run_memtrace

from memtrace.analyze import census as C
from memtrace.analyze import jetsam as J
from memtrace.cli import cli
from memtrace.report import build_report

DATA = Path(__file__).resolve().parents[1] / "data"

GOOD_CENSUS = {"kind": "census", "version": 1, "platform": "linux", "time": "t",
               "device": {"id": "local", "name": "vm", "type": "local"},
               "rows": [{"pid": 1, "name": "init", "status": "ok", "footprint": 4096, "priority": 0,
                         "band": "DEFAULT"}],
               "totals": {"processes": 1, "measured": 1, "vanished": 0, "denied": 0, "footprint": 4096},
               "errors": {}, "notes": []}

BAD_JETSAM = [
    ({"kind": "jetsam", "reports": [1]}, "reports[0]: expected an object, got 1"),
    ({"kind": "jetsam", "totals": [1]}, "totals: expected an object, got [1]"),
    ({"kind": "jetsam", "reports": [{"killed": [{"name": "a", "reason": "x", "footprint": "abc",
                                                  "kill_delta": 1}], "product": None, "os_version": None,
                                      "timestamp": None, "largest_process": None}]},
     "reports[0].killed[0].footprint: expected an integer or null, got 'abc'"),
    ({"kind": "jetsam", "limit_by_model": [{"product": "p", "os_versions": [], "kills": 1, "footprint_min": 1,
                                            "footprint_median": 1, "footprint_max": 1, "processes": "abc"}]},
     "limit_by_model[0].processes: expected an object, got 'abc'"),
    ({"kind": "jetsam", "kills_by_reason": {"x": "1"}}, "kills_by_reason.x: expected an integer, got '1'"),
    ({"kind": "jetsam", "kills_by_process": [{"name": 5, "kills": 1, "reasons": {}, "max_footprint": None}]},
     "kills_by_process[0].name: expected a string, got 5"),
    ({"kind": "jetsam", "skipped": [{"source": "a"}]}, "skipped[0]: missing 'reason'"),
    ({"kind": "jetsam", "totals": {"kills": True}}, "totals.kills: expected an integer, got True"),
]
BAD_CENSUS = [
    ({**GOOD_CENSUS, "rows": "abc"}, "rows: expected a list, got 'abc'"),
    ({**GOOD_CENSUS, "rows": [1]}, "rows[0]: expected an object, got 1"),
    ({**GOOD_CENSUS, "rows": [{"pid": "1"}]}, "rows[0].pid: expected an integer, got '1'"),
    ({**GOOD_CENSUS, "rows": [{"pid": 1, "footprint": [1]}]}, "rows[0].footprint: expected an integer or null"),
    ({**GOOD_CENSUS, "totals": [1]}, "totals: expected an object, got [1]"),
    ({**GOOD_CENSUS, "totals": {"processes": 1, "vanished": "0"}}, "totals.vanished: expected an integer, got '0'"),
    ({**GOOD_CENSUS, "notes": "abc"}, "notes: expected a list, got 'abc'"),
    ({**GOOD_CENSUS, "device": "vm"}, "device: expected an object, got 'vm'"),
    ({k: v for k, v in GOOD_CENSUS.items() if k != "rows"}, "document: missing 'rows'"),
]


@pytest.mark.parametrize(("doc", "why"), BAD_JETSAM + BAD_CENSUS)
def test_report_skips_a_document_of_the_wrong_shape_naming_the_key(tmp_path: Path, doc: dict, why: str) -> None:
    (tmp_path / f"{doc['kind']}-1.json").write_text(json.dumps(doc))
    result = build_report(tmp_path)
    assert result.exit_code == 1
    (skipped,) = result.skipped
    assert skipped.path == f"{doc['kind']}-1.json"
    assert why in skipped.reason
    assert why in result.document["skipped"][0]["reason"]


def test_cli_report_over_bad_documents_is_one_line_per_file(tmp_path: Path) -> None:
    for i, (doc, _) in enumerate(BAD_JETSAM):
        (tmp_path / f"jetsam-{i}.json").write_text(json.dumps(doc))
    proc = run_memtrace("report", tmp_path, check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len([ln for ln in lines if ln.startswith("memtrace: skipped: jetsam-")]) == len(BAD_JETSAM)
    assert "Traceback" not in proc.stderr


def test_documents_memtrace_writes_pass_the_check(tmp_path: Path) -> None:
    jetsam_json = tmp_path / "jetsam-real.json"
    census_json = tmp_path / "census-real.json"
    assert CliRunner().invoke(cli, ["jetsam", str(DATA / "jetsam"), "--out-json", str(jetsam_json), "-q"]).exit_code == 0
    assert CliRunner().invoke(cli, ["census", "--device", "local", "--out", str(census_json), "-q"]).exit_code == 0
    assert J.document_problem(json.loads(jetsam_json.read_text())) is None
    assert C.document_problem(json.loads(census_json.read_text())) is None
    assert C.document_problem(GOOD_CENSUS) is None
    result = build_report(tmp_path)
    assert result.skipped == [] and len(result.document["census"]) == 1 and len(result.document["jetsam"]) == 1
