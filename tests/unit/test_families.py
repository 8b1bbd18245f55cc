"""Stack families: built-in rules on demo and iOS frames, user overrides, bad rule files."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtrace.analyze.families import (
    NO_STACK,
    FamilyRules,
    builtin_rules,
    classify,
    load_rules,
    split_label,
)
from memtrace.errors import InputError


def stack(fn: str, module: str = "workload") -> list[str]:
    # What a captured stack looks like: caller of malloc first, then its callers, then libc's start.
    return [f"{fn} ({module})", f"main ({module})", "libc.so.6+0x29d90"]


@pytest.mark.parametrize(("fn", "family"), [
    ("json_parse_document", "JSON parsing"), ("json_tokenize", "JSON parsing"),
    ("json_serialize_response", "JSON parsing"), ("image_decode_frame", "image decode"),
    ("image_decoder_alloc_frame", "image decode"), ("jpeg_decode_scanlines", "image decode"),
    ("png_inflate_idat", "image decode"), ("gzip_inflate_chunk", "gzip/compression"),
    ("deflate_response", "gzip/compression"), ("net_receive_buffer", "network buffers"),
    ("http_read_request", "network buffers"), ("nw_segment_empty", "network buffers"),
    ("mtl_command_buffer_encode", "Metal/GPU"), ("mtl_buffer_create", "Metal/GPU"),
    ("protobuf_serialize_message", "serialization"), ("protobuf_arena_alloc", "serialization"),
    ("camera_session_configure", "media/camera"), ("camera_metadata_alloc", "media/camera"),
    ("camera_pool_create_surface", "media/camera"), ("sqlite3_db_release_memory", "SQLite"),
    ("sqlite_pcache_unpin", "SQLite"), ("ca_layer_backing_create", "Core Animation"),
    ("cache_insert_entry", "caches"), ("response_cache_store", "caches"),
])
def test_demo_functions(fn: str, family: str) -> None:
    assert classify(stack(fn)) == family


@pytest.mark.parametrize(("frames", "family"), [
    (["-[NSJSONSerialization JSONObjectWithData:options:error:] (Foundation)"], "JSON parsing"),
    (["CA::Render::Shmem::new_shmem(unsigned long) (QuartzCore)"], "Core Animation"),
    (["IOGPUResourceListInit (IOGPU)"], "Metal/GPU"),
    (["-[NSKeyedArchiver encodeObject:forKey:] (Foundation)"], "serialization"),
    (["CVPixelBufferPoolCreatePixelBuffer (CoreVideo)"], "media/camera"),
    (["sqlite3PagerGet (libsqlite3.dylib)"], "SQLite"),
    (["libz.1.dylib+0x4410"], "gzip/compression"),
    (["dispatch_data_create (libdispatch.dylib)"], "network buffers"),
    (["CGImageSourceCreateImageAtIndex (ImageIO)"], "image decode"),
])
def test_ios_frames(frames: list[str], family: str) -> None:
    # Allocator frames in front never count: the signature starts after them.
    assert classify(["malloc_zone_malloc (libsystem_malloc.dylib)", "_malloc_zone_malloc (libsystem_malloc.dylib)",
                     "operator new(unsigned long) (libc++abi.dylib)", *frames]) == family


def test_first_matching_signature_frame_wins() -> None:
    # A wrapper nobody claims in front of JSON code: the JSON frame behind it decides.
    assert classify(["CFDataCreate (CoreFoundation)", "json_parse_document (app)"]) == "JSON parsing"
    # Two claimed frames: the innermost one decides.
    assert classify(["gzip_inflate_chunk (app)", "net_receive_buffer (app)"]) == "gzip/compression"


def test_unmatched_by_top_signature_frame_never_dropped() -> None:
    assert classify(["malloc (libc.so.6)", "simd_buffer_alloc (workload)", "main (workload)"]) == \
        "other: simd_buffer_alloc"
    # Named by the function alone: a rebuilt (or renamed) executable keeps its families.
    assert classify(["simd_buffer_alloc (workload-v2)"]) == classify(["simd_buffer_alloc (workload)"])
    assert classify([{"function": "simd_buffer_alloc", "module": "app"}]) == "other: simd_buffer_alloc"
    assert classify(["workload+0x1234", "main (workload)"]) == "other: workload+0x1234"
    # Only runtime frames / unresolved addresses: the top frame names it.
    assert classify(["libc.so.6+0x10", "0x7f0000001000"]) == "other: libc.so.6+0x10"
    assert classify(["<stack dropped>"]) == "other: <stack dropped>"
    assert classify([]) == NO_STACK


def test_depth_limits_the_search() -> None:
    rules = load_rules()
    deep = [f"f{i} (app)" for i in range(rules.depth)] + ["json_parse_document (app)"]
    assert rules.classify(deep) == "other: f0"
    assert rules.classify(deep[1:]) == "JSON parsing"


def test_split_label() -> None:
    assert split_label("CA::Render::Shmem::set_volatile(bool, int*) (QuartzCore)") == \
        ("CA::Render::Shmem::set_volatile(bool, int*)", "QuartzCore")
    assert split_label("libc.so.6+0x891f5") == (None, "libc.so.6")
    assert split_label("0x7f93e97861f5") == (None, None)
    assert split_label("bare_symbol") == ("bare_symbol", None)
    assert split_label(("sym", "mod")) == ("sym", "mod")


def test_user_rules_add_and_override(tmp_path: Path) -> None:
    f = tmp_path / "rules.yaml"
    f.write_text(
        "families:\n"
        "  - name: SIMD scratch\n    symbols: ['simd_*']\n"
        "  - name: JSON parsing\n    symbols: ['my_json_*']\n"
        "skip:\n  symbols: ['my_alloc_wrapper']\n"
    )
    rules = load_rules(f)
    assert rules.classify(stack("simd_buffer_alloc")) == "SIMD scratch"
    assert rules.classify(stack("my_json_reader")) == "JSON parsing"
    # Overriding replaces the built-in patterns of that family.
    assert rules.classify(stack("json_parse_document")) == "other: json_parse_document"
    assert rules.classify(["my_alloc_wrapper (app)", "gzip_inflate_chunk (app)"]) == "gzip/compression"
    assert rules.names[0] == "SIMD scratch"
    # The built-in set is untouched by a merge.
    assert builtin_rules().classify(stack("json_parse_document")) == "JSON parsing"


@pytest.mark.parametrize(("text", "needle"), [
    ("families: [\n", "not valid YAML"),
    ("- just\n- a list\n", "expected a mapping"),
    ("families:\n  - symbols: ['x*']\n", "needs a 'name'"),
    ("families:\n  - name: x\n", "neither 'symbols' nor 'modules'"),
    ("families:\n  - name: x\n    symbols: 3\n", "must be a list of glob strings"),
    ("famlies: []\n", "unknown key"),
    ("depth: -1\n", "'depth'"),
    ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
])
def test_bad_rule_file_is_one_line_naming_it(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        load_rules(f)
    msg = str(e.value)
    assert str(f) in msg and needle in msg and "\n" not in msg


def test_missing_rule_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read family rules"):
        load_rules(tmp_path / "nope.yaml")


def test_every_builtin_family_has_patterns() -> None:
    rules = builtin_rules()
    assert isinstance(rules, FamilyRules) and len(rules.names) == len(set(rules.names)) >= 10
