"""Running a journey's profile in hosted-conformance mode (``connection=local-hosted``) and
reading what the run left: shared by the hosted-profile and hosted-conformance tests."""

from __future__ import annotations

import importlib
import json
from pathlib import Path


def run_hosted(journey: str, profile: str, run: Path, **config):
    """``recipes/<journey>/train.py``'s ``main`` on its ``configs/<profile>`` with
    ``connection=local-hosted``, logging to ``run``: its summary."""
    train = importlib.import_module(f"recipes.{journey.replace('/', '.')}.train")
    return train.main(
        train.Config(
            profile=f"recipes/{journey}/configs/{profile}",
            connection="local-hosted",
            log_path=str(run),
            **config,
        )
    )


def metrics(run: Path) -> list[dict]:
    """The records of ``run``'s metrics.jsonl."""
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]


def hosted_mode_ran(run: Path) -> bool:
    """Whether the run's backend logged that it ran in hosted-conformance mode."""
    return "hosted-conformance mode" in (run / "backend" / "server.log").read_text()
