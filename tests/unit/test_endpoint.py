from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from cortex_recipes import endpoint
from cortex_recipes.endpoint import ConnectionConfigError, connect, read_connection_file

pytestmark = pytest.mark.unit


def _write(tmp_path, data) -> str:
    path = tmp_path / "conn.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_pat_file_missing_fields_are_named_and_the_pat_is_not_echoed(tmp_path):
    path = _write(tmp_path, {"host": "h", "pat": "s3cr3t-token"})
    with pytest.raises(ConnectionConfigError) as info:
        read_connection_file(path)
    assert "['database', 'schema']" in str(info.value)
    assert "s3cr3t-token" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not valid JSON"), ("[1]", "JSON object"), ({"base_url": "u"}, "missing")],
)
def test_bad_connection_files_fail_closed(tmp_path, content, message):
    with pytest.raises(ConnectionConfigError, match=message):
        read_connection_file(_write(tmp_path, content))


def test_unknown_keys_are_rejected(tmp_path):
    path = _write(
        tmp_path, {"base_url": "http://127.0.0.1:1", "database": "D", "schema": "S", "x": 1}
    )
    with pytest.raises(ConnectionConfigError, match=r"unknown keys \['x'\]"):
        read_connection_file(path)


def test_base_url_file_gives_a_plain_client(tmp_path):
    path = _write(tmp_path, {"base_url": "http://127.0.0.1:1", "database": "D", "schema": "S"})
    with connect(path) as client:
        assert client.base_url == "http://127.0.0.1:1" and client.database == "D"


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConnectionConfigError, match="does not exist"):
        read_connection_file(tmp_path / "nope.json")


class FakeBackend:
    """LocalBackend's launch/start/stop, recorded (a narrow unit contract: no server runs)."""

    made: list[FakeBackend] = []

    def __init__(self, state_dir, *, device=None, hosted=False):
        self.state_dir, self.device, self.hosted = Path(state_dir), device, hosted
        self.calls: list[str] = []
        self.base_url = "http://127.0.0.1:1"
        FakeBackend.made.append(self)

    def launch(self):
        self.calls.append("launch")

    def __enter__(self):
        self.calls.append("start")
        return self

    def __exit__(self, *exc):
        self.calls.append("stop")

    def stop(self):
        self.calls.append("stop")

    def client(self, **options):
        return types.SimpleNamespace(close=lambda: None)


def test_a_prelaunched_local_backend_is_the_one_connect_uses(tmp_path, monkeypatch):
    import cortex_recipes.local

    FakeBackend.made = []
    monkeypatch.setattr(cortex_recipes.local, "LocalBackend", FakeBackend, raising=False)
    monkeypatch.setattr(endpoint, "guard_backend", lambda client, backend: None)
    monkeypatch.setattr(endpoint, "_launched", {})
    endpoint.prelaunch("conn.json", tmp_path / "hosted")  # a connection file: nothing starts
    assert FakeBackend.made == []
    endpoint.prelaunch(endpoint.LOCAL, tmp_path / "a")
    endpoint.prelaunch(endpoint.LOCAL, tmp_path / "a")  # once per state folder
    assert [b.calls for b in FakeBackend.made] == [["launch"]]
    with endpoint.connect(endpoint.LOCAL, state_dir=tmp_path / "a"):
        pass
    with endpoint.connect(endpoint.LOCAL, state_dir=tmp_path / "b"):  # none launched: its own
        pass
    first, second = FakeBackend.made
    assert first.calls == ["launch", "start", "stop"] and second.calls == ["start", "stop"]
    assert endpoint._launched == {}
