"""``benchmarks/default_path.py --timeline`` prints where each method's load went (issue 40)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMELINE = REPO / "benchmarks" / "results" / "default_path" / "2026-12-06-h100-80gb-hbm3-0206-timeline.json"


def _default_path():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import default_path

        return default_path
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_each_methods_load_is_split_into_before_uploading_and_after_summing_to_it():
    timelines = json.loads(TIMELINE.read_text())
    lines = _default_path().breakdown(timelines["default"])
    assert [line.split(":")[0] for line in lines] == ["prefill", "decode"]
    for line in lines:
        total, before, uploading, after = (
            float(x)
            for x in re.match(
                r"\w+: ([\d.]+) ms = ([\d.]+) before .* \+ ([\d.]+) uploading .* \+ ([\d.]+) after", line
            ).groups()
        )
        assert abs(before + uploading + after - total) <= 0.15, line
    # the H100 run's own figures: prefill's 2.165 GB staged in 121.1 ms
    assert "121.1 uploading 2.165 GB (17.9 GB/s, verified pinned staging)" in lines[0]


def test_a_method_without_uploads_says_so():
    rows = [
        {"t": 0.001, "kind": "load_started", "method": "probe"},
        {"t": 0.004, "kind": "method_loaded", "method": "probe"},
    ]
    assert _default_path().breakdown(rows) == ["probe: 3.0 ms, no upload"]
