"""The generated layout, read by the engines that run it: layout.js evaluated by Frida's
JavaScript runtime, the C header compiled by CModule with TinyCC (the toolchain an iPhone uses)
and with the external gcc toolchain (Linux's), each held to memtrace.layout."""

from __future__ import annotations

import sys
from typing import Any

import frida
import pytest

from memtrace import agentbuild, layout

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="local-device tests run on Linux")

PROBE_JS = """\
import * as L from './layout.js';

rpc.exports = {
  layout() {
    return L;
  },
  /* Compiles `source` (which defines probe(guint64 *out)) and returns out[0..n). */
  cmodule(source, n, toolchain) {
    const cm = new CModule(source, {}, { toolchain });
    const out = Memory.alloc(8 * n);
    new NativeFunction(cm.probe, 'void', ['pointer'])(out);
    const values = [];
    for (let i = 0; i < n; i++)
      values.push(out.add(8 * i).readU64().toNumber());
    return values;
  },
};
"""


def _probe_c() -> tuple[str, list[tuple[str, int]]]:
    """C that writes every struct's size and field offsets, and every #define's value."""
    expected: list[tuple[str, int]] = []
    body: list[str] = []
    for s in layout.C_STRUCTS:
        expected.append((f"sizeof {s.c_name}", s.size))
        body.append(f"sizeof ({s.c_name})")
        for name, off in s.offsets.items():
            expected.append((f"{s.c_name}.{name}", off))
            body.append(f"(guint64) (gsize) &((({s.c_name} *) 0)->{name})")
    header = agentbuild.c_layout_header()
    for line in header.splitlines():
        if line.startswith("#define MT_"):
            _, name, value = line.split()
            expected.append((name, int(value.rstrip("u"), 0)))
            body.append(f"(guint64) ({name})")
    lines = [header, "void", "probe (guint64 * out)", "{"]
    lines += [f"  out[{i}] = {expr};" for i, expr in enumerate(body)]
    lines.append("}")
    return "\n".join(lines) + "\n", expected


@pytest.fixture(scope="module")
def probe() -> Any:
    source = agentbuild._compile({"layout.js": agentbuild.js_layout_module().encode(),
                                  "probe.js": PROBE_JS.encode()}, "probe.js")
    session = frida.get_local_device().attach(0)
    script = session.create_script(source, name="memtrace-layout-probe")
    script.load()
    yield script.exports_sync
    script.unload()
    session.detach()


@pytest.mark.smoke
def test_layout_js_evaluates_to_the_python_layout(probe: Any) -> None:
    assert probe.layout() == agentbuild.layout_constants()


@pytest.mark.parametrize("toolchain", ["internal", "external"])
def test_the_cmodule_compilers_lay_out_the_header_as_layout_py(probe: Any, toolchain: str) -> None:
    source, expected = _probe_c()
    got = probe.cmodule(source, len(expected), toolchain)
    assert dict(zip([k for k, _ in expected], got, strict=True)) == dict(expected)
