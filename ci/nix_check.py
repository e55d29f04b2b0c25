"""Offline checks of the Nix flake (nixpkgs cannot be fetched on this network).

    python ci/nix_check.py

1. syntax: ``nix-instantiate --parse flake.nix``;
2. pins: every input locked with a rev and a narHash, and the lock consistent with flake.nix
   (``ci/pins.py``'s flake check);
3. structure: the flake is evaluated with every input replaced by the stubs in
   ``ci/nix-stub/``. Then the check confirms that there is one dev shell per journey in
   journeys.toml plus ``default``, that each shell's Python environment asks for
   ``local + <the journey's extra> + dev`` from uv.lock, and that ``default`` asks for all
   extras.

What this cannot check here: fetching the pinned nixpkgs, building the environments, or
entering a shell (``nix develop .#opd``). docs/reproducibility.md says how to run those on a
networked machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.pins import check_flake  # noqa: E402

NIX = ["nix", "--extra-experimental-features", "nix-command flakes"]
STUBS = ("nixpkgs", "pyproject-nix", "uv2nix", "pyproject-build-systems")
SHELL_SUMMARY = (
    "builtins.mapAttrs (name: shell: "
    "map (p: if builtins.isAttrs p then p.deps else p) shell.packages)"
)


def evaluate_shells(root: Path, system: str = "x86_64-linux") -> dict:
    overrides = []
    for name in STUBS:
        overrides += ["--override-input", name, f"path:{root}/ci/nix-stub/{name}"]
    out = subprocess.run(
        [*NIX, "eval", "--json", "--no-write-lock-file", *overrides,
         f"{root}#devShells.{system}", "--apply", SHELL_SUMMARY],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def structure_problems(root: Path, shells: dict) -> list[str]:
    journeys = tomllib.loads((root / "journeys.toml").read_text())["journey"]
    problems = []
    expected = {j["name"] for j in journeys} | {"default"}
    if set(shells) != expected:
        problems.append(
            f"flake.nix: dev shells {sorted(shells)} != journeys + default {sorted(expected)}"
        )
    for journey in journeys:
        packages = shells.get(journey["name"], [])
        envs = [p for p in packages if isinstance(p, dict)]
        wanted = {"local", journey["extra"], "dev"}
        if len(envs) != 1 or set(envs[0].get("cortex-recipes", [])) != wanted:
            problems.append(
                f"flake.nix: shell {journey['name']!r} asks for {envs}, expected cortex-recipes extras {sorted(wanted)}"
            )
    default = [p for p in shells.get("default", []) if isinstance(p, dict)]
    all_extras = {"local", "dev"} | {j["extra"] for j in journeys}
    if len(default) != 1 or set(default[0].get("cortex-recipes", [])) != all_extras:
        problems.append(
            f"flake.nix: shell 'default' asks for {default}, expected {sorted(all_extras)}"
        )
    return problems


def main() -> int:
    if shutil.which("nix") is None or shutil.which("nix-instantiate") is None:
        print("nix is not installed (apt-get install nix-bin)", file=sys.stderr)
        return 2
    problems = []
    parse = subprocess.run(
        ["nix-instantiate", "--parse", str(ROOT / "flake.nix")], capture_output=True, text=True
    )
    if parse.returncode != 0:
        problems.append(f"flake.nix: does not parse: {parse.stderr.strip()}")
    problems += check_flake(ROOT / "flake.nix", ROOT / "flake.lock", ROOT)
    if not problems:
        try:
            shells = evaluate_shells(ROOT)
        except subprocess.CalledProcessError as exc:
            problems.append(
                f"flake.nix: evaluation against ci/nix-stub failed: {exc.stderr.strip()}"
            )
        else:
            problems += structure_problems(ROOT, shells)
            print(json.dumps({"dev_shells": sorted(shells)}))
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
