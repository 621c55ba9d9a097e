#!/usr/bin/env bash
# The GPU check (see bench/gpu_check.py); on the device machine: bash bench/gpu_check.sh --out $OUT/gpu.json
# PYTHON=... picks the interpreter (default: python on PATH).
set -euo pipefail
exec "${PYTHON:-python}" "$(dirname "$0")/gpu_check.py" "$@"
