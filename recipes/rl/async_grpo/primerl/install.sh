#!/usr/bin/env bash
# Build prime-rl's own environment for the async GRPO journey (Python 3.12, separate from this
# project's 3.11 environment), exactly as pinned in this folder.
#
#   bash recipes/rl/async_grpo/primerl/install.sh VENV [PRIME_RL_CHECKOUT VERIFIERS_CHECKOUT]
#
# VENV                a new virtual environment's path (created with python3.12, or $PYTHON312)
# *_CHECKOUT          local clones at the pinned commits, for machines that cannot reach GitHub;
#                     without them the git requirements are installed from GitHub.
# Then: export CORTEX_RECIPES_PRIMERL_PYTHON=VENV/bin/python
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:?usage: install.sh VENV [PRIME_RL_CHECKOUT VERIFIERS_CHECKOUT]}"
prime_rl="${2:-}"
verifiers="${3:-}"
python="${PYTHON312:-python3.12}"
command -v "$python" >/dev/null || { echo "install.sh: no $python (set PYTHON312)" >&2; exit 2; }

pin() { sed -n "s|^$1 @ git+https://github.com/[^@]*@\([0-9a-f]\{40\}\).*|\1|p" "$here/requirements-git.txt" | head -1; }
check_commit() {  # checkout, expected commit
  local got
  got="$(git -C "$1" rev-parse HEAD)"
  [ "$got" = "$2" ] || { echo "install.sh: $1 is at $got, the pin is $2" >&2; exit 2; }
}

"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --no-input --no-deps)
"${pip[@]}" --require-hashes -r "$here/requirements.txt"
"${pip[@]}" --require-hashes -r "$here/requirements-nodeps.txt"
if [ -n "$prime_rl" ] && [ -n "$verifiers" ]; then
  check_commit "$verifiers" "$(pin verifiers)"
  check_commit "$prime_rl" "$(pin prime-rl)"
  "${pip[@]}" "$verifiers" "$prime_rl/packages/prime-rl-configs" "$prime_rl"
else
  "${pip[@]}" -r "$here/requirements-git.txt"
fi
# The stand-ins script from this checkout, or (in the grpo image, which has no src/) from the
# installed project.
standins="$here/../../../../src/cortex_recipes/primerl/import_standins.py"
if [ ! -f "$standins" ]; then
  standins="$(python3 -c 'import importlib.util as u; print(u.find_spec("cortex_recipes.primerl.import_standins").origin)')"
fi
"$venv/bin/python" "$standins" orchestrator --help >/dev/null
# What was installed, by commit, for the journey's summary and evidence
# (cortex_recipes.primerl.launch.installed_commits).
source="install.sh from GitHub by commit"
if [ -n "$prime_rl" ]; then source="install.sh from local checkouts checked at these commits"; fi
printf '{"prime-rl": "%s", "verifiers": "%s", "source": "%s"}\n' "$(pin prime-rl)" "$(pin verifiers)" \
  "$source" > "$venv/cortex-recipes-primerl.json"
echo "prime-rl environment ready: export CORTEX_RECIPES_PRIMERL_PYTHON=$venv/bin/python"
