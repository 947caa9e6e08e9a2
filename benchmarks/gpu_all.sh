#!/usr/bin/env bash
# Every GPU benchmark of the program in _program.py in one go, for one lease of the device machine:
#   OUT=<results dir> LOG=<log file> bash benchmarks/gpu_all.sh
# Builds the program once (into $PROG), then runs each script under its own time limit,
# so a slow step cannot take the later ones with it; each writes $OUT/<benchmark>/<date>-<machine>.csv
# (OUT defaults to benchmarks/results). The console goes to $LOG (default /tmp/gpu_all.log: a log is
# not a result, keep it out of benchmarks/results).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
LOG=${LOG:-/tmp/gpu_all.log}
PROG=${PROG:-/tmp/bench_prefill_decode}
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
{
  echo "== $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tr '\n' ' ')"
  python3 -c "import torch, pandas; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  echo "== gpu_memory";        timeout -k 5 ${T_MEM:-330} python3 benchmarks/gpu_memory.py --program-dir "$PROG" --out "$OUT"
  echo "== host_paths";        timeout -k 5 ${T_HP:-60} python3 benchmarks/host_paths.py --out "$OUT"
  echo "== upload_throughput"; timeout -k 5 ${T_UP:-150} python3 benchmarks/upload_throughput.py --program-dir "$PROG" --out "$OUT" ${UP_ARGS:---cold}
  echo "== recording_overhead"; timeout -k 5 ${T_REC:-80} python3 benchmarks/recording_overhead.py --program-dir "$PROG" --out "$OUT"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    echo "== placement";       timeout -k 5 ${T_PL:-80} python3 benchmarks/placement.py --program-dir "$PROG" --out "$OUT" ${PL_ARGS:-}
  else
    echo "== placement skipped: one GPU"
  fi
  echo "== done $(date -u '+%H:%M:%S')"
} 2>&1 | grep -v -e "Warning: " -e "warnings.warn" | tee "$LOG"
