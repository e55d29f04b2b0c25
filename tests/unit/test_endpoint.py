import json

import pytest

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
