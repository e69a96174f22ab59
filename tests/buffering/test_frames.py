"""concat_frames: the same frame as pd.concat(frames, ignore_index=True), whatever the frames."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from buffering.frames import concat_frames


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
