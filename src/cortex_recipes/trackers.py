"""Optional metric sinks besides ``metrics.jsonl``: TensorBoard event files and Weights & Biases.

Every journey's config has ``tensorboard_dir=`` and ``wandb_project=`` (:class:`cortex_recipes.
run.RunConfig`); :func:`open_trackers` turns them into a :class:`Trackers` that
:meth:`cortex_recipes.run.Run.record_metrics` feeds each record to after it is written to
``metrics.jsonl``, and :meth:`cortex_recipes.run.Run.summary` closes. Install them with the
``trackers`` extra (``tensorboardX``, ``wandb``).

- ``tensorboard_dir=DIR`` writes event files to ``DIR/<run folder name>/`` through
  tensorboardX (no TensorFlow, no grpc; ``tensorboard --logdir DIR`` reads them, and
  :func:`read_tensorboard_scalars` reads them back here).
- ``wandb_project=NAME`` logs to W&B project NAME, the run named after its folder. The mode
  comes from W&B's own ``WANDB_MODE`` (``offline`` writes ``<WANDB_DIR or run folder>/wandb/
  offline-run-*`` and needs no account or network; ``wandb sync`` uploads it later). W&B's
  console capture is off: it never wraps stdout or stderr.

Invariants this module keeps:

- ``metrics.jsonl`` stays the source of truth: a tracker is fed a record only after the
  record was checked and written, and only its numbers (lists, strings and nulls are left out).
- A tracker failure (the package not installed, W&B refusing to start, a write error) logs
  one warning naming the tracker and the error and turns that tracker off; it never raises
  into the run.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of a metrics record, ``step`` left out (it is the x axis)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }


class _Sink:
    name = "tracker"

    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardSink(_Sink):
    name = "tensorboard"

    def __init__(self, directory: Path):
        from tensorboardX import SummaryWriter

        self.directory = directory
        self.writer = SummaryWriter(logdir=str(directory), flush_secs=30)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink(_Sink):
    name = "wandb"

    def __init__(self, project: str, run_name: str, directory: Path, config: dict[str, Any]):
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=run_name,
            dir=str(directory),
            config=config,
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() can return before wandb's service process has written the run's
        # transaction log; teardown waits for it, so a closed run is on disk (an
        # offline run is complete for `wandb sync`, and readers see every record).
        wandb.teardown()


class Trackers:
    """The open sinks of one run; each failure turns its sink off with a warning."""

    def __init__(self, sinks: list[_Sink] | None = None):
        self.sinks = list(sinks or [])

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def _guarded(self, sink: _Sink, what: str, call) -> None:
        try:
            call()
        except Exception as exc:  # a tracker never stops a run
            log.warning("%s %s failed (%s: %s); %s is off for this run",
                        sink.name, what, type(exc).__name__, exc, sink.name)  # fmt: skip
            self.sinks.remove(sink)

    def log(self, record: Mapping[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int):
            return
        values = scalars(record)
        for sink in list(self.sinks):
            self._guarded(sink, "log", lambda s=sink: s.log(step, values))

    def close(self) -> None:
        for sink in list(self.sinks):
            self._guarded(sink, "close", sink.close)
        self.sinks = []


def _missing(exc: BaseException) -> bool:
    return isinstance(exc, ImportError)


def open_trackers(
    *,
    tensorboard_dir: str = "",
    wandb_project: str = "",
    run_dir: Path,
    config: dict[str, Any] | None = None,
) -> Trackers:
    """The sinks asked for; one that cannot start logs a warning and is left out."""
    sinks: list[_Sink] = []
    run_dir = Path(run_dir)
    if tensorboard_dir:
        try:
            sinks.append(TensorBoardSink(Path(tensorboard_dir) / run_dir.name))
        except Exception as exc:
            hint = "; install the trackers extra (tensorboardX)" if _missing(exc) else ""
            log.warning("tensorboard_dir=%r: TensorBoard is off for this run (%s: %s)%s",
                        tensorboard_dir, type(exc).__name__, exc, hint)  # fmt: skip
    if wandb_project:
        directory = Path(os.environ.get("WANDB_DIR") or run_dir)
        try:
            sinks.append(WandbSink(wandb_project, run_dir.name, directory, config or {}))
        except Exception as exc:
            hint = ("; install the trackers extra (wandb)" if _missing(exc)
                    else "; without an account or network set WANDB_MODE=offline")  # fmt: skip
            log.warning("wandb_project=%r: W&B is off for this run (%s: %s)%s",
                        wandb_project, type(exc).__name__, exc, hint)  # fmt: skip
    return Trackers(sinks)


# -- reading event files back (tests, and anyone without TensorBoard) -----------------------


def read_tensorboard_scalars(directory: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``directory``: tag -> [(step, value), ...].

    Reads the TFRecord framing (length, masked CRC-32C of the length, the ``Event`` proto,
    its masked CRC-32C) and checks both CRCs; a corrupt record raises ``ValueError``.
    """
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(directory).rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            header = data[offset : offset + 8]
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
            body = data[offset + 12 : offset + 12 + length]
            (body_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
            if masked_crc32c(header) != header_crc or masked_crc32c(body) != body_crc:
                raise ValueError(f"{path}: corrupt record at byte {offset}")
            offset += 16 + length
            event = Event()
            event.ParseFromString(body)
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


_WANDB_HEADER = 7  # ":W&B", a 2-byte magic, a version byte
_WANDB_BLOCK = 32768  # the LevelDB log layout W&B's transaction log uses
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_wandb_records(path: str | Path) -> list[Any]:
    """The protobuf ``Record`` s of a W&B transaction log (``run-<id>.wandb``), in order."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log (header {data[:4]!r})")
    records, pending, offset = [], b"", _WANDB_HEADER
    while offset + 7 <= len(data):
        left_in_block = _WANDB_BLOCK - offset % _WANDB_BLOCK
        if left_in_block < 7:  # a block's tail too short for a header is padding
            offset += left_in_block
            continue
        length, kind = struct.unpack("<HB", data[offset + 4 : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def read_wandb_history(path: str | Path) -> list[dict[str, Any]]:
    """The ``run.log`` rows of a W&B transaction log: one dict a row, ``_step`` included."""
    import json

    rows = []
    for record in read_wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or ".".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
