#!/usr/bin/env bash
# Run on the H200 device machine (not in CI): build every sample for CUDA in a plain
# python3 (no LD_PRELOAD), then run the GPU-marked tests. Usage: bash .ci/gpu_tests.sh [build|test|all]
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CONSTSHARE_CACHE=$PWD/.cache/programs
step=${1:-all}
if [ "$step" = build ] || [ "$step" = all ]; then
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0)); import os; print('CXX=', os.environ.get('CXX'), 'LD_PRELOAD=', os.environ.get('LD_PRELOAD'))"
  python3 - <<'PY'
import time, toolkit.samples as S
for name in S.sample_names():
    t = time.time()
    p = S.build_sample(name, device="cuda", progress=False)
    print(f"built {name} for cuda in {time.time()-t:.1f}s -> {p.root}", flush=True)
PY
  so=$(ls .cache/programs/*-cuda-*/methods/*/model.so | head -1)
  echo "check $so:"; readelf -d "$so" | grep libstdc++; echo "locale symbols: $(nm -D --defined-only "$so" | grep -c _ZNSt6locale)"
fi
if [ "$step" = test ] || [ "$step" = all ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/ "${@:2}" 2>&1 | tee ${OUT:-/tmp}/gpu_pytest.log
fi
