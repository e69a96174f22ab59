"""read_state: a DataFrame of one table of a version."""

from __future__ import annotations

import pandas as pd
import pytest

from checkpoint import read_state

from .helpers import checkpoint_version


def _expected(rows, names=("k0", "k1")):
    frame = pd.DataFrame([(k[0], k[1], v) for k, v in rows], columns=[*names, "state"])
    return frame.sort_values(list(names)).reset_index(drop=True)


def test_read_state_returns_keys_and_unpickled_values(storage, make_tables):
    tables = make_tables(track=True)
    rows = [(("user", i), {"count": i}) for i in range(50)]
    tables["state"].put_many(rows)
    tables["timers"].put(("user", 1), [10])
    checkpoint_version(storage, 1, tables)
    frame = read_state(storage.location)
    assert list(frame.columns) == ["k0", "k1", "state"]
    got = frame.sort_values(["k0", "k1"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, _expected(rows))


def test_read_state_reads_the_requested_version_and_names(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put_many(((f"u{i}", i), i) for i in range(10))
    checkpoint_version(storage, 1, tables)
    tables["state"].delete(("u3", 3))
    tables["state"].put(("u4", 4), 40)
    checkpoint_version(storage, 2, tables)
    old = read_state(storage, 1, key_names=["name", "id"])
    new = read_state(storage, key_names=["name", "id"], with_key_group=True)
    assert len(old) == 10 and len(new) == 9
    assert list(new.columns) == ["key_group", "name", "id", "state"]
    assert dict(zip(new["name"], new["state"]))["u4"] == 40
    assert all(tables["state"].key_group((n, i)) == g for g, n, i in zip(new["key_group"], new["name"], new["id"]))


def test_read_state_of_an_unknown_table_names_the_tables(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put(1, 1)
    checkpoint_version(storage, 1, tables)
    with pytest.raises(ValueError, match="timers"):
        read_state(storage, table="nope")
