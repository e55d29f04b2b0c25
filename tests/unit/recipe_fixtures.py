"""A copy of the repository's journey contract files in a temporary root, for breaking on purpose."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Everything the validators read, and nothing of the journeys that have not landed.
# Add a journey's folder (and the docs its README links) here when it lands.
COPIED = (
    "journeys.toml",
    "recipes/__init__.py",
    "recipes/README.md",
    "recipes/recipe.schema.json",
    "recipes/sft",
    "recipes/distillation",
    "recipes/rl",
    "recipes/agentic",
    "model-catalog",
    "docs/model-compatibility.md",
    "docs/async-grpo.md",
    "docs/journeys.md",
    "docs/metrics.md",
    "docs/datasets.md",
    "docs/plots-and-trackers.md",
    "docs/local-backend.md",
)

SFT = "recipes/sft/conversational"
OPD = "recipes/distillation/on_policy"


def copy_repository(destination: Path) -> Path:
    for name in COPIED:
        source, target = ROOT / name, destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(source, target)
    return destination


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


DEMO = "recipes/demo"

_DEMO_README = """# Demo journey

## Outcome

Nothing trains; the journey exists to exercise the contract.

## Prerequisites

None.

## Hardware

CPU.

## Commands

```bash
python -m recipes.demo.train profile=recipes/demo/configs/cpu.json
```

## Expected metrics

`final_loss` at most 0.8.

## Configuration

`configs/cpu.json`.

## Troubleshooting

Nothing goes wrong.
"""

_DEMO_TRAIN = '''"""Demo entry point: importing it runs nothing."""

import json
import sys


def main(argv: list[str]) -> int:
    print(json.dumps({"argv": argv}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''

_DEMO_QUALIFY = '''"""Demo qualification: records evidence from a fake run (final_loss=<x> overrides it)."""

import json
import sys
from pathlib import Path

from cortex_recipes import provenance, qualify

RECIPE_DIR = Path(__file__).resolve().parent


def run(argv: list[str]) -> int:
    args = dict(arg.split("=", 1) for arg in argv)
    raw = json.loads(Path(args["profile"]).read_text())
    losses = [1.0, float(args.get("final_loss", "0.5"))]
    path = qualify.record_evidence(
        RECIPE_DIR,
        raw["name"],
        provenance.config_hash(raw),
        [{"losses": losses}],
        {"loss_fell": losses[-1] < losses[0]},
        metrics={"final_loss": losses[-1]},
    )
    print(json.dumps({"profile": raw["name"], "passed": path is not None}))
    return 0 if path is not None else 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
'''

_DEMO_RECIPE = {
    "id": "demo",
    "title": "Demo",
    "status": "alpha",
    "task": "none",
    "methods": ["sft"],
    "entry_point": "recipes.demo.train",
    "models": [{"name": "tiny-qwen3", "role": "policy"}],
    "datasets": [{"name": "counting", "generator": {"name": "counting", "seed": 0}}],
    "precision": "float32",
    "default_gpus": 0,
    "provenance": {
        "project": "thinking-machines-lab/tinker-cookbook",
        "recipe": "tinker_cookbook/recipes/chat_sl/train.py",
        "commit": "8781836e0834c27ec3b60db3a383c9385d955ee1",
    },
    "expected_metrics": {"final_loss": {"description": "at most 0.8", "max": 0.8}},
    "smoke_command": "python -m recipes.demo.train",
    "last_validated": None,
    "evidence": None,
    "profiles": [
        {
            "name": "cpu",
            "config": "configs/cpu.json",
            "hardware": "CPU",
            "purpose": "qualification",
            "last_validated": None,
            "evidence": None,
        }
    ],
}

_DEMO_CONFIG = {
    "name": "cpu",
    "sub_job_configs": [
        {
            "job_type": "training",
            "model_name": "tiny-qwen3",
            "training_config": {
                "optimizer": {"name": "AdamW", "lr": 0.001},
                "max_seq_len": 128,
                "train_batch_size": 4,
                "n_gpus": 1,
            },
        }
    ],
}

_DEMO_JOURNEYS = """[[journey]]
name = "demo"
folder = "recipes/demo"
extra = "sft"
entry_point = "recipes.demo.train"
smoke = "python -m recipes.demo.train"
qualify = "recipes.demo.qualify"
profile_loader = ""
status = "landed"
"""


def write_demo_repository(root: Path) -> Path:
    """A repository root holding one small landed journey, ``demo``, that passes the validator.

    Its qualify module records evidence without training, so ``cortex-recipes qualify demo cpu``
    runs in well under a second.
    """
    import json

    import yaml

    from cortex_recipes import journeys

    folder = root / DEMO
    (folder / "configs").mkdir(parents=True)
    (root / "journeys.toml").write_text(_DEMO_JOURNEYS)
    shutil.copyfile(
        ROOT / "recipes" / "recipe.schema.json", root / "recipes" / "recipe.schema.json"
    )
    (root / "recipes" / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("")
    (folder / "README.md").write_text(_DEMO_README)
    (folder / "train.py").write_text(_DEMO_TRAIN)
    (folder / "qualify.py").write_text(_DEMO_QUALIFY)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(_DEMO_RECIPE, sort_keys=False))
    (folder / "configs" / "cpu.json").write_text(json.dumps(_DEMO_CONFIG, indent=2) + "\n")
    (root / journeys.INDEX_FILE).write_text(
        f"# Journeys\n\n{journeys.INDEX_BEGIN}\n{journeys.INDEX_END}\n"
    )
    journeys.write_index(root)
    return root
