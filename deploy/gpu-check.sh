#!/usr/bin/env bash
# `make gpu-check`: on a machine with NVIDIA GPUs and their driver (no Docker, no CUDA toolkit
# needed). 1. records the real NVML inventory as a test fixture; 2. runs the GPU challenge's
# kernel through the agent's process-runtime path and verifies it with the control plane's
# check (deploy/gpu_check.py). Reads MIG settings, never changes them. Bounded to 6 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
FIXTURES=tests/worker_agent/fixtures
model=$("$PY" -c 'import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(0)))' \
  | tr 'A-Z' 'a-z' | sed 's/^nvidia //; s/[^a-z0-9]\+/_/g; s/^_//; s/_$//')
timeout 60 "$PY" -m worker_agent.inventory record > "$FIXTURES/nvml_${model}.json.tmp"
mv "$FIXTURES/nvml_${model}.json.tmp" "$FIXTURES/nvml_${model}.json"
echo "recorded $FIXTURES/nvml_${model}.json" >&2
exec timeout 300 "$PY" deploy/gpu_check.py
