#!/usr/bin/env bash
# One device session's GPU work, in calls of at most 10 minutes each (carry [".whl", ".whlet"]):
#   bash .ci/gpu_session.sh tests    every GPU test (gpu_tests.sh all; 2026-12-02 on a cold machine: samples
#                                    built in ~130 s, 277 tests in 300 s), and meanwhile executorch 1.2.0
#                                    exports what ONLY_GEN1 names (default shared_ok) and loads it
#   bash .ci/gpu_session.sh scale    verify/blame/reset at 16.5 GiB per method (its build alone took 308 s
#                                    on 2026-12-02, so it has a call of its own)
#   bash .ci/gpu_session.sh diff     the differential oracle's cost on the program `scale` built (same warm
#                                    machine: /tmp/verify_blame_scale), ~2 minutes
#   bash .ci/gpu_session.sh default  the default load path (issue 25, targets 1-2)
#   bash .ci/gpu_session.sh bench    diff, then default (after `scale` on the same machine)
#   bash .ci/gpu_session.sh digest   the device digest's GPU tests, its kernels alone, then the default path
#                                    with and without it (issue 25, target 1)
#   bash .ci/gpu_session.sh uploads  the upload/integrity GPU tests that need no built sample, then the
#                                    sequence rounding probe at 4 layers (issue 24's open question)
# Everything it writes goes to $OUT (at most 8 files come back from the device).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
inst() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
inst /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CONSTSHARE_CACHE=$PWD/.cache
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
case "${1:-tests}" in
tests)
  if ls .whlet/executorch-1.2.0-*.whl >/dev/null 2>&1; then
    inst /tmp/et12 .whlet/executorch-1.2.0-*.whl .whlet/torchao-*.whl .whlet/ruamel*.whl .whlet/expecttest-*.whl \
      .whlet/kgb-*.whl .whlet/parameterized-*.whl || exit 1
    PYTHONPATH=/tmp/et12:/tmp/site:$PWD timeout -k 5 240 python3 tests/fixtures/make_executorch_fixtures.py \
      --only "${ONLY_GEN1:-shared_ok}" --out /tmp/etfx/executorch-1.2.0-cuda --pack "$OUT/g1" > "$OUT/export_gen1.log" 2>&1 &
    EXPORT=$!
  fi
  # gpu_tests.sh writes $OUT/gpu_pytest.log itself; its console goes beside it
  timeout -k 5 "${TEST_TIMEOUT_S:-540}" bash .ci/gpu_tests.sh all > "$OUT/gpu_tests_console.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Timeout" "$OUT/gpu_pytest.log" | tail -25
  if [ -n "${EXPORT:-}" ]; then
    wait "$EXPORT"; echo "gen-1 export rc=$?"; grep -v "^    \|Warning\|warn(" "$OUT/export_gen1.log" | tail -6
    timeout -k 5 60 python3 benchmarks/executorch_programs.py --root /tmp/etfx/executorch-1.2.0-cuda --out "$OUT/table" \
      > /tmp/table.log 2>&1; echo "table rc=$?"; tail -12 /tmp/table.log
  fi
  ;;
scale)
  timeout -k 5 "${T_SCALE:-570}" python3 benchmarks/verify_blame_scale.py --out "$OUT" > "$OUT/verify_blame_scale.log" 2>&1
  echo "verify_blame_scale rc=$?"; tail -25 "$OUT/verify_blame_scale.log"
  ;;
diff|bench)
  timeout -k 5 "${T_DIFF:-200}" python3 benchmarks/differential_cost.py --program-dir /tmp/verify_blame_scale \
    --compute float32 --culprit blocks.1.w2 --reuse --out "$OUT" > "$OUT/differential_cost.log" 2>&1
  echo "differential_cost rc=$?"; tail -15 "$OUT/differential_cost.log"
  ;;&
default|bench)
  timeout -k 5 "${T_DEFAULT:-300}" python3 benchmarks/default_path.py --device cuda --gib 2.0 --runs 2 \
    --program-dir /tmp/bench_prefill_decode --out "$OUT" > "$OUT/default_path.log" 2>&1
  echo "default_path rc=$?"; tail -15 "$OUT/default_path.log"
  ;;
digest)
  timeout -k 5 "${T_TESTS:-200}" python3 -m pytest -m gpu -v -p no:cacheprovider --timeout 150 \
    tests/test_device_digest.py tests/test_verified_staging.py tests/test_upload.py > "$OUT/gpu_digest_tests.log" 2>&1
  echo "digest tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_digest_tests.log" | tail -15
  timeout -k 5 60 python3 benchmarks/probes/device_blake3_probe.py --out "$OUT" > "$OUT/device_blake3_probe.log" 2>&1
  echo "probe rc=$?"; tail -4 "$OUT/device_blake3_probe.log"
  timeout -k 5 "${T_DEFAULT:-330}" python3 benchmarks/default_path.py --device cuda --gib 2.0 --runs 3 \
    --settings default "default, host digest" "integrity off" --program-dir /tmp/bench_prefill_decode --out "$OUT" \
    > "$OUT/default_path.log" 2>&1
  echo "default_path rc=$?"; tail -15 "$OUT/default_path.log"
  ;;
uploads)
  timeout -k 5 "${T_UPLOADS:-200}" python3 -m pytest -m gpu -v -p no:cacheprovider --timeout 120 \
    tests/test_upload.py tests/test_integrity_pieces.py tests/test_concurrent_writer.py ${UPLOAD_TESTS:-} \
    > "$OUT/gpu_upload_tests.log" 2>&1
  echo "upload tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_upload_tests.log" | tail -15
  timeout -k 5 "${T_PROBE:-240}" python3 benchmarks/probes/sequence_rounding_probe.py --layers 4 --compute float32 \
    --program-dir /tmp/rounding_probe --out "$OUT" > "$OUT/sequence_rounding_probe.log" 2>&1
  echo "rounding probe rc=$?"; tail -15 "$OUT/sequence_rounding_probe.log"
  ;;
esac
echo "== done $(date -u +%T)"
