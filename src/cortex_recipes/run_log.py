"""A run directory: config.json, metrics.jsonl (one object a step), checkpoints.jsonl, summary.json."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class RunLog:
    """A new run starts empty; a resumed run (``keep_through_step``) keeps the records of the
    steps up to its checkpoint and drops later ones, so every step appears exactly once."""

    def __init__(self, path: Path, *, keep_through_step: int | None = None, **config: Any):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "checkpoints.jsonl"):
            if keep_through_step is None:
                (self.path / name).unlink(missing_ok=True)
            else:
                self._truncate(name, keep_through_step)
        self._write_json("config.json", config)

    def _truncate(self, name: str, step: int) -> None:
        path = self.path / name
        if not path.exists():
            return
        kept = [
            line
            for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        tmp = self.path / f".{name}.tmp"
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)

    def read_metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _write_json(self, name: str, data: Any) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path / name)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with open(self.path / name, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def metrics(self, **record: Any) -> None:
        self._append("metrics.jsonl", record)

    def checkpoint(self, **record: Any) -> None:
        self._append("checkpoints.jsonl", {**record, "time": time.time()})

    def summary(self, data: dict[str, Any]) -> None:
        self._write_json("summary.json", data)
