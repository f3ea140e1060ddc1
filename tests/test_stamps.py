"""Generated kernel sources carry digests of the helper modules they call, not hand-bumped
version numbers: an edit of a helper renames every generated module that imports it, so
Numba's disk cache (keyed by the generated file) never serves a kernel built on older code."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import runtime.kernels
from runtime.kernels import attention, codegen, simd, vmath
from runtime.kernels.codegen import source_stamp

KERNELS = Path(runtime.kernels.__file__).parent


def test_an_edited_source_gives_another_stamp(tmp_path):
    copy = tmp_path / "vmath.py"
    shutil.copy(vmath.__file__, copy)
    assert source_stamp(copy) == source_stamp(vmath.__file__)  # name and bytes, not the place
    copy.write_bytes(copy.read_bytes() + b"\n")
    codegen.file_digest.cache_clear()
    assert source_stamp(copy) != source_stamp(vmath.__file__)
    assert source_stamp(vmath.__file__) == source_stamp(vmath.__file__, length=40)[:16]


def test_import_lines_and_headers_carry_the_stamps_of_their_modules():
    assert vmath.IMPORT.endswith(f"# vmath {source_stamp(vmath.__file__)}")
    assert vmath.LOG_IMPORT.endswith(f"# vmath log {source_stamp(KERNELS / 'vlog.py', vmath.__file__)}")
    assert simd.ops_import("float32").endswith(f"# simd {source_stamp(simd.__file__)}")
    assert simd.scan_import("float64").endswith(f"# simd {source_stamp(simd.__file__)}")
    assert attention.STAMP == source_stamp(attention.__file__, KERNELS / "atomic.py")
    source = attention._source("float32", ["x = _vexp(x)"], parallel=False)
    assert f"runtime.kernels.attention {attention.STAMP}" in source and vmath.IMPORT in source


def test_no_hand_bumped_versions_remain():
    for path in KERNELS.glob("*.py"):
        assert not re.search(r"^\w*VERSION\s*=", path.read_text(), re.M), path.name
