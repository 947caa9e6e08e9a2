"""Golden outputs: what a user sees from every sample under every policy, fixed in files.

A change that should not alter behaviour (a move, a split, a rename) must leave every file in
``tests/golden/`` equal.  A change that means to alter output regenerates them on purpose:
``CONSTSHARE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``, and the diff is reviewed.

Captured: the dry-run decisions, comparisons and verdict frames of every sample under every
policy; the CLI's stdout, exit code and CSV of ``report --dry-run`` (every sample, every policy),
``compare --dry-run`` (every sample) and ``scan`` (the samples, the real ExecuTorch exports); and
the README's main job, ``compare total_collision``, a real load on the CPU.  Digests, the build
cache's location and timings differ between machines, so they are masked, nothing else.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("CONSTSHARE_UPDATE_GOLDEN", "") == "1"

_HEX = re.compile(r"\b[0-9a-f]{8,}(…|\.\.\.)?")
# a digest cut by the output's wrapping: its tail opens the next line, and differs from build to build
# (a sample's .so, so its digest, differs between CPUs); dropped, the head is masked with the rest
_WRAPPED_HEX = re.compile(r"\b([0-9a-f]{8,})\n([ \t]*)[0-9a-f]+(?=[_:.,)\]])")
_FLOAT = re.compile(r"(?<![\w.])\d+\.\d+(e[-+]?\d+)?(?![\w.])")


def _masked(text: str, *roots: Path) -> str:
    for root in roots:
        text = text.replace(str(root), f"<{root.name}>")
    text = _FLOAT.sub("<f>", text)  # timings first: their digits would read as hex
    text = _WRAPPED_HEX.sub(r"\1\n\2", text)
    return _HEX.sub("<hex>", text)


def _cli(args: list[str], *roots: Path) -> str:
    from toolkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return _masked(f"$ constshare {' '.join(args)}\nexit {code}\n{out.getvalue()}", *roots)


def _check(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"{path} is missing: regenerate with CONSTSHARE_UPDATE_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} differs from {path}"


def _policies() -> list[str]:
    from toolkit import POLICIES

    return [str(p) for p in POLICIES]


def _samples() -> list[str]:
    from toolkit.build.samples import sample_names

    return sample_names()


def _frame_text(frame) -> str:
    return frame.to_csv(index=False)


@pytest.fixture(scope="module")
def all_samples(built_sample):
    return {name: built_sample(name) for name in _samples()}


@pytest.mark.slow
def test_dry_run_frames(all_samples):
    from toolkit import run_analysis
    from toolkit.engine.frames import verdict_frames

    for name, program in all_samples.items():
        parts = []
        for policy in _policies():
            s = run_analysis(program, policy).session
            methods, constants = verdict_frames(s.verdict())
            for title, frame in (
                ("decisions", s.decisions),
                ("comparisons", s.comparisons),
                ("lookups", s.lookups),
                ("memory", s.memory),
                ("verdict methods", methods),
                ("verdict constants", constants),
            ):
                parts.append(f"## {policy}: {title}\n{_frame_text(frame)}")
        _check(f"frames-{name}", _masked("\n".join(parts), Path(program.root).parent))


@pytest.mark.slow
def test_cli_report_and_compare_dry_run(all_samples, tmp_path):
    for name, program in all_samples.items():
        root = Path(program.root).parent
        parts = []
        for policy in _policies():
            csv = tmp_path / f"{name}-{policy}.csv"
            parts.append(_cli(["report", name, "--dry-run", "--policy", policy, "--csv", str(csv)], root, tmp_path))
            parts.append(_masked(csv.read_text(encoding="utf-8"), root, tmp_path))
        csv = tmp_path / f"{name}-compare.csv"
        parts.append(_cli(["compare", name, "--dry-run", "--csv", str(csv)], root, tmp_path))
        parts.append(_masked(csv.read_text(encoding="utf-8"), root, tmp_path))
        _check(f"cli-{name}", "\n".join(parts))


@pytest.mark.slow
def test_cli_scan(all_samples, tmp_path):
    from executorch_fixtures import unpacked

    folder = tmp_path / "samples"
    for name, program in all_samples.items():
        shutil.copytree(program.root, folder / name)
    csv = tmp_path / "scan.csv"
    text = _cli(["scan", str(folder), "--csv", str(csv), "--jobs", "2"], tmp_path)
    _check("scan-samples", text + _masked(csv.read_text(encoding="utf-8"), tmp_path))

    exports = [unpacked("1.5.1"), unpacked("1.2.0"), unpacked("1.5.1", "families")]
    real = tmp_path / "exports"
    for root in exports:
        assert root.is_dir(), f"{root}: the real exports did not unpack"
        shutil.copytree(root, real / root.name)
    csv = tmp_path / "scan-exports.csv"
    text = _cli(["scan", str(real), "--csv", str(csv), "--jobs", "2"], tmp_path)
    _check("scan-exports", text + _masked(csv.read_text(encoding="utf-8"), tmp_path))


@pytest.mark.slow
def test_readme_main_job(all_samples, tmp_path):
    root = Path(all_samples["total_collision"].root).parent
    csv = tmp_path / "compare.csv"
    text = _cli(["compare", "total_collision", "--csv", str(csv)], root, tmp_path)
    _check("readme-main-job", text + _masked(csv.read_text(encoding="utf-8"), root, tmp_path))


@pytest.mark.slow
def test_cli_real_exports(tmp_path):
    """report (default policy: what the ExecuTorch reading the file runs) and compare, dry runs, of every
    real export; the default output fits 100 columns and opens with the answer."""
    from executorch_fixtures import unpacked

    for root in (unpacked("1.5.1"), unpacked("1.2.0"), unpacked("1.5.1", "families"), unpacked("1.2.0", "families")):
        parts = []
        for pte in sorted(root.glob("*/prog.pte")):
            for args in (["report", str(pte), "--dry-run"], ["compare", str(pte), "--dry-run"]):
                text = _cli(args, root, tmp_path)
                lines = text.splitlines()
                assert max(map(len, lines[1:]), default=0) <= 100, (args, max(lines[1:], key=len))
                parts.append(text)
        _check(f"real-{root.name}", "\n".join(parts))


def test_a_digest_cut_by_the_wrapping_is_masked_whole_and_words_after_a_digest_are_kept():
    assert _masked("key cpu:0123456789abcdef\n    55_so_blob: x") == "key cpu:<hex>\n    _so_blob: x"
    assert _masked("digest 0123456789abcdef\n  a piece, added") == "digest <hex>\n  a piece, added"
