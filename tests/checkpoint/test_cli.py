"""python -m checkpoint inspect."""

from __future__ import annotations

import json
import subprocess
import sys

from checkpoint.__main__ import main

from .helpers import checkpoint_version


def _run(*args):
    return subprocess.run([sys.executable, "-m", "checkpoint", *args], capture_output=True, text=True, timeout=60)


def test_inspect_prints_versions_and_the_latest_version(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put_many(((i,), i) for i in range(100))
    checkpoint_version(storage, 1, tables)
    tables["state"].put((1,), "x")
    checkpoint_version(storage, 2, tables, metadata={"watermark": 77}, max_delta_ratio=100.0)
    result = _run("inspect", storage.location, "--verify")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "versions: 1, 2 (latest 2)" in out
    assert "version 2" in out and "watermark" in out and "every checksum matches" in out
    assert "key group  chain  kinds" in out and "SD" in out


def test_inspect_json_of_an_older_version(storage, make_tables, capsys):
    tables = make_tables(track=True)
    tables["state"].put_many(((i,), i) for i in range(20))
    checkpoint_version(storage, 1, tables)
    tables["state"].put((1,), "x")
    checkpoint_version(storage, 2, tables)
    assert main(["inspect", storage.location, "--version", "1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["versions"] == [1, 2]
    assert info["version"]["version"] == 1 and info["version"]["deltas"] == 0


def test_inspect_of_a_missing_version_fails_with_a_message(storage, capsys):
    assert main(["inspect", storage.location, "--version", "9"]) == 1
    assert "version 9" in capsys.readouterr().err


def test_inspect_refuses_a_storage_option_without_a_value(storage, capsys):
    assert main(["inspect", storage.location, "--storage-option", "client_kwargs.endpoint_url"]) == 2
    assert "must be KEY=VALUE" in capsys.readouterr().err


def test_inspect_refuses_storage_options_that_are_not_a_json_object(storage, capsys):
    assert main(["inspect", storage.location, "--storage-options", '["key", "x"]']) == 2
    assert "must be a JSON object" in capsys.readouterr().err


def test_storage_options_merge_json_then_dotted_pairs():
    from checkpoint.__main__ import storage_options_of

    options = storage_options_of(
        '{"key": "a", "client_kwargs": {"region_name": "eu-west-1"}}',
        ["client_kwargs.endpoint_url=http://127.0.0.1:9000", "key=b", "anon=false"],
    )
    assert options == {
        "key": "b",
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:9000"},
    }
