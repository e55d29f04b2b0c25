"""PNG plots of runs' ``metrics.jsonl``: loss, reward, teacher KL, policy lag, eval curves.

:func:`plot_runs` reads each run folder's ``metrics.jsonl`` (the keys of
``metrics_schema.json``, docs/metrics.md) and writes one PNG per plot of :data:`PLOTS` that
at least one run has a key for, every run overlaid with a legend naming it (the run folder's
name; ``<journey>/<run>`` when two runs share a name). A plot none of the runs has data for
is skipped, not drawn empty. ``cortex-recipes plot`` is the command line.

Invariants this module keeps:

- Only ``metrics.jsonl`` is read; a folder without one raises :class:`PlotError` naming the
  folder, and nothing is written.
- Values that are not numbers (``null`` losses, lists, digests) are left out of a curve, so a
  curve is the steps that reported the key.
- Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no global
  backend switch, no display); the PNG metadata carries no timestamp, so the same metrics
  give the same file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class PlotError(ValueError):
    """A run folder that cannot be plotted; the message names the folder and what is missing."""


@dataclass(frozen=True)
class Plot:
    """One PNG: its file stem, title, and the metric keys drawn on it (each a curve per run)."""

    name: str
    title: str
    keys: tuple[str, ...]


#: The plots :func:`plot_runs` writes, in order, when any run has one of their keys.
PLOTS: tuple[Plot, ...] = (
    Plot("loss", "Training loss", ("loss",)),
    Plot("reward", "Mean reward", ("reward/mean",)),
    Plot("teacher_kl", "Reverse KL to the teacher", ("teacher_reverse_kl",)),
    Plot("mismatch_kl", "Sampler-trainer mismatch KL", ("mismatch_kl/mean",)),
    Plot("policy_lag", "Policy lag (off-policy steps)", ("off_policy/mean", "off_policy/max")),
    Plot("eval", "Evaluation", ("eval/accuracy", "eval/teacher_reverse_kl")),
)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl``; :class:`PlotError` when it is missing or bad."""
    path = Path(run_dir) / METRICS_FILE
    if not Path(run_dir).is_dir():
        raise PlotError(
            f"run dir {str(run_dir)!r} is not a folder; give a run folder (runs/<journey>/<run>)"
        )
    if not path.is_file():
        raise PlotError(
            f"run dir {str(run_dir)!r} has no {METRICS_FILE}; give a run folder that a journey "
            "wrote (runs/<journey>/<run>)"
        )
    records = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PlotError(f"{path}:{n} is not a JSON line: {exc}") from exc
        if not isinstance(record, dict):
            raise PlotError(f"{path}:{n} is {type(record).__name__}, not a JSON object")
        records.append(record)
    return records


def curve(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key``: the records with an integer ``step`` and a number there."""
    steps, values = [], []
    for record in records:
        step, value = record.get("step"), record.get(key)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if isinstance(step, int) and numeric:
            steps.append(step)
            values.append(float(value))
    return steps, values


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """A legend name per run: the folder name, or ``parent/name`` where names repeat."""
    names = [Path(d).resolve().name for d in run_dirs]
    labels = []
    for d, name in zip(run_dirs, names, strict=True):
        resolved = Path(d).resolve()
        labels.append(f"{resolved.parent.name}/{name}" if names.count(name) > 1 else name)
    return labels


def _unit(key: str) -> str:
    from cortex_recipes.metrics import all_keys

    return all_keys().get(key, {}).get("unit", "")


def plot_runs(run_dirs: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """Write ``<out_dir>/<plot>.png`` for every plot of :data:`PLOTS` some run has data for.

    Every run of ``run_dirs`` is read first (a bad one raises :class:`PlotError` before any
    file is written). Returns the PNG paths written, in :data:`PLOTS` order; empty when no
    run has any plotted key.
    """
    if not run_dirs:
        raise PlotError("no run dirs given; give at least one run folder (runs/<journey>/<run>)")
    runs = [(Path(d), read_metrics(Path(d))) for d in run_dirs]
    labels = run_labels([d for d, _ in runs])
    out = Path(out_dir)
    written = []
    for plot in PLOTS:
        curves = [
            (label, key, *curve(records, key))
            for label, (_, records) in zip(labels, runs, strict=True)
            for key in plot.keys
        ]
        curves = [c for c in curves if c[2]]
        if not curves:
            log.debug("plot %s: no run has %s; skipped", plot.name, ", ".join(plot.keys))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{plot.name}.png"
        _draw(plot, curves, path, several_keys=len({c[1] for c in curves}) > 1)
        written.append(path)
    if not written:
        log.warning(
            "none of %s reports a plotted key (%s)",
            ", ".join(str(d) for d, _ in runs),
            ", ".join(k for p in PLOTS for k in p.keys),
        )
    return written


def _draw(plot: Plot, curves: list, path: Path, *, several_keys: bool) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7.5, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    styles = {key: ("-", "--", ":", "-.")[i % 4] for i, key in enumerate(plot.keys)}
    for label, key, steps, values in curves:
        name = f"{label}: {key}" if several_keys else label
        axes.plot(steps, values, styles[key], marker="o" if len(steps) <= 30 else None,
                  markersize=3, label=name)  # fmt: skip
    units = sorted({_unit(key) for _, key, _, _ in curves} - {""})
    keys = [key for key in plot.keys if any(c[1] == key for c in curves)]
    axes.set_title(plot.title)
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    steps = [step for _, _, xs, _ in curves for step in xs]
    if min(steps) == max(steps):  # one step: a range around it, so the ticks are integers
        axes.set_xlim(min(steps) - 1, max(steps) + 1)
    axes.set_ylabel(", ".join(keys) + (f" ({', '.join(units)})" if units else ""))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path, format="png", metadata={"Software": None})
    log.info("wrote %s", path)
