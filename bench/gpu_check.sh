#!/usr/bin/env bash
# The GPU check in one command, for a bare GPU machine: Python 3.12 with torch, transformers
# and peft (and the image's other packages) installed, no package index.
#
#   bench/gpu_wheels.sh                     # here, with network: fills .whl/ (ignored by git)
#   bench/gpu_check.sh                      # there: --device cuda, results under $OUT
#   bench/gpu_check.sh --device cpu --out /tmp/gpu-check   # the same on a CPU, small sizes
#
# It installs the carried wheels from .whl/ into a scratch --target directory (only on Python
# 3.12, which they are built for; GPU_CHECK_WHEELS=<dir> installs another directory's on any
# Python), puts src/ on PYTHONPATH (the project needs no install), and runs the phases in
# bench/gpu_check.py: environment, models, tests/gpu, bench/gpu_bench.py and every journey's
# smoke. Results go to --out (default: $OUT, else /tmp/gpu-check-out): summary.json, setup.log,
# gpu_tests.log, gpu_bench.json, gpu_bench.log, smokes.log, backend_logs.tar.gz.
# GPU_CHECK_LOCK=/tmp/torch.lock: each phase holds that flock(1) lock while it runs (a shared
# CPU machine); waiting for it counts against no time limit.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"
out="${OUT:-/tmp/gpu-check-out}"
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
wheel_log="$work/wheels.log"

wheels="${GPU_CHECK_WHEELS:-}"
if [[ -z "$wheels" ]] && compgen -G ".whl/*.whl" >/dev/null; then
  if "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    wheels=".whl"
  else
    echo "not installing .whl/: its wheels are for Python 3.12, this is $("$python" -V 2>&1)" >>"$wheel_log"
  fi
fi
if [[ -n "$wheels" ]]; then
  echo "installing $(ls "$wheels"/*.whl | wc -l) wheels from $wheels into $work/site" >>"$wheel_log"
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$work/site" "$wheels"/*.whl >>"$wheel_log" 2>&1
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$repo/src:$repo${PYTHONPATH:+:$PYTHONPATH}"
# pycosat (imported by reasoning_gym, used by none of its datasets the journeys run) has no
# wheel to carry; a stand-in that raises when called takes its place where it is missing.
if ! "$python" -c 'import pycosat' 2>/dev/null; then
  echo "pycosat is missing: using bench/gpu_standins/pycosat.py" >>"$wheel_log"
  export PYTHONPATH="$PYTHONPATH:$repo/bench/gpu_standins"
fi

exec "$python" bench/gpu_check.py --out "$out" --work "$work" "${args[@]}"
