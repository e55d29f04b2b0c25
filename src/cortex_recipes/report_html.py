"""A static HTML release report of every landed journey's qualification evidence.

``cortex-recipes report --html DIR`` writes ``DIR/index.html``: a header with the repository
revision and the generation date, a summary table of every landed journey's profiles (hardware,
purpose, ``last_validated`` and the status of the record behind it: passed, failed, stale or
none), then one ``<section id="journey-NAME">`` per journey with one block per record in its
``evidence/`` folder (``<profile>.json`` and kept failed attempts, ``<profile>.failed.json``,
marked FAILED): provenance, the metrics against their bars, the checks, learning curves drawn as
inline SVG from the runs' per-step series, the async GRPO lag histogram, the record's plot PNGs
and a link to the record itself. The plots and the records are copied next to the page
(``DIR/plots/<journey>/...``, ``DIR/evidence/<journey>/...``), so the folder is published as it
is: inline CSS, no JavaScript, nothing fetched from the network. The same inputs give the same
bytes but for the generation date (a parameter). The charts are drawn by
:mod:`cortex_recipes.report_charts`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cortex_recipes import journeys as journeys_lib
from cortex_recipes.journeys import Journey, JourneyError
from cortex_recipes.report_charts import (
    CURVE_TITLES,
    bar_chart,
    curves,
    finite,
    lag_histograms,
    line_chart,
    number,
    text,
)

log = logging.getLogger(__name__)

INDEX = "index.html"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
  max-width: 1240px; padding: 1em 1.5em; color: #1b1b1b; background: #ffffff; }
header { border-bottom: 2px solid #1b1b1b; margin-bottom: 1em; }
h1 { margin: 0.2em 0; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.92em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.92em; }
th, td { border: 1px solid #d0d0d0; padding: 0.25em 0.55em; text-align: left;
  vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status { font-weight: 600; padding: 0.05em 0.4em; border-radius: 3px; }
.status-passed { background: #d9f2dd; color: #14532d; }
.status-failed { background: #fbd5d5; color: #7f1d1d; }
.status-stale { background: #fde9c8; color: #7c3d00; }
.status-none { background: #ececec; color: #555555; }
.status-unvalidated { background: #e6ecf5; color: #2c3e5a; }
article.record { border: 1px solid #c8c8c8; border-left: 6px solid #2e7d32; border-radius: 4px;
  padding: 0.4em 1em 0.8em; margin: 1em 0; }
article.record.failed { border-left-color: #c62828; background: #fff7f7; }
article.record.stale { border-left-color: #ef8c00; }
article.record h3 { margin: 0.3em 0; }
.failed h3 .mark { color: #c62828; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 0.1em 1em; margin: 0.4em 0; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; }
ul.checks { list-style: none; padding: 0; margin: 0.3em 0; display: flex; flex-wrap: wrap;
  gap: 0.25em 0.6em; font-size: 0.88em; }
ul.checks li.pass { color: #14532d; } ul.checks li.fail { color: #b71c1c; font-weight: 700; }
.charts { display: flex; flex-wrap: wrap; gap: 0.6em; }
.charts svg { border: 1px solid #e0e0e0; background: #fcfcfc; }
.plots { display: flex; flex-wrap: wrap; gap: 0.5em; }
.plots img { max-width: 290px; border: 1px solid #e0e0e0; }
.within-yes { color: #14532d; } .within-no { color: #b71c1c; font-weight: 700; }
.note { color: #555555; font-size: 0.9em; }
"""


@dataclass
class RecordView:
    """One evidence record of a journey, as the page shows it."""

    journey: Journey
    filename: str  # in the journey's evidence/ folder
    record: dict[str, Any] | None
    error: str = ""
    failed_attempt: bool = False  # a kept <profile>.failed.json
    stale_reasons: list[str] = field(default_factory=list)
    validated: bool = False  # the record behind the profile's last_validated

    @property
    def anchor(self) -> str:
        return f"record-{self.journey.name}-{self.filename.removesuffix('.json')}"

    @property
    def status(self) -> str:
        if self.record is None or self.record.get("passed") is not True:
            return "failed"
        if not self.validated and not self.failed_attempt:
            # a passing record no last_validated stands on: an earlier config or code
            return "unvalidated"
        return "stale" if self.stale_reasons else "passed"


def repository_revision(root: Path) -> str:
    """``git rev-parse HEAD`` of ``root``, or ``unknown`` outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    revision = done.stdout.strip()
    return revision if done.returncode == 0 and revision else "unknown"


def _read(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"cannot be read: {exc}"
    if not isinstance(data, dict):
        return None, "does not hold a JSON object"
    return data, ""


def _stale(root: Path) -> dict[str, list[str]]:
    """Reasons per record path (from the root) of :func:`stale_records`."""
    from cortex_recipes.repo_checks.records import stale_records

    stale: dict[str, list[str]] = {}
    for record in stale_records(root):
        stale.setdefault(record.evidence, []).append(record.reason)
    return stale


def _journey_records(
    root: Path, journey: Journey, profiles: list[dict[str, Any]], stale: dict[str, list[str]]
) -> list[RecordView]:
    """The records of ``journey``'s evidence folder: each profile's (its ``evidence``, else
    ``evidence/<profile>.json``) and kept failed attempt, in profile order, then the rest."""
    folder = journey.path(root)
    evidence = folder / "evidence"
    present = sorted(p.name for p in evidence.glob("*.json")) if evidence.is_dir() else []
    ordered: dict[str, dict[str, Any] | None] = {}
    for profile in profiles:
        for name in (_profile_record(profile), f"{profile['name']}.failed.json"):
            if name in present and name not in ordered:
                ordered[name] = profile
    ordered.update({name: None for name in present if name not in ordered})
    views = []
    for name, profile in ordered.items():
        record, error = _read(evidence / name)
        backing = bool(profile and profile.get("last_validated") and profile.get("evidence"))
        where = f"{journey.folder}/{profile['evidence']}" if backing else ""
        backing = backing and Path(profile["evidence"]).name == name
        views.append(
            RecordView(
                journey=journey,
                filename=name,
                record=record,
                error=error,
                failed_attempt=name.endswith(".failed.json"),
                stale_reasons=stale.get(where, []) if backing else [],
                validated=backing,
            )
        )
    return views


def _profile_record(profile: dict[str, Any]) -> str:
    evidence = profile.get("evidence")
    if isinstance(evidence, str) and evidence:
        return Path(evidence).name
    return f"{profile['name']}.json"


@dataclass
class JourneyView:
    journey: Journey
    title: str
    profiles: list[dict[str, Any]]
    records: list[RecordView]
    error: str = ""


def collect(root: Path) -> list[JourneyView]:
    """Every landed journey, its recipe's profiles and its records."""
    root = Path(root).resolve()
    stale = _stale(root)
    views = []
    for journey in journeys_lib.load_journeys(root):
        if not journey.landed:
            continue
        try:
            recipe = journeys_lib.load_recipe(journey.path(root) / "recipe.yaml")
        except JourneyError as exc:
            views.append(JourneyView(journey, journey.name, [], [], error=str(exc)))
            continue
        profiles = journeys_lib.recipe_profiles(recipe)
        title = recipe.get("title") if isinstance(recipe.get("title"), str) else journey.name
        records = _journey_records(root, journey, profiles, stale)
        views.append(JourneyView(journey, title, profiles, records))
    return views


def _status(status: str, href: str = "", title: str = "") -> str:
    label = f'<span class="status status-{status}"'
    label += f' title="{text(title)}"' if title else ""
    label += f">{status}</span>"
    return f'<a href="#{text(href)}">{label}</a>' if href else label


def _summary(views: list[JourneyView]) -> str:
    rows = [
        '<table class="summary"><thead><tr><th>journey</th><th>profile</th><th>hardware</th>'
        "<th>purpose</th><th>last validated</th><th>record</th><th>failed attempt</th></tr>"
        "</thead><tbody>"
    ]
    for view in views:
        journey = f'<a href="#journey-{text(view.journey.name)}">{text(view.journey.name)}</a>'
        if view.error:
            rows.append(f'<tr><td>{journey}</td><td colspan="6">{text(view.error)}</td></tr>')
            continue
        by_name = {r.filename: r for r in view.records}
        for profile in view.profiles:
            main = by_name.get(_profile_record(profile))
            failed = by_name.get(f"{profile['name']}.failed.json")
            if main is None:
                status = _status("none")
            else:
                status = _status(main.status, main.anchor, "; ".join(main.stale_reasons))
            attempt = _status("failed", failed.anchor) if failed else ""
            rows.append(
                f"<tr><td>{journey}</td><td><code>{text(profile['name'])}</code></td>"
                f"<td>{text(profile.get('hardware') or '')}</td>"
                f"<td>{text(profile.get('purpose') or '')}</td>"
                f"<td>{text(profile.get('last_validated') or 'not validated')}</td>"
                f"<td>{status}</td><td>{attempt}</td></tr>"
            )
    rows.append("</tbody></table>")
    return "".join(rows)


def _mapping(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    return "" if value is None else str(value)


def _metrics(metrics: Any) -> str:
    if not isinstance(metrics, dict) or not metrics:
        return '<p class="note">no metrics</p>'
    rows = [
        '<table class="metrics"><thead><tr><th>metric</th><th>value</th><th>95% interval</th>'
        "<th>bar</th><th>within</th></tr></thead><tbody>"
    ]
    for name in sorted(metrics):
        metric = metrics[name] if isinstance(metrics[name], dict) else {"value": metrics[name]}
        interval = "—"
        if finite(metric.get("low")) and finite(metric.get("high")):
            interval = f"{metric['low']:.3f}–{metric['high']:.3f}"
            about = [
                f"{metric['level']:.0%}" if finite(metric.get("level")) else "",
                str(metric.get("method") or ""),
                f"n={metric['n']}" if metric.get("n") is not None else "",
            ]
            about = [a for a in about if a]
            if about:
                interval += f' <span class="note">({text(", ".join(about))})</span>'
        low, high = metric.get("min"), metric.get("max")
        if low is not None and high is not None:
            bar = f"{number(low)} – {number(high)}"
        elif low is not None:
            bar = f"≥ {number(low)}"
        elif high is not None:
            bar = f"≤ {number(high)}"
        else:
            bar = "—"
        within = metric.get("within")
        within_cell = {True: '<span class="within-yes">✓ within</span>',
                       False: '<span class="within-no">✗ outside</span>'}.get(within, "—")  # fmt: skip
        rows.append(
            f"<tr><td><code>{text(name)}</code></td>"
            f'<td class="num">{text(number(metric.get("value")))}</td>'
            f"<td>{interval}</td><td>{text(bar)}</td><td>{within_cell}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "".join(rows)


def _checks(checks: Any) -> str:
    if not isinstance(checks, dict) or not checks:
        return '<p class="note">no checks</p>'
    failed = sorted(name for name, ok in checks.items() if ok is not True)
    out = []
    if failed:
        out.append(
            '<p class="failed-checks"><strong>Failed checks:</strong> '
            + ", ".join(f"<code>{text(name)}</code>" for name in failed)
            + "</p>"
        )
    items = [
        f'<li class="{"pass" if checks[name] is True else "fail"}">'
        f"{'✓' if checks[name] is True else '✗'} {text(name)}</li>"
        for name in sorted(checks)
    ]
    out.append(f'<ul class="checks">{"".join(items)}</ul>')
    return "".join(out)


def _charts(record: dict[str, Any]) -> str:
    runs = record.get("runs")
    charts = [
        line_chart(CURVE_TITLES.get(key, key.replace("_", " ")), series)
        for key, series in curves(runs).items()
    ]
    charts += [
        bar_chart(f"lag histogram, {label}", bars, x_label="policy lag (steps)")
        for label, bars in lag_histograms(runs)
    ]
    charts = [chart for chart in charts if chart]
    if not charts:
        return ""
    return f'<h4>Curves</h4><div class="charts">{"".join(charts)}</div>'


@dataclass
class Copies:
    """Files to copy next to the page: ``{destination relative to DIR: source}``."""

    files: dict[str, Path] = field(default_factory=dict)


def _plots(view: RecordView, folder: Path, copies: Copies) -> str:
    plots = view.record.get("plots") if view.record else None
    if not isinstance(plots, list) or not plots:
        return ""
    items = []
    for plot in plots:
        if not isinstance(plot, str):
            continue
        source = (folder / plot).resolve()
        if not source.is_relative_to(folder.resolve()) or not source.is_file():
            items.append(f'<span class="note">missing plot: {text(plot)}</span>')
            continue
        relative = source.relative_to(folder.resolve())
        if relative.parts[:2] == ("evidence", "plots"):
            relative = Path(*relative.parts[2:])
        target = f"plots/{view.journey.name}/{relative.as_posix()}"
        copies.files[target] = source
        href = text(quote(target))
        items.append(f'<a href="{href}"><img src="{href}" alt="{text(relative.as_posix())}"></a>')
    return f'<h4>Plots</h4><div class="plots">{"".join(items)}</div>' if items else ""


def _record(view: RecordView, root: Path, copies: Copies) -> str:
    folder = view.journey.path(root)
    target = f"evidence/{view.journey.name}/{view.filename}"
    copies.files[target] = folder / "evidence" / view.filename
    record = view.record or {}
    status = view.status
    marks = []
    if status == "failed":
        marks.append("FAILED")
    elif status == "stale":
        marks.append("STALE")
    elif status == "unvalidated":
        marks.append("passed once, but the profile is not validated on it")
    if view.failed_attempt:
        marks.append("kept failed attempt")
    heading = text(record.get("profile") or view.filename.removesuffix(".json"))
    mark = f' <span class="mark">{text(" — ".join(marks))}</span>' if marks else ""
    classes = " ".join(["record", *([status] if status not in ("passed", "unvalidated") else [])])
    parts = [
        f'<article class="{classes}" id="{text(view.anchor)}">',
        f"<h3>{heading}{mark}</h3>",
        f'<p><a href="{text(quote(target))}">{text(view.filename)}</a> (the record, JSON)',
    ]
    if view.validated:
        parts.append(" — the record behind this profile's <code>last_validated</code>")
    elif not view.failed_attempt:
        parts.append(' — <span class="note">not behind a <code>last_validated</code>; '
                     "not checked for staleness</span>")  # fmt: skip
    parts.append("</p>")
    if view.error:
        parts.append(f"<p><strong>FAILED:</strong> the record {text(view.error)}</p></article>")
        return "".join(parts)
    if view.stale_reasons:
        parts.append(
            "<p><strong>Stale:</strong></p><ul>"
            + "".join(f"<li>{text(reason)}</li>" for reason in view.stale_reasons)
            + "</ul>"
        )
    digest = str(record.get("code_digest") or "")[:12] or "—"
    if record.get("code_digest_form"):
        digest += f" ({record['code_digest_form']})"
    facts = [
        ("passed", number(record.get("passed"))),
        ("date", record.get("date") or "—"),
        ("hardware", _mapping(record.get("hardware")) or "—"),
        ("git revision", record.get("git_revision") or "—"),
        ("code digest", digest),
        ("config hash", record.get("config_hash") or "—"),
        ("packages", _mapping(record.get("packages")) or "—"),
    ]
    if record.get("image_digest"):
        facts.append(("image digest", record["image_digest"]))
    parts.append(
        '<dl class="facts">'
        + "".join(f'<dt>{text(k)}</dt><dd class="mono">{text(v)}</dd>' for k, v in facts)
        + "</dl>"
    )
    parts += [
        "<h4>Metrics</h4>",
        _metrics(record.get("metrics")),
        "<h4>Checks</h4>",
        _checks(record.get("checks")),
        _charts(record),
        _plots(view, folder, copies),
        "</article>",
    ]
    return "".join(parts)


def render(
    root: Path, *, generated: str | dt.date | None = None, revision: str | None = None
) -> tuple[str, dict[str, Path]]:
    """The page and the files it links (``{path relative to the page: source}``)."""
    root = Path(root).resolve()
    generated = str(generated or dt.date.today())
    revision = revision if revision is not None else repository_revision(root)
    views = collect(root)
    copies = Copies()
    body = []
    for view in views:
        name = text(view.journey.name)
        body.append(
            f'<section id="journey-{name}"><h2>{text(view.title)}</h2>'
            f'<p class="note">journey <code>{name}</code>, '
            f"<code>{text(view.journey.folder)}</code></p>"
        )
        if view.error:
            body.append(f"<p><strong>recipe.yaml cannot be read:</strong> {text(view.error)}</p>")
        elif not view.records:
            body.append('<p class="note">no evidence records</p>')
        body += [_record(record, root, copies) for record in view.records]
        body.append("</section>")
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>cortex-recipes release report</title>",
            f"<style>{CSS}</style></head><body>",
            "<header><h1>cortex-recipes release report</h1>",
            f'<p>revision <code class="revision">{text(revision)}</code> · generated '
            f'<span class="generated">{text(generated)}</span></p></header>',
            "<h2>Summary</h2>",
            '<p class="note">Every profile of every landed journey; the record column is the '
            "record behind the profile (passed, failed, stale: no longer describes the code, "
            "unvalidated: passed once but no last_validated stands on it, or "
            "none) and links to it below.</p>",
            _summary(views),
            *body,
            "</body></html>",
            "",
        ]
    )
    return page, dict(sorted(copies.files.items()))


def write_html(
    root: Path,
    out: Path,
    *,
    generated: str | dt.date | None = None,
    revision: str | None = None,
) -> Path:
    """Write ``out/index.html`` and copy the plots and records it links; returns the page."""
    page, files = render(root, generated=generated, revision=revision)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for relative, source in files.items():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    index = out / INDEX
    index.write_text(page, encoding="utf-8")
    return index
