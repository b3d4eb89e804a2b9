#!/usr/bin/env bash
# The prepared GPU check (about 5 minutes on one H200): the CUDA tests, then random-weight timing of the
# real shapes with CUDA graphs. Run from the repository root with a Python that has CUDA torch, e.g. on
# the device machine:  PYTHONUNBUFFERED=1 bench/gpu.sh   (results in $OUT, or bench/results/<date>-gpu/)
set -euo pipefail
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
py=${PY:-python3}
out=${OUT:-bench/results/$(date +%F)-gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
$py -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$out/gpu.txt"
$py -m pytest -q -p no:cacheprovider -m gpu tests/engine 2>&1 | tee "$out/gpu-tests.txt" || true
for spec in "llama3-8b:llama3-1b bf16" "llama3-8b:llama3-1b fp8" "llama3-70b:llama3-8b fp8"; do
  read -r shapes dtype <<<"$spec"
  timeout 300 $py -m engine bench --shapes "$shapes" --random-weights --dtype "$dtype" --context 1024 \
    --max-gamma 8 --repeats 20 2>&1 | tee "$out/shapes-${shapes/:/-}-$dtype.txt" || true
done
