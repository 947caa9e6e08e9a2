"""The device digest's kernels compiled ahead of time (toolkit.integrity.blake3_cubins): the cubins that
ship are those of today's kernel source, for the signature the launch packs, and load without Triton.

On the CPU: the shipped files and their record, the argument packing, and that compiling them again
(Triton ships ptxas: no GPU needed) gives the same launch shape.  The ``gpu`` tests run the launch on
the H200 (tests/test_device_digest.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from toolkit.integrity import blake3_cubins as cubins

SHIPPED = sorted(p.parent for p in cubins.CUBINS.glob("*/meta.json"))


def test_cubins_ship_for_every_architecture_named_and_no_other():
    assert [p.name for p in SHIPPED] == [f"sm{a}" for a in cubins.ARCHS]


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_cubins_are_todays_kernels_for_the_packed_signature(folder):
    meta = json.loads((folder / "meta.json").read_text())
    # a kernel edited without `python -m toolkit.integrity.blake3_cubins --write` fails here
    assert meta["source_sha256"] == cubins.source_sha256()
    assert meta["block"] == cubins.BLOCK and f"sm{meta['arch']}" == folder.name
    assert {k: v["signature"] for k, v in meta["kernels"].items()} == cubins.KERNELS
    for name, k in meta["kernels"].items():
        image = (folder / f"{name}.cubin").read_bytes()
        assert image[:4] == b"\x7fELF" and name.encode() in image
        assert k["num_warps"] * 32 <= 1024 and k["shared"] == 0


def test_arguments_are_packed_in_order_then_two_null_scratch_pointers():
    array, held = cubins.pack_arguments("chunks_kernel", (0xDEAD0000, 1 << 33, 7, 0xBEEF0000))
    assert len(array) == 6 and len(held) == 6
    kinds = (ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)
    got = [ctypes.cast(array[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(kinds)]
    assert got == [0xDEAD0000, 1 << 33, 7, 0xBEEF0000, 0, 0]
    with pytest.raises(TypeError, match=r"parents_kernel takes 4 arguments \(cvs, nodes, out, root\), got 3"):
        cubins.pack_arguments("parents_kernel", (1, 2, 3))


def test_no_cubins_or_stale_ones_are_not_loaded(monkeypatch):
    assert cubins.load(0, 75) is None  # an architecture we ship none for: Triton's kernels instead
    monkeypatch.setattr(cubins, "source_sha256", lambda: "0" * 64)  # the kernels changed since
    assert cubins.load(0, cubins.ARCHS[0]) is None


def test_compiling_again_gives_the_shipped_launch_shape(tmp_path):
    pytest.importorskip("triton", reason="Triton is a dependency on Linux x86-64 (pyproject.toml)")
    arch = cubins.ARCHS[0]
    # a process of its own: another test of this session may have Triton interpret the kernels instead
    code = "import sys; from pathlib import Path; from toolkit.integrity import blake3_cubins as c; "
    code += "c.CUBINS = Path(sys.argv[1]); c.write(int(sys.argv[2]))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", code, str(tmp_path), str(arch)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = json.loads((tmp_path / f"sm{arch}" / "meta.json").read_text())
    shipped = json.loads((SHIPPED[0] / "meta.json").read_text())
    assert {k: fresh[k] for k in ("arch", "block", "source_sha256", "kernels")} == {
        k: shipped[k] for k in ("arch", "block", "source_sha256", "kernels")
    }
    if fresh["triton_version"] == shipped["triton_version"]:  # the same compiler: the same machine code
        for name in cubins.KERNELS:
            got = _code_sections((tmp_path / f"sm{arch}" / f"{name}.cubin").read_bytes())
            assert got and got == _code_sections((SHIPPED[0] / f"{name}.cubin").read_bytes()), name


def _code_sections(elf: bytes) -> dict[str, bytes]:
    """A cubin's ``.text.*`` sections (the kernels' machine code) by name: its debug sections also
    record where and when it was compiled, which differ between two compiles of the same source."""
    import struct

    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    entsize, count, names_at = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", elf, shoff + i * entsize) for i in range(count)]
    names = sections[names_at][4]

    def name(n: int) -> str:
        return elf[names + n : elf.index(b"\0", names + n)].decode()

    return {name(s[0]): elf[s[4] : s[4] + s[5]] for s in sections if name(s[0]).startswith(".text.")}
