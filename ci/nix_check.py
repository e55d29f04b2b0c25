"""Offline checks of the Nix flake (nixpkgs cannot be fetched on this network).

    python ci/nix_check.py

1. syntax: ``nix-instantiate --parse flake.nix``;
2. pins: every input locked with a rev and a narHash, and the lock consistent with flake.nix
   (``ci/pins.py``'s flake check);
3. structure: the flake is evaluated with every input replaced by the stubs in
   ``ci/nix-stub/`` (the stubs apply the flake's overlays for real, over one stub package per
   package in uv.lock). Then the check confirms:
   - one dev shell per landed journey in journeys.toml, plus ``default``;
   - each journey shell's Python environment asks for exactly ``local``, the journey's extra,
     the extras that extra names through ``cortex-recipes[...]`` self-references in
     pyproject.toml, and ``tools``; never ``dev`` and never another journey's extra, and no
     package another journey's extra names is reachable from it in uv.lock;
   - ``default`` asks for every landed journey's extras plus ``tools``;
   - every sdist-only package in uv.lock (no wheel) that a shell can reach gets a build system
     through ``resolveBuildSystem``; torch ignores only the driver library (libcuda.so.1) and
     is given the library folder of every nvidia-* wheel it reaches in uv.lock;
   - the project is editable from ``$REPO_ROOT``, which the shell hook sets;
4. docs: docs/reproducibility.md shows ``nix develop .#<journey>`` and the journey's smoke
   command for every landed journey.

What this cannot check here: fetching the pinned nixpkgs, building the environments (the
wheels' autoPatchelf, the sdist builds), or entering a shell (``nix develop .#opd``,
``nix flake check``). docs/reproducibility.md says how to run those on a networked machine.
"""

from __future__ import annotations

import json
import re
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
TOOLS_EXTRA = "tools"
PROJECT = "cortex-recipes"
# What each shell returns from the stub evaluation: the env's requested extras (the other
# packages are plain names), the shell's env and hook, and the overridden packages.
SHELL_SUMMARY = (
    "builtins.mapAttrs (name: shell: {"
    " packages = map (p: if p ? deps then p.deps else p) shell.packages;"
    ' env = shell.env or { }; shellHook = shell.shellHook or "";'
    " overridden = builtins.foldl' (acc: p: acc // (p.overridden or { })) { }"
    " (builtins.filter builtins.isAttrs shell.packages); })"
)
SELF_REFERENCE = re.compile(rf"^{re.escape(PROJECT)}\[([^\]]*)\]")
REQUIREMENT_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


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


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def landed_journeys(root: Path) -> list[dict]:
    journeys = tomllib.loads((root / "journeys.toml").read_text())["journey"]
    return [j for j in journeys if j.get("status") == "landed"]


def _optional_dependencies(root: Path) -> dict[str, list[str]]:
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    return pyproject["project"].get("optional-dependencies", {})


def self_extras(optional: dict[str, list[str]], extra: str) -> list[str]:
    """The extras ``extra`` names through ``cortex-recipes[a,b]`` requirements."""
    found = []
    for requirement in optional.get(extra, []):
        match = SELF_REFERENCE.match(requirement.strip())
        if match:
            found += [part.strip() for part in match.group(1).split(",") if part.strip()]
    return found


def close_extras(optional: dict[str, list[str]], extras: list[str]) -> set[str]:
    closed, todo = set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra not in closed:
            closed.add(extra)
            todo += self_extras(optional, extra)
    return closed


def expected_extras(root: Path, journey_extras: list[str]) -> set[str]:
    """What a shell for these journey extras asks for: ``local``, their self-reference
    closure and ``tools``."""
    return close_extras(_optional_dependencies(root), ["local", *journey_extras, TOOLS_EXTRA])


def _dropped_packages(root: Path) -> set[str]:
    """Names [tool.uv] override-dependencies removes from the resolution (``; sys_platform ==
    'never'``): locked, but never installed or built."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    dropped = set()
    for override in pyproject.get("tool", {}).get("uv", {}).get("override-dependencies", []):
        requirement, _, marker = override.partition(";")
        if "never" in marker:
            dropped.add(_normalize(REQUIREMENT_NAME.match(requirement.strip()).group(1)))
    return dropped


def lock_packages(root: Path) -> dict[str, list[dict]]:
    lock = tomllib.loads((root / "uv.lock").read_text())
    packages: dict[str, list[dict]] = {}
    for package in lock["package"]:
        packages.setdefault(package["name"], []).append(package)
    return packages


def reachable(root: Path, extras: set[str], packages: dict | None = None) -> set[str]:
    """Every locked package a shell asking for ``extras`` can install (markers are ignored,
    so this over-approximates; packages dropped by override-dependencies are left out)."""
    packages = packages or lock_packages(root)
    dropped = _dropped_packages(root)
    project = packages[PROJECT][0]
    todo = list(project.get("dependencies", []))
    for extra in extras:
        todo += project.get("optional-dependencies", {}).get(extra, [])
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        dependency = todo.pop()
        name = dependency["name"]
        key = (name, tuple(dependency.get("extra", [])))
        if name in dropped or key in seen:
            continue
        seen.add(key)
        for package in packages.get(name, []):
            todo += package.get("dependencies", [])
            for extra in dependency.get("extra", []):
                todo += package.get("optional-dependencies", {}).get(extra, [])
    return {name for name, _ in seen}


def _journey_only_packages(root: Path, extra: str) -> set[str]:
    """The packages ``extra`` names itself (not through a self-reference)."""
    names = set()
    for requirement in _optional_dependencies(root).get(extra, []):
        if not SELF_REFERENCE.match(requirement.strip()):
            names.add(_normalize(REQUIREMENT_NAME.match(requirement.strip()).group(1)))
    return names


def _env_extras(shell: dict) -> list[list[str]]:
    return [p.get(PROJECT, []) for p in shell.get("packages", []) if isinstance(p, dict)]


def structure_problems(root: Path, shells: dict) -> list[str]:
    journeys = landed_journeys(root)
    problems = []
    expected = {j["name"] for j in journeys} | {"default"}
    if set(shells) != expected:
        problems.append(
            f"flake.nix: dev shells {sorted(shells)} != landed journeys + default {sorted(expected)}"
        )
    journey_extras = {j["extra"] for j in journeys}
    packages = lock_packages(root)
    for journey in journeys:
        name = journey["name"]
        envs = _env_extras(shells.get(name, {}))
        wanted = expected_extras(root, [journey["extra"]])
        if len(envs) != 1 or set(envs[0]) != wanted:
            problems.append(
                f"flake.nix: shell {name!r} asks for cortex-recipes extras {envs}, expected exactly {sorted(wanted)} (local + the journey's extra + its self-references + {TOOLS_EXTRA})"
            )
            continue
        if "dev" in envs[0]:
            problems.append(f"flake.nix: shell {name!r} asks for 'dev' (every journey)")
        carried = reachable(root, set(envs[0]), packages)
        for other in sorted(journey_extras - wanted):
            leaked = sorted(_journey_only_packages(root, other) & carried)
            if leaked:
                problems.append(
                    f"flake.nix: shell {name!r} would carry {leaked}, which the {other!r} extra adds (uv.lock)"
                )
    default = _env_extras(shells.get("default", {}))
    all_extras = expected_extras(root, sorted(journey_extras))
    if len(default) != 1 or set(default[0]) != all_extras:
        problems.append(
            f"flake.nix: shell 'default' asks for {default}, expected exactly {sorted(all_extras)}"
        )
    return problems


def override_problems(root: Path, shells: dict) -> list[str]:
    """The uv2nix overrides: build systems for sdist-only packages, CUDA wheel libraries,
    the editable project."""
    problems = []
    packages = lock_packages(root)
    wanted: set[str] = set()
    for shell in shells.values():
        for extras in _env_extras(shell):
            wanted |= reachable(root, set(extras), packages)
    overridden: dict = {}
    for shell in shells.values():
        overridden.update(shell.get("overridden", {}))
    for name in sorted(wanted):
        versions = packages.get(name, [])
        sdist_only = any("sdist" in v and not v.get("wheels") for v in versions)
        if name == PROJECT or not sdist_only:
            continue
        systems = [
            i
            for i in overridden.get(name, {}).get("nativeBuildInputs", [])
            if str(i).startswith("build-system:")
        ]
        if not systems:
            problems.append(
                f"flake.nix: {name!r} is locked as an sdist only (no wheel) and has no build system override (resolveBuildSystem, e.g. {{ setuptools = [ ]; }})"
            )
    if "torch" in wanted:
        torch = overridden.get("torch")
        if torch is None:
            problems.append("flake.nix: no override for the torch wheel (CUDA libraries)")
        else:
            ignored = torch.get("autoPatchelfIgnoreMissingDeps", [])
            if ignored != ["libcuda.so.1"]:
                problems.append(
                    f"flake.nix: torch ignores missing {ignored}, expected only the driver library ['libcuda.so.1']"
                )
            nvidia = sorted(n for n in reachable_from(packages, "torch") if n.startswith("nvidia-"))
            for name in nvidia:
                if f"stub-{name}-" not in torch.get("preFixup", ""):
                    problems.append(
                        f"flake.nix: torch is not given the libraries of {name!r} (addAutoPatchelfSearchPath in preFixup)"
                    )
    project = overridden.get(PROJECT, {})
    if project.get("editableRoot") != "$REPO_ROOT":
        problems.append(
            f"flake.nix: cortex-recipes is not editable from $REPO_ROOT (editableRoot={project.get('editableRoot')!r})"
        )
    elif "build-system:editables" not in project.get("nativeBuildInputs", []):
        problems.append(
            "flake.nix: the editable cortex-recipes build lacks the 'editables' build system"
        )
    for name, shell in shells.items():
        hook = shell.get("shellHook", "")
        if "export REPO_ROOT=" not in hook:
            problems.append(f"flake.nix: shell {name!r} does not set REPO_ROOT in its shellHook")
    return problems


def reachable_from(packages: dict, start: str) -> set[str]:
    seen, todo = set(), [{"name": start}]
    while todo:
        dependency = todo.pop()
        key = (dependency["name"], tuple(dependency.get("extra", [])))
        if key in seen:
            continue
        seen.add(key)
        for package in packages.get(dependency["name"], []):
            todo += package.get("dependencies", [])
            for extra in dependency.get("extra", []):
                todo += package.get("optional-dependencies", {}).get(extra, [])
    return {name for name, _ in seen} - {start}


def docs_problems(root: Path) -> list[str]:
    doc = root / "docs" / "reproducibility.md"
    text = doc.read_text() if doc.exists() else ""
    problems = []
    for journey in landed_journeys(root):
        for needed in (f"nix develop .#{journey['name']}", journey["smoke"]):
            if needed not in text:
                problems.append(f"docs/reproducibility.md: does not show {needed!r}")
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
            problems += override_problems(ROOT, shells)
            print(json.dumps({name: _env_extras(shell) for name, shell in sorted(shells.items())}))
    problems += docs_problems(ROOT)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
