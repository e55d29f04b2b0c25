"""Static pin check: everything that builds an environment names exact versions.

    python ci/pins.py [--root .]

This checks:
- Dockerfiles: every ``FROM`` is pinned by ``@sha256:<64 hex>``, with ``ARG`` defaults
  substituted. No ``:latest``. Every ``pip install`` names ``pkg==version``.
- pyproject.toml: every dependency is ``name==version``. Git or URL requirements must name
  a 40-hex commit or a ``#sha256=`` hash.
- GitHub workflows: every ``uses:`` names a 40-hex commit, and ``docker://`` images a digest.
- The flake: every input in flake.nix is locked in flake.lock with a 40-hex ``rev`` and a
  ``narHash``, the lock's ``original`` matches the URL in flake.nix, and the lock has no
  input that flake.nix does not declare.

It prints one ``path: problem`` line per problem and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

HEX40 = re.compile(r"^[0-9a-f]{40}$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
REQUIREMENT = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(?P<spec>[^;]*)(;.*)?$"
)


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


# -- Dockerfiles ---------------------------------------------------------------------------


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


# A journey image this repository builds itself (ci/images.py tags it ``cortex/<journey>:pinned``)
# may be the base of another Dockerfile here (docker/primerl.Dockerfile); it has no registry
# digest, and its own inputs are pinned by the checks above.
LOCAL_JOURNEY_IMAGE = re.compile(r"(localhost/)?cortex/[a-z_]+:pinned")


def check_dockerfile(path: Path, root: Path) -> list[str]:
    where = _rel(path, root)
    problems = []
    args: dict[str, str] = {}
    stages: set[str] = set()
    for line in _logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG":
            name, _, default = rest.strip().partition("=")
            if default:
                args.setdefault(name.strip(), default.strip().strip('"'))
        elif keyword == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]
            image = re.sub(
                r"\$\{(\w+)\}|\$(\w+)",
                lambda m: args.get(m.group(1) or m.group(2), m.group(0)),
                parts[0],
            )
            if len(parts) >= 3 and parts[1].lower() == "as":
                stages.add(parts[2])
            if image in stages or image == "scratch":
                continue
            if LOCAL_JOURNEY_IMAGE.fullmatch(image):
                continue  # this project's own journey image, built from pinned inputs (ci/images.py)
            if "$" in image:
                problems.append(f"{where}: FROM {parts[0]} has no pinned default for {image}")
            elif not DIGEST.search(image):
                problems.append(f"{where}: FROM {image} is not pinned by @sha256 digest")
        if re.search(r":latest\b", line):
            problems.append(f"{where}: mutable tag ':latest' in {line[:80]!r}")
        for match in re.finditer(r"pip3?\s+install\s+([^&;|]+)", line):
            for token in match.group(1).split():
                token = token.strip("'\"")
                if token.startswith("-") or not token or token.startswith("/"):
                    continue
                if "==" not in token:
                    problems.append(
                        f"{where}: 'pip install {token}' is not pinned; use {token}==<version>"
                    )
    return problems


# -- pyproject.toml ------------------------------------------------------------------------


def check_requirement(requirement: str) -> str | None:
    """Why ``requirement`` is not an exact pin, or None if it is one."""
    text = requirement.strip()
    if " @ " in text:
        url = text.split(" @ ", 1)[1].split(";")[0].strip()
        if url.startswith("git+"):
            ref = url.rsplit("@", 1)[-1] if "@" in url.split("://", 1)[-1] else ""
            return None if HEX40.match(ref) else f"{text!r} names no 40-hex commit"
        return None if "#sha256=" in url else f"{text!r} is a URL without a #sha256= hash"
    match = REQUIREMENT.match(text)
    spec = (match.group("spec") if match else "").strip()
    if not re.fullmatch(r"==\s*[A-Za-z0-9.+!_-]+", spec):
        return f"{text!r} is not pinned with =="
    return None


def check_pyproject(path: Path, root: Path) -> list[str]:
    where = _rel(path, root)
    data = tomllib.loads(path.read_text())
    project = data.get("project", {})
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    own = re.compile(rf"^{re.escape(project.get('name', ''))}(\[[^\]]*\])?$")
    requirements = [r for r in requirements if not own.match(r.strip())]  # own extras
    problems = [
        f"{where}: {why}" for why in map(check_requirement, requirements) if why is not None
    ]
    sources = data.get("tool", {}).get("uv", {}).get("sources", {})
    for name, source in sources.items():
        if isinstance(source, dict) and "git" in source and not HEX40.match(source.get("rev", "")):
            problems.append(
                f"{where}: [tool.uv.sources] {name} is a git source without a 40-hex rev"
            )
    return problems


# -- workflows -----------------------------------------------------------------------------


def check_workflow(path: Path, root: Path) -> list[str]:
    where = _rel(path, root)
    problems = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = re.search(r"\buses:\s*['\"]?([^\s'\"#]+)", line)
        if not match:
            continue
        target = match.group(1)
        if target.startswith("./"):
            continue
        if target.startswith("docker://"):
            if not DIGEST.search(target):
                problems.append(f"{where}:{number}: {target} is not pinned by digest")
            continue
        ref = target.rsplit("@", 1)[1] if "@" in target else ""
        if not HEX40.match(ref):
            problems.append(f"{where}:{number}: {target} is not pinned to a 40-hex commit")
    return problems


# -- flake ---------------------------------------------------------------------------------


def flake_inputs(text: str) -> dict[str, str]:
    """``{input name: url}`` from a flake.nix ``inputs`` block (both attribute styles)."""
    inputs = {}
    for match in re.finditer(r"(?m)^\s*([A-Za-z][\w-]*)\.url\s*=\s*\"([^\"]+)\"", text):
        inputs[match.group(1)] = match.group(2)
    for match in re.finditer(r"(?m)^\s*([A-Za-z][\w-]*)\s*=\s*\{\s*url\s*=\s*\"([^\"]+)\"", text):
        inputs[match.group(1)] = match.group(2)
    return inputs


def _original_url(original: dict) -> str:
    if original.get("type") == "github":
        url = f"github:{original.get('owner')}/{original.get('repo')}"
        return url + (f"/{original['ref']}" if original.get("ref") else "")
    return original.get("url", "")


def check_flake(flake_nix: Path, flake_lock: Path, root: Path) -> list[str]:
    nix_where, lock_where = _rel(flake_nix, root), _rel(flake_lock, root)
    inputs = flake_inputs(flake_nix.read_text())
    if not flake_lock.exists():
        return [f"{lock_where}: missing; every input of {nix_where} must be locked"]
    lock = json.loads(flake_lock.read_text())
    nodes = lock.get("nodes", {})
    root_inputs = nodes.get(lock.get("root", "root"), {}).get("inputs", {})
    problems = []
    for name, url in sorted(inputs.items()):
        node_name = root_inputs.get(name)
        if not isinstance(node_name, str) or node_name not in nodes:
            problems.append(f"{lock_where}: input {name!r} ({url}) is not locked")
            continue
        locked = nodes[node_name].get("locked", {})
        if not HEX40.match(str(locked.get("rev", ""))):
            problems.append(f"{lock_where}: input {name!r} has no 40-hex locked rev")
        if not str(locked.get("narHash", "")).startswith("sha256-"):
            problems.append(f"{lock_where}: input {name!r} has no narHash")
        original = _original_url(nodes[node_name].get("original", {}))
        if original != url:
            problems.append(
                f"{lock_where}: input {name!r} is locked from {original!r} but {nix_where} says {url!r}"
            )
    for name in sorted(set(root_inputs) - set(inputs)):
        problems.append(f"{lock_where}: locks input {name!r} that {nix_where} does not declare")
    return problems


# -- everything ----------------------------------------------------------------------------


def check_repository(root: Path) -> list[str]:
    problems = []
    dockerfiles = {*root.glob("docker/**/Dockerfile*"), *root.glob("docker/**/*.Dockerfile")}
    for dockerfile in sorted(dockerfiles) + sorted(root.glob("Dockerfile*")):
        problems += check_dockerfile(dockerfile, root)
    if (root / "pyproject.toml").exists():
        problems += check_pyproject(root / "pyproject.toml", root)
    for workflow in sorted((root / ".github" / "workflows").glob("*.y*ml")):
        problems += check_workflow(workflow, root)
    if (root / "flake.nix").exists():
        problems += check_flake(root / "flake.nix", root / "flake.lock", root)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    problems = check_repository(args.root.resolve())
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
