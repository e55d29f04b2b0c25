"""A person's mistakes on a journey's command line are one ``error: ...`` line naming the field
or file, the value and what is accepted, exit code 2, no traceback (it goes to the run's
debug.log, or a file the line names), and nothing is started (issue 35: every config case
printed a 12-118 line traceback, and steps=-3 started the backend and saved a checkpoint)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SFT = "recipes.sft.conversational.train"
TINY = "profile=recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json"


def journey(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> Path:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    details = re.search(r"\(details: (.+)\)$", errors[0])
    assert details, errors[0]
    path = Path(details.group(1))
    assert "Traceback" in path.read_text()
    return path


@pytest.mark.parametrize(
    ("module", "arg", "fragments"),
    [
        (SFT, "steps=-3", ["steps=-3", "an integer >= 1"]),
        (SFT, "ckpt_interval=-1", ["ckpt_interval=-1", "an integer >= 0"]),
        ("recipes.rl.math_grpo.train", "steps=-1", ["steps=-1", ">= 1"]),
        ("recipes.agentic.tito.train", "warm_start_steps=-2", ["warm_start_steps=-2", ">= -1"]),
        (SFT, "learning_rate=-1", ["learning_rate", "-1"]),
        (SFT, "no_such_field=1", ["no_such_field", "accepted:"]),
        (SFT, "profile=recipes/sft/conversational/configs/absent.json", ["absent.json"]),
    ],
)
def test_a_bad_count_or_override_is_one_line_before_anything_starts(
    tmp_path, module, arg, fragments
):
    run_dir = tmp_path / "run"
    proc = journey(module, arg, f"log_path={run_dir}")
    assert_one_line_error(proc, *fragments)
    assert not (run_dir / "backend").exists()  # no backend was started


def test_a_bad_connection_file_names_the_file_and_its_missing_keys(tmp_path):
    connection = tmp_path / "connection.json"
    connection.write_text('{"base_url": "http://127.0.0.1:9"}')
    proc = journey(SFT, TINY, f"connection={connection}", f"log_path={tmp_path / 'run'}")
    details = assert_one_line_error(proc, str(connection), "database", "schema")
    assert details == tmp_path / "run" / "debug.log"  # the run folder's own debug log


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_endpoint_that_does_not_answer_names_the_connection_file_not_the_host(tmp_path):
    """A connection file's endpoint keeps the SDK's retries (here max_retries=0 from the file);
    once they give up the run stops with one line naming the file (issue 35: a raw
    ConnectionError after 76 s, without the file)."""
    connection = tmp_path / "connection.json"
    port = closed_port()
    connection.write_text(
        f'{{"base_url": "http://127.0.0.1:{port}", "database": "D", "schema": "S", "max_retries": 0}}'
    )
    proc = journey(SFT, TINY, f"connection={connection}", f"log_path={tmp_path / 'run'}")
    assert_one_line_error(proc, f"connection file {connection} did not answer", "rerun")
    assert str(port) not in [x for x in proc.stderr.splitlines() if x.startswith("error: ")][0]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"base_url": "http://127.0.0.1:99999", "database": "D", "schema": "S"}', "base_url"),
        ('{"base_url": "ftp://x", "database": "D", "schema": "S"}', "base_url"),
        ('{"host": "https://acct.example/x", "pat": "p", "database": "D", "schema": "S"}', "host"),
        ('{"base_url": "http://127.0.0.1:1", "database": "", "schema": "S"}', "database"),
        ('{"base_url": "http://127.0.0.1:1", "database": "D", "schema": "S", "max_retries": -1}',
         "max_retries=-1"),
    ],
)  # fmt: skip
def test_a_bad_address_in_a_connection_file_names_the_field_not_the_value(tmp_path, body, fragment):
    connection = tmp_path / "connection.json"
    connection.write_text(body)
    proc = journey(SFT, TINY, f"connection={connection}", f"log_path={tmp_path / 'run'}")
    assert_one_line_error(proc, str(connection), fragment)
    assert "acct.example" not in proc.stderr and "99999" not in proc.stderr
