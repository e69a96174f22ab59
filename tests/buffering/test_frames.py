"""Per-key frames: row_slices equals iloc + reset_index; concat_frames and FrameCollector equal pd.concat."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from buffering import frames as frames_module
from buffering.frames import FrameCollector, concat_frames, row_slices


def _reference(frames):
    return pd.concat(frames, ignore_index=True)


def _one_row(key, views, name):
    return pd.DataFrame({"tweet": [key], "views": [views], "name": [name]})


def test_many_alike_one_row_frames_equal_pd_concat():
    frames = [_one_row(k, k * 1.5, f"t{k}") for k in range(50)]
    pd.testing.assert_frame_equal(concat_frames(frames), _reference(frames))


def test_frames_of_several_rows_keep_their_row_order():
    frames = [pd.DataFrame({"a": np.arange(i, i + 3), "b": [True, False, True]}) for i in range(0, 30, 3)]
    pd.testing.assert_frame_equal(concat_frames(frames), _reference(frames))


@pytest.mark.parametrize(
    "second",
    [
        pd.DataFrame({"tweet": [2], "views": [3], "name": ["x"]}),  # int views where the first has float: upcast
        pd.DataFrame({"tweet": [True], "views": [1.0], "name": ["x"]}),  # bool and int: object, not int
        pd.DataFrame({"views": [1.0], "tweet": [2], "name": ["x"]}),  # other column order
        pd.DataFrame({"tweet": [2], "views": [1.0]}),  # a column missing
        pd.DataFrame({"tweet": [2], "views": [1.0], "name": ["x"], "extra": [0]}),  # a column more
        pd.DataFrame({"tweet": [2], "views": [1.0], "name": pd.array(["x"], dtype="string")}),  # extension dtype
        pd.DataFrame({"tweet": pd.array([2], dtype="Int64"), "views": [1.0], "name": ["x"]}),
        pd.DataFrame({"tweet": np.array([2], dtype=np.int32), "views": [1.0], "name": ["x"]}),
        pd.DataFrame(columns=["tweet", "views", "name"]),  # empty, object columns
    ],
    ids=["int-vs-float", "bool-vs-int", "column-order", "missing", "extra", "string", "Int64", "int32", "empty"],
)
@pytest.mark.filterwarnings("ignore:The behavior of DataFrame concatenation with empty:FutureWarning")
def test_frames_that_differ_give_what_pd_concat_gives(second):
    frames = [_one_row(1, 1.5, "a"), second, _one_row(3, 2.5, "c")]
    pd.testing.assert_frame_equal(concat_frames(frames), _reference(frames))


def _inserted_column_frame():
    frame = pd.DataFrame({"tweet": [7], "views": [2.0]})
    frame["name"] = ["late"]  # its own block
    frame["extra_int"] = [1]
    return frame.drop(columns=["extra_int"])


def _reordered_frame():
    return pd.DataFrame({"name": ["r"], "views": [3.0], "tweet": [9]})[["tweet", "views", "name"]]


@pytest.mark.parametrize("make", [_inserted_column_frame, _reordered_frame], ids=["inserted", "reordered"])
def test_frames_with_another_block_layout_equal_pd_concat(make):
    frames = [_one_row(1, 1.5, "a"), make(), _one_row(3, 2.5, "c"), make()]
    pd.testing.assert_frame_equal(concat_frames(frames), _reference(frames))


def test_several_columns_of_one_dtype_keep_their_labels():
    frames = [pd.DataFrame({"b": [i], "a": [i * 10], "c": [float(i)], "d": [i * 100]}) for i in range(20)]
    pd.testing.assert_frame_equal(concat_frames(frames), _reference(frames))


def test_datetime_columns_go_the_pd_concat_way():
    frames = [pd.DataFrame({"t": pd.to_datetime([i], unit="s"), "v": [i]}) for i in range(5)]
    pd.testing.assert_frame_equal(concat_frames(frames), _reference(frames))


def test_one_frame_gets_a_fresh_range_index():
    frame = pd.DataFrame({"a": [1, 2]}, index=[7, 9])
    pd.testing.assert_frame_equal(concat_frames([frame]), _reference([frame]))


def test_no_frames_give_an_empty_frame():
    assert concat_frames([]).empty


# ---------------------------------------------------------------- row_slices
def _mixed(n: int = 9) -> pd.DataFrame:
    return pd.DataFrame({
        "i": np.arange(n, dtype=np.int64),
        "f": np.arange(n) * 0.5,
        "o": [f"s{i}" for i in range(n)],
        "b": np.arange(n) % 2 == 0,
        "t": pd.date_range("2024-01-01", periods=n, freq="s", tz="Europe/Paris"),
        "c": pd.Categorical(np.array(list("xyz"))[np.arange(n) % 3]),
        "n": pd.array([None if i % 4 == 0 else i for i in range(n)], dtype="Int64"),
        "j": np.arange(n, dtype=np.int64) * 3,
    }, index=np.arange(n) + 100)


BOUNDS = [(0, 2), (2, 3), (3, 7), (7, 9)]


def _expected_slices(frame):
    return [frame.iloc[start:stop].reset_index(drop=True) for start, stop in BOUNDS]


@pytest.mark.parametrize(
    "frame",
    [_mixed(), _mixed()[["i", "j"]], _mixed()[["o"]], _mixed()[["t", "c"]]],
    ids=["every-dtype", "one-block", "objects", "extension-blocks"],
)
def test_row_slices_equal_iloc_and_reset_index(frame):
    got = list(row_slices(frame, [b[0] for b in BOUNDS], [b[1] for b in BOUNDS]))
    for slice_, expected in zip(got, _expected_slices(frame), strict=True):
        pd.testing.assert_frame_equal(slice_, expected, check_index_type=True)
        assert isinstance(slice_.index, pd.RangeIndex) and slice_.index.start == 0


def test_row_slices_are_made_one_at_a_time():
    made = row_slices(_mixed(), [0, 2], [2, 9])
    assert not isinstance(made, (list, tuple))
    assert len(next(made)) == 2 and len(next(made)) == 7


def test_a_name_given_to_one_slices_index_leaves_the_others_as_they_are():
    first, second = row_slices(_mixed(), [0, 2], [2, 9])
    first.index.name = "mine"
    assert second.index.name is None


def test_a_frame_with_attrs_is_sliced_the_public_way_and_keeps_them():
    frame = _mixed()
    frame.attrs["source"] = "test"
    got = list(row_slices(frame, [b[0] for b in BOUNDS], [b[1] for b in BOUNDS]))
    for slice_, expected in zip(got, _expected_slices(frame), strict=True):
        pd.testing.assert_frame_equal(slice_, expected)
        assert slice_.attrs == {"source": "test"}


def test_row_slices_take_the_public_way_when_the_internals_fail_the_probe(monkeypatch):
    monkeypatch.setattr(frames_module, "_BLOCK_SLICES_WORK", False)
    monkeypatch.setattr(frames_module, "_block_slicer", lambda frame: pytest.fail("the block way was taken"))
    frame = _mixed()
    got = list(row_slices(frame, [b[0] for b in BOUNDS], [b[1] for b in BOUNDS]))
    for slice_, expected in zip(got, _expected_slices(frame), strict=True):
        pd.testing.assert_frame_equal(slice_, expected)


def test_this_pandas_passes_the_block_slices_probe():
    assert frames_module._probe_block_slices()


# ---------------------------------------------------------------- FrameCollector
def _collected(calls):
    collector = FrameCollector()
    for frames in calls:
        collector.add(frames)
    return collector.frames()


def test_collected_frames_of_one_layout_come_back_as_one_frame_equal_to_pd_concat():
    calls = [[_one_row(k, k * 1.5, f"t{k}")] for k in range(40)]
    got = _collected(calls)
    assert len(got) == 1
    pd.testing.assert_frame_equal(got[0], _reference([f for c in calls for f in c]))


@pytest.mark.filterwarnings("ignore:The behavior of DataFrame concatenation with empty:FutureWarning")
def test_collected_frames_of_mixed_layouts_join_to_what_pd_concat_gives():
    odd = [
        pd.DataFrame({"tweet": [2], "views": [3], "name": ["x"]}),
        pd.DataFrame({"views": [1.0], "tweet": [2], "name": ["x"]}),
        pd.DataFrame({"tweet": [2], "views": [1.0], "name": pd.array(["x"], dtype="string")}),
        pd.DataFrame({"t": pd.to_datetime([1], unit="s"), "v": [1]}),
        pd.DataFrame(columns=["tweet", "views", "name"]),
    ]
    calls = []
    for i in range(60):
        frames = [_one_row(i, i * 0.5, f"t{i}")]
        if i % 10 == 3:
            frames.append(odd[(i // 10) % len(odd)])
        calls.append(frames)
    every = [f for c in calls for f in c]
    pd.testing.assert_frame_equal(concat_frames(_collected(calls)), _reference(every))


def test_frames_with_duplicate_labels_are_kept_as_they_came():
    twice = [pd.DataFrame([[1, 2]], columns=["a", "a"]), pd.DataFrame([[3, 4]], columns=["a", "a"])]
    got = _collected([twice])
    assert len(got) == 2 and got[0] is twice[0] and got[1] is twice[1]


def test_a_run_of_one_frame_is_kept_as_it_came():
    only = _one_row(1, 1.5, "a")
    assert _collected([[only]])[0] is only


def test_nothing_collected_gives_no_frames():
    assert _collected([]) == [] and _collected([[], []]) == []
