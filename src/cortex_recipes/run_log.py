"""A run directory: config.json, metrics.jsonl (one object a step), checkpoints.jsonl, summary.json."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class RunLog:
    def __init__(self, path: Path, **config: Any):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "checkpoints.jsonl"):
            (self.path / name).unlink(missing_ok=True)
        self._write_json("config.json", config)

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
