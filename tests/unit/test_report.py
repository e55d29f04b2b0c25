"""Numbers the docs quote from evidence records are rendered from them (cortex_recipes.report):
the repository's docs match their records, a drifted number is named and rewritten, and a
marker that cannot be resolved is an error naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cortex_recipes.cli import main
from cortex_recipes.report import ReportError, check, render_value

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RECORD = {
    "date": "2026-12-06",
    "git_revision": "a3ba8904d1c2",
    "metrics": {"gain": {"value": 0.4140625, "low": 0.3046875, "high": 0.5234375}},
    "runs": [{"wall_time_s": 190.0}],
}


def repo(tmp_path: Path, doc: str) -> Path:
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "p.json").write_text(json.dumps(RECORD))
    (tmp_path / "README.md").write_text(doc)
    return tmp_path


def marker(field: str, fmt: str, text: str) -> str:
    return f"<!-- record evidence/p.json {field} {fmt} -->{text}<!-- /record -->"


def test_the_repositorys_docs_match_their_records():
    assert check(ROOT) == []


def test_formats():
    gain = RECORD["metrics"]["gain"]
    assert render_value(gain["value"], ".3f") == "0.414"
    assert render_value(gain, "interval") == "0.305-0.523"
    assert render_value(RECORD["git_revision"], "short") == "a3ba890"
    assert render_value(190.0, "minutes") == "3"
    assert render_value("2026-12-06", None) == "2026-12-06"


def test_a_drifted_number_is_named_and_rewritten(tmp_path, capsys):
    doc = (
        "Intro stays.\n"
        f"Gain {marker('metrics.gain.value', '.3f', '0.500')} "
        f"({marker('metrics.gain', 'interval', '0.305-0.523')}), "
        f"{marker('runs.0.wall_time_s', 'minutes', '3')} min.\n"
        "Outro stays.\n"
    )
    root = repo(tmp_path, doc)
    differences = check(root)
    assert [(d.path, d.line, d.written, d.rendered) for d in differences] == [
        ("README.md", 2, "0.500", "0.414")
    ]
    assert main(["report", "--root", str(root)]) == 1
    assert "README.md:2: evidence/p.json metrics.gain.value says '0.500'" in capsys.readouterr().out
    assert main(["report", "--write", "--root", str(root)]) == 0
    assert (root / "README.md").read_text() == doc.replace("-->0.500<", "-->0.414<")
    assert check(root) == []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (marker("metrics.missing", ".3f", "1"), "README.md:1: evidence/p.json has no field"),
        (marker("runs.5.wall_time_s", ".1f", "1"), "has no field 'runs.5.wall_time_s'"),
        (marker("date", ".3f", "x"), "date='2026-12-06' cannot be formatted as '.3f'"),
        ("<!-- record evidence/p.json date -->2026-12-06", "README.md:1: a record marker is not"),
        (
            "<!-- record evidence/none.json date -->x<!-- /record -->",
            "record evidence/none.json cannot be read",
        ),
    ],
)
def test_a_marker_that_cannot_be_rendered_names_the_place(tmp_path, doc, message):
    root = repo(tmp_path, doc + "\n")
    with pytest.raises(ReportError, match=None) as info:
        check(root)
    assert message in str(info.value)


def test_a_marker_shown_as_inline_code_is_prose(tmp_path):
    doc = "Write `<!-- record PATH FIELD -->0.5<!-- /record -->` or `<!-- record ... -->`.\n"
    root = repo(tmp_path, doc)
    assert check(root, write=True) == []
    assert (root / "README.md").read_text() == doc
