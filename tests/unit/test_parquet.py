"""``memtrace export --format parquet`` (optional: pyarrow) read back by pyarrow, and the DuckDB
query docs/report.md shows reproducing report.json's family table (optional: duckdb)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tests.conftest import ROOT, run_memtrace

WORKLOAD = ROOT / "raw-data" / "workload-malloc"

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed (pip install -e '.[parquet-test]')")


def export(capture: Path, out: Path) -> Path:
    run_memtrace("export", capture, "--format", "parquet", "-o", out)
    return out


def test_rows_add_up_to_the_summary_and_name_the_capture(tmp_path: Path) -> None:
    s = json.loads(run_memtrace("show", WORKLOAD, "--json").stdout)
    table = pq.read_table(export(WORKLOAD, tmp_path / "w.parquet"))
    rows = table.to_pylist()
    total = {v: sum(r["bytes"] for r in rows if r["view"] == v) for v in ("gross", "live", "peak", "temporary")}
    assert total == {"gross": s["gross_bytes"], "live": s["live"]["estimated_bytes"], "peak": s["peak"]["bytes"],
                     "temporary": s["temporary"]["bytes"]}
    assert sum(r["count"] for r in rows if r["view"] == "gross") == s["alloc_calls"]
    assert {r["tracer"] for r in rows} == {"malloc"} and {r["target"] for r in rows} == {"workload"}
    assert len({r["capture_id"] for r in rows}) == 1 and len(rows[0]["capture_id"]) == 64
    leak = [r for r in rows if r["view"] == "leaked"]
    assert [(r["bytes"], r["count"], r["leaf"]) for r in leak] == [(65536, 16, "cache_insert_entry (workload)")]
    assert leak[0]["frames"][0]["function"] == "cache_insert_entry" and leak[0]["frames"][0]["file"].endswith(
        "workload.c")


def test_the_docs_duckdb_query_reproduces_the_reports_family_table(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install -e '.[parquet-test]')")
    folder = tmp_path / "farm"
    shutil.copytree(WORKLOAD, folder / "workload-malloc")
    (folder / "captures").mkdir()
    export(folder / "workload-malloc", folder / "captures" / "workload.parquet")
    doc = json.loads(run_memtrace("report", folder, "--json").stdout)
    families = doc["targets"][0]["malloc"]["families"]
    docs = (ROOT / "docs" / "report.md").read_text()
    query = re.search(r"```sql\n-- memtrace-doc-query: families\n(.*?)```", docs, re.S)
    assert query is not None
    con = duckdb.connect()
    con.execute(f"SET file_search_path = '{folder}'")
    got = con.execute(query.group(1)).fetchall()
    want = [(f["family"], f["bytes"], f["count"], f["live_bytes"], f["live_count"], f["stacks"]) for f in families]
    assert got == want


def test_without_pyarrow_the_error_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    # A pyarrow that cannot be imported, shadowing the installed one.
    fake = tmp_path / "fake"
    (fake / "pyarrow").mkdir(parents=True)
    (fake / "pyarrow" / "__init__.py").write_text("raise ImportError('no pyarrow here')\n")
    env = {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{ROOT / 'src'}"}
    proc = subprocess.run([sys.executable, "-m", "memtrace.cli", "export", str(WORKLOAD), "--format", "parquet", "-o",
                           str(tmp_path / "x.parquet")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr == "memtrace: error: --format parquet needs pyarrow, an optional extra: " \
                          "pip install 'memtrace[parquet]'\n"
