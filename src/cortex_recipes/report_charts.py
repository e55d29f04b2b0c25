"""Inline SVG charts of a record's runs for the HTML release report
(:mod:`cortex_recipes.report_html`): the per-step series the runs hold (:func:`curves`), the
async GRPO lag histograms (:func:`lag_histograms`), and a small line and bar chart drawn from
them without a plotting library (:func:`line_chart`, :func:`bar_chart`). Every text is escaped;
coordinates are rounded so the same record gives the same bytes."""

from __future__ import annotations

import math
from html import escape
from typing import Any

# Per-step series that are indices, not curves.
INDEX_KEYS = frozenset(
    {"steps", "steps_logged", "eval_steps", "applied_versions", "published_versions"}
)
# Curves drawn first, in this order, with these titles; any other per-step series follows by name.
CURVE_TITLES = {
    "losses": "loss",
    "rewards": "reward",
    "eval_accuracy": "eval accuracy",
    "clip_ratio": "clip ratio",
    "teacher_reverse_kl": "teacher reverse KL",
    "eval_teacher_reverse_kl": "eval teacher reverse KL",
    "off_policy_max_per_step": "max policy lag per step",
    "multi_call": "multi-call share",
    "time_per_step_s": "time per step (s)",
}
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

# --- small formatting helpers -------------------------------------------------------------


def text(value: Any) -> str:
    """``value`` as HTML text (``html.escape``, quotes too: safe in an attribute)."""
    return escape(str(value), quote=True)


def number(value: Any) -> str:
    """A metric value for the page: 4 significant digits, ``yes``/``no``, ``—`` for None."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _coordinate(value: float) -> str:
    return f"{value:.1f}"


def finite(value: Any) -> bool:
    """A real number (not a bool), neither NaN nor infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# --- inline SVG charts --------------------------------------------------------------------

Series = tuple[str, list[tuple[float, float]]]  # (legend label, [(x, y), ...])


def _span(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if low == high:
        pad = abs(low) * 0.05 or 1.0
        return low - pad, high + pad
    return low, high


def line_chart(title: str, series: list[Series], *, width: int = 380, height: int = 230) -> str:
    """An SVG line chart: axes, the x and y ranges as labels, one polyline per series (points
    marked where there are few) and a legend; empty when no series has a finite point."""
    series = [(label, [(x, y) for x, y in pts if finite(x) and finite(y)]) for label, pts in series]
    series = [(label, pts) for label, pts in series if pts]
    if not series:
        return ""
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    (x0, x1), (y0, y1) = _span(xs), _span(ys)
    legend_rows = math.ceil(len(series) / 3)
    left, right, top, bottom = 58, 14, 26, 34 + 16 * legend_rows
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> str:
        return _coordinate(left + (x - x0) / (x1 - x0) * plot_w)

    def py(y: float) -> str:
        return _coordinate(top + plot_h - (y - y0) / (y1 - y0) * plot_h)

    name = text(title)
    parts = [
        f'<svg class="chart line-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{name}">',
        f"<title>{name}</title>",
        f'<text x="{width / 2:.1f}" y="16" text-anchor="middle" font-size="13" '
        f'font-weight="600">{name}</text>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#444"/>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#444"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" font-size="10">'
        f"{text(number(y1))}</text>",
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" font-size="10">'
        f"{text(number(y0))}</text>",
        f'<text x="{left}" y="{top + plot_h + 13}" text-anchor="start" font-size="10">'
        f"{text(number(x0))}</text>",
        f'<text x="{left + plot_w}" y="{top + plot_h + 13}" text-anchor="end" font-size="10">'
        f"{text(number(x1))}</text>",
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 13}" text-anchor="middle" '
        'font-size="10" fill="#555">step</text>',
    ]
    for i, (label, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        # every other run dashed, so a run drawn over an identical one still shows
        dash = ' stroke-dasharray="6 3"' if i % 2 else ""
        coords = " ".join(f"{px(x)},{py(y)}" for x, y in pts)
        if len(pts) > 1:
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} '
                f'points="{coords}">'
                f"<title>{text(label)}</title></polyline>"
            )
        if len(pts) <= 12:
            parts += [f'<circle cx="{px(x)}" cy="{py(y)}" r="2.5" fill="{color}"/>' for x, y in pts]
        row, column = divmod(i, 3)
        lx, ly = left + column * (plot_w / 3), top + plot_h + 30 + 16 * row
        parts.append(
            f'<line x1="{lx:.1f}" y1="{ly - 4:.1f}" x2="{lx + 16:.1f}" y2="{ly - 4:.1f}" '
            f'stroke="{color}" stroke-width="3"{dash}/>'
            f'<text x="{lx + 20:.1f}" y="{ly:.1f}" font-size="10">{text(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    title: str,
    bars: list[tuple[str, float]],
    *,
    x_label: str = "",
    width: int = 300,
    height: int = 200,
) -> str:
    """An SVG bar chart, one bar per ``(label, value)`` with its value above and ``x_label``
    under the axis; empty when no value is finite."""
    bars = [(label, value) for label, value in bars if finite(value)]
    if not bars:
        return ""
    left, right, top, bottom = 40, 10, 40, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    high = max(max(value for _, value in bars), 0) or 1.0
    slot = plot_w / len(bars)
    name = text(title)
    parts = [
        f'<svg class="chart bar-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{name}">',
        f"<title>{name}</title>",
        f'<text x="{width / 2:.1f}" y="16" text-anchor="middle" font-size="13" '
        f'font-weight="600">{name}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#444"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" font-size="10">'
        f"{text(number(high))}</text>",
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" font-size="10">0</text>',
    ]
    for i, (label, value) in enumerate(bars):
        bar_h = max(value, 0) / high * plot_h
        x = left + i * slot + slot * 0.15
        y = top + plot_h - bar_h
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{bar_h:.1f}" '
            f'fill="{PALETTE[0]}"><title>{text(label)}: {text(number(value))}</title></rect>'
            f'<text x="{x + slot * 0.35:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
            f'font-size="10">{text(number(value))}</text>'
            f'<text x="{x + slot * 0.35:.1f}" y="{top + plot_h + 13}" text-anchor="middle" '
            f'font-size="10">{text(label)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" font-size="10" '
        f'fill="#555">{text(x_label)}</text></svg>'
    )
    return "".join(parts)


# --- what the runs hold -------------------------------------------------------------------


def _series(value: Any, least: int = 2) -> list[float] | None:
    """``value`` as a per-step series: a list of numbers (``None`` for a missing step)."""
    if not isinstance(value, list) or not value:
        return None
    if not all(v is None or finite(v) for v in value):
        return None
    return value if sum(v is not None for v in value) >= least else None


def run_label(run: dict[str, Any], index: int) -> str:
    seed = run.get("seed")
    return (
        f"seed {seed}"
        if isinstance(seed, int | str) and not isinstance(seed, bool)
        else f"run {index}"
    )


def _fields(run: dict[str, Any]) -> dict[str, Any]:
    """The run's fields, its ``summary``'s beneath them (async GRPO keeps losses there)."""
    summary = run.get("summary")
    return {**(summary if isinstance(summary, dict) else {}), **run}


def _steps(fields: dict[str, Any], count: int) -> list[float]:
    for key in ("steps", "steps_logged"):
        steps = _series(fields.get(key), least=1)
        if steps is not None and len(steps) == count and None not in steps:
            return steps
    return list(range(1, count + 1))


def _eval_points(fields: dict[str, Any], key: str) -> list[tuple[float, float]]:
    value = fields.get(key)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [
            (v["step"], v["accuracy"])
            for v in value
            if finite(v.get("step")) and finite(v.get("accuracy"))
        ]
    ys, steps = _series(value, least=1), _series(fields.get("eval_steps"), least=1)
    if ys is None or steps is None or len(ys) != len(steps):
        return []
    return [(x, y) for x, y in zip(steps, ys, strict=True) if y is not None]


def curves(runs: Any) -> dict[str, list[Series]]:
    """``{series name: [(run label, points), ...]}`` over ``runs``: every per-step series (a
    list of two or more numbers that is not a step index) against the run's steps, and the eval
    series (``eval_accuracy`` as ``{step, accuracy}`` items, or ``eval_*`` lists beside
    ``eval_steps``); known names first (:data:`CURVE_TITLES`), then the others by name."""
    found: dict[str, list[Series]] = {}
    for index, run in enumerate(runs if isinstance(runs, list) else []):
        if not isinstance(run, dict):
            continue
        fields, label = _fields(run), run_label(run, index)
        for key in sorted(fields):
            if key in INDEX_KEYS:
                continue
            if key.startswith("eval_"):
                points = _eval_points(fields, key)
            else:
                ys = _series(fields[key])
                if ys is None:
                    continue
                xs = _steps(fields, len(ys))
                points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if points:
                found.setdefault(key, []).append((label, points))
    order = [k for k in CURVE_TITLES if k in found] + sorted(
        k for k in found if k not in CURVE_TITLES
    )
    return {key: found[key] for key in order}


def lag_histograms(runs: Any) -> list[tuple[str, list[tuple[str, float]]]]:
    """``[(run label, [(lag, count), ...])]`` for each run holding a ``lag_histogram``."""
    out = []
    for index, run in enumerate(runs if isinstance(runs, list) else []):
        if not isinstance(run, dict):
            continue
        histogram = _fields(run).get("lag_histogram")
        if not isinstance(histogram, dict) or not histogram:
            continue

        def lag_order(key: str) -> tuple[int, float, str]:
            try:
                return (0, float(key), key)
            except ValueError:
                return (1, 0.0, key)

        bars = [(str(lag), histogram[lag]) for lag in sorted(histogram, key=lag_order)]
        out.append((run_label(run, index), bars))
    return out
