"""The HTML release report (cortex_recipes.report_html, `cortex-recipes report --html DIR`):
the repository's own records rendered into a folder that stands alone (every landed journey's
section, failed records marked, SVG curves and lag histograms, copied plots and records, no
network resources, the same bytes twice), text escaped, and the page as a real headless
Chromium draws it."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cortex_recipes.cli import main
from cortex_recipes.journeys import load_journeys, load_recipe
from cortex_recipes.report_charts import bar_chart, curves, lag_histograms, line_chart
from cortex_recipes.report_html import render, write_html

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
GENERATED = "2026-12-07"
ARTICLE = re.compile(
    r'<article class="(?P<classes>[^"]*)" id="(?P<id>[^"]*)">\s*<h3>(?P<h3>.*?)</h3>'
)


def landed() -> list:
    return [journey for journey in load_journeys(ROOT) if journey.landed]


def records() -> list[tuple[str, Path]]:
    """(journey name, record path) for every record of a landed journey."""
    return [
        (journey.name, path)
        for journey in landed()
        for path in sorted((journey.path(ROOT) / "evidence").glob("*.json"))
    ]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_html(ROOT, out, generated=GENERATED, revision="0123abcd")
    return out


@pytest.fixture(scope="module")
def page(report) -> str:
    return (report / "index.html").read_text()


def articles(page: str) -> dict[str, tuple[str, str]]:
    """``{article id: (classes, heading)}``."""
    return {m["id"]: (m["classes"], m["h3"]) for m in ARTICLE.finditer(page)}


def article(page: str, anchor: str) -> str:
    start = page.index(f'id="{anchor}"')
    return page[start : page.index("</article>", start)]


def test_every_landed_journey_has_its_section_titled_from_its_recipe(page):
    assert landed()
    for journey in landed():
        title = load_recipe(journey.path(ROOT) / "recipe.yaml")["title"]
        assert f'<section id="journey-{journey.name}"><h2>' in page
        heading = re.search(rf'<section id="journey-{journey.name}"><h2>(.*?)</h2>', page)[1]
        assert heading == html.escape(title)
    assert 'revision <code class="revision">0123abcd</code>' in page
    assert GENERATED in page


def test_every_record_has_a_block_and_failed_ones_are_marked_failed(page):
    blocks = articles(page)
    failed_seen = 0
    for journey, path in records():
        anchor = f"record-{journey}-{path.name.removesuffix('.json')}"
        assert anchor in blocks, f"no block for {path}"
        classes, heading = blocks[anchor]
        if json.loads(path.read_text()).get("passed") is not True:
            failed_seen += 1
            assert "failed" in classes.split(), (anchor, classes)
            assert "FAILED" in heading, (anchor, heading)
        else:
            assert "failed" not in classes.split() and "FAILED" not in heading, anchor
    assert failed_seen >= 1  # the repository keeps failed attempts (*.failed.json)
    assert any(path.name.endswith(".failed.json") for _, path in records())


def test_the_summary_lists_every_profile_with_its_record_status(page):
    summary = page[page.index('<table class="summary">') : page.index("</table>")]
    for journey in landed():
        recipe = load_recipe(journey.path(ROOT) / "recipe.yaml")
        for profile in recipe["profiles"]:
            row = re.search(
                rf'<tr><td><a href="#journey-{journey.name}">[^<]*</a></td>'
                rf"<td><code>{re.escape(profile['name'])}</code></td>.*?</tr>",
                summary,
            )
            assert row, (journey.name, profile["name"])
            assert (profile["last_validated"] or "not validated") in row[0]
            assert re.search(r"status-(passed|failed|stale|none|unvalidated)", row[0])
            if profile["last_validated"]:
                assert "status-passed" in row[0] or "status-stale" in row[0], row[0]
            else:  # a record that passed once is not shown as passing an unvalidated profile
                assert "status-passed" not in row[0], row[0]


def test_records_with_per_step_series_get_svg_curves_and_async_grpo_its_lag_histograms(page):
    with_losses = 0
    for journey, path in records():
        record = json.loads(path.read_text())
        runs = record.get("runs") or []
        block = article(page, f"record-{journey}-{path.name.removesuffix('.json')}")
        if any(isinstance(run.get("losses"), list) and len(run["losses"]) > 1 for run in runs):
            with_losses += 1
            assert '<svg class="chart line-chart"' in block and "<polyline" in block, path
            assert 'aria-label="loss"' in block, path
        histograms = [run for run in runs if isinstance(run.get("lag_histogram"), dict)]
        assert block.count('<svg class="chart bar-chart"') == len(histograms), path
    assert with_losses >= 3
    grpo = ROOT / "recipes/rl/async_grpo/evidence/local-cpu-smollm2-lora.failed.json"
    runs = json.loads(grpo.read_text())["runs"]
    block = article(page, "record-grpo-local-cpu-smollm2-lora.failed")
    for run in runs:
        assert f'aria-label="lag histogram, seed {run["seed"]}"' in block
        assert f"seed {run['seed']}" in block  # the curves' legend


def test_the_folder_stands_alone_every_link_resolves_and_nothing_is_fetched(report, page):
    links = re.findall(r'(?:href|src)="([^"#][^"]*)"', page)
    assert any(link.startswith("plots/") for link in links)
    assert any(link.startswith("evidence/") for link in links)
    for link in links:
        assert not re.match(r"[a-z]+:", link), f"external resource {link}"
        assert (report / link).is_file(), f"{link} is linked but not copied"
    for journey, path in records():
        copy = report / "evidence" / journey / path.name
        assert copy.read_bytes() == path.read_bytes()
    assert set(re.findall(r"https?://[^\"' ]*", page)) == {"http://www.w3.org/2000/svg"}
    assert "<script" not in page.lower()


def test_the_cli_writes_the_same_page_but_for_its_revision_and_date(tmp_path, capsys, report, page):
    assert main(["report", "--root", str(ROOT), "--html", str(tmp_path)]) == 0
    index = tmp_path / "index.html"
    assert str(index) in capsys.readouterr().out
    written = index.read_text()
    assert re.search(r'<code class="revision">([0-9a-f]{40}|unknown)</code>', written)
    # the same inputs give the same bytes: only the header's revision and date differ
    written = re.sub(r'(<code class="revision">)[^<]*', r"\g<1>0123abcd", written, count=1)
    written = re.sub(r'(<span class="generated">)[^<]*', rf"\g<1>{GENERATED}", written, count=1)
    assert written == page
    copied = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert copied == sorted(p.relative_to(report) for p in report.rglob("*") if p.is_file())


# --- a small repository of our own: escaping, stale and unreadable records ----------------


def fake_repo(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    evil = "<script>alert(1)</script>"
    (tmp_path / "journeys.toml").write_text(
        '[[journey]]\nname = "evil"\nfolder = "recipes/evil"\nextra = "sft"\n'
        'entry_point = "x"\nsmoke = "x"\nstatus = "landed"\n'
    )
    folder = tmp_path / "recipes" / "evil"
    (folder / "evidence" / "plots" / "p").mkdir(parents=True)
    (folder / "evidence" / "plots" / "p" / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    recipe = {
        "title": f"Evil {evil}",
        "profiles": [
            {"name": "p", "config": "configs/p.json", "hardware": evil, "purpose": evil,
             "last_validated": "2026-12-01", "evidence": "evidence/p.json"},
            {"name": "q", "config": "configs/q.json", "hardware": "CPU", "purpose": "x",
             "last_validated": None, "evidence": None},
        ],
    }  # fmt: skip
    (folder / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    record = {
        "profile": evil,
        "passed": True,
        "date": "2026-12-01",
        "git_revision": evil,
        "hardware": {evil: evil},
        "checks": {evil: False, "fine": True},
        "metrics": {evil: {"value": 0.5, "low": 0.4, "high": 0.6, "level": 0.95,
                           "method": evil, "min": 0.1, "max": None, "within": True}},
        "plots": ["evidence/plots/p/loss.png", "../../../etc/passwd", evil],
        "runs": [{"seed": evil, "losses": [1.0, 0.5, None, 0.25], "rewards": [0, 1],
                  "lag_histogram": {"1": 3, "0": 5, "10": 1}}],
    }  # fmt: skip
    (folder / "evidence" / "p.json").write_text(json.dumps(record))
    (folder / "evidence" / "q.failed.json").write_text("{not json")
    return tmp_path


def test_text_is_escaped_everywhere(tmp_path):
    root = fake_repo(tmp_path / "repo")
    index = write_html(root, tmp_path / "out", generated=GENERATED)
    page = index.read_text()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Evil &lt;script&gt;" in page
    # a plot outside the journey folder is named, not copied
    assert not (tmp_path / "out" / "plots" / "evil" / "etc").exists()
    assert (tmp_path / "out" / "plots" / "evil" / "p" / "loss.png").is_file()
    assert "revision" in page  # outside a git checkout: "unknown"
    assert '<code class="revision">unknown</code>' in page


def test_a_record_without_a_code_digest_is_stale_and_an_unreadable_one_failed(tmp_path):
    root = fake_repo(tmp_path / "repo")
    page, _ = render(root, generated=GENERATED, revision="r")
    blocks = articles(page)
    assert "stale" in blocks["record-evil-p"][0].split()
    assert "STALE" in blocks["record-evil-p"][1]
    assert "no code_digest" in page
    assert "status-stale" in page
    classes, heading = blocks["record-evil-q.failed"]
    assert "failed" in classes.split() and "FAILED" in heading
    assert "cannot be read" in article(page, "record-evil-q.failed")


def test_curves_take_steps_summaries_and_eval_points():
    runs = [
        {"seed": 0, "rewards": [0.1, 0.2], "steps_logged": [3, 4],
         "summary": {"losses": [1.0, 0.5], "eval_accuracy": [{"step": 0, "accuracy": 0.2},
                                                             {"step": 4, "accuracy": 0.6}]},
         "lag_histogram": {"2": 1, "0": 4}},
        {"losses": [2.0, 1.0, 0.5], "eval_steps": [0, 3], "eval_teacher_reverse_kl": [1.5, 1.0],
         "steps": [1, 2, 3], "mask_sha256": ["a", "b"], "model_turns": [True, False]},
    ]  # fmt: skip
    found = curves(runs)
    assert list(found)[:3] == ["losses", "rewards", "eval_accuracy"]
    assert found["rewards"] == [("seed 0", [(3, 0.1), (4, 0.2)])]
    assert found["losses"] == [
        ("seed 0", [(3, 1.0), (4, 0.5)]),
        ("run 1", [(1, 2.0), (2, 1.0), (3, 0.5)]),
    ]
    assert found["eval_accuracy"] == [("seed 0", [(0, 0.2), (4, 0.6)])]
    assert found["eval_teacher_reverse_kl"] == [("run 1", [(0, 1.5), (3, 1.0)])]
    assert "mask_sha256" not in found and "model_turns" not in found and "steps" not in found
    assert lag_histograms(runs) == [("seed 0", [("0", 4), ("2", 1)])]


def test_the_charts_draw_axes_ranges_one_line_per_run_and_a_legend():
    chart = line_chart("loss", [("seed 0", [(1, 2.0), (2, 1.0)]), ("seed 1", [(1, 3.0), (2, 0.5)])])
    assert chart.count("<polyline") == 2 and "seed 0" in chart and "seed 1" in chart
    assert ">3<" in chart and ">0.5<" in chart  # the y range
    assert line_chart("empty", [("a", [(1, float("nan"))])]) == ""
    flat = line_chart("flat", [("a", [(1, 1.0), (2, 1.0)])])  # a constant series still draws
    assert "<polyline" in flat and "nan" not in flat
    bars = bar_chart("lag", [("0", 5), ("1", 2)], x_label="policy lag (steps)")
    assert bars.count("<rect") == 2 and "policy lag (steps)" in bars


# --- the page in a real browser -------------------------------------------------------------


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="needs chromium for the headless-browser check (.ci/run installs it: apt chromium)",
)
def test_chromium_draws_the_page_and_its_dom_holds_every_journey(report, tmp_path):
    image_lib = pytest.importorskip("PIL.Image")
    stat_lib = pytest.importorskip("PIL.ImageStat")
    url = (report / "index.html").as_uri()
    shot = tmp_path / "page.png"
    base = [
        shutil.which("chromium"), "--headless=new", "--no-sandbox", "--disable-gpu",
        "--hide-scrollbars", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,4000",
    ]  # fmt: skip
    started = time.monotonic()
    drawn = subprocess.run(
        [*base, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120
    )
    assert drawn.returncode == 0 and shot.is_file(), drawn.stderr[-2000:]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert time.monotonic() - started < 60

    with image_lib.open(shot) as image:
        gray = image.convert("L")
    assert gray.size == (1280, 4000)
    assert stat_lib.Stat(gray).stddev[0] > 5  # not one flat colour
    background = gray.getpixel((2, 2))  # the page's margin
    histogram = gray.histogram()
    differing = sum(histogram) - histogram[background]
    assert differing / sum(histogram) > 0.01, f"{differing} pixels differ from the background"

    for journey in landed():
        assert f'<section id="journey-{journey.name}">' in dom.stdout
    assert "<svg" in dom.stdout and "FAILED" in dom.stdout
