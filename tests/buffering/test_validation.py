"""Keys, key types and configuration are validated, with errors naming the offending value."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from buffering import LocalRunner, cached_state, mini_batch
from state import ClockPolicy, key_group
from state.keys import KeyTypeError

from .helpers import Clock


def count(key, rows, state):
    n = (state.get[0] if state.exists else 0) + sum(len(r) for r in rows)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


# ---------------------------------------------------------------- key types
def test_key_types_other_than_the_checkpoints_are_refused_on_restore(tmp_path):
    first = LocalRunner(count, key="k", key_types=["long"], checkpoint_location=tmp_path / "c", clock=Clock())
    first.process(pd.DataFrame({"k": [1, 2]}))
    first.close()
    with pytest.raises(ValueError, match=r"key_types \['long'\], not \['int'\]"):
        LocalRunner(count, key="k", key_types=["int"], checkpoint_location=tmp_path / "c", clock=Clock())


def test_the_checkpoints_key_types_are_taken_when_none_are_given(tmp_path):
    first = LocalRunner(count, key="k", key_types=["int"], checkpoint_location=tmp_path / "c", clock=Clock())
    first.process(pd.DataFrame({"k": [1, 2]}))
    first.close()
    again = LocalRunner(count, key="k", checkpoint_location=tmp_path / "c", clock=Clock())
    assert again.key_types == ("int",)


def test_key_types_are_not_inferred_from_an_empty_batch():
    runner = LocalRunner(count, key="k", clock=Clock())
    assert runner.process(pd.DataFrame({"k": pd.Series([], dtype=object)})).empty
    runner.process(pd.DataFrame({"k": [5]}))
    assert runner.key_types == ("long",)
    assert runner.get_state(5) == (1,)


@pytest.mark.parametrize("types", [["long", "string"], []], ids=["longer", "shorter"])
def test_key_types_of_another_length_than_the_key_fail_at_construction(types):
    with pytest.raises(ValueError, match=r"key_types .* for the 1 key column\(s\) \['k'\]"):
        LocalRunner(count, key="k", key_types=types)


@pytest.mark.parametrize("value", [10**9, -3], ids=["large", "negative"])
def test_an_int_in_a_string_key_column_is_refused_naming_value_column_and_type(value):
    runner = LocalRunner(count, key="k", key_types=["string"], clock=Clock())
    with pytest.raises(KeyTypeError, match=rf"key value {value} in key column 'k' \(int\) does not fit .*'string'"):
        runner.process(pd.DataFrame({"k": [value]}))


def test_a_value_outside_an_int_columns_range_is_refused():
    with pytest.raises(KeyTypeError, match=r"key value 4294967296 .*'int'"):
        key_group(2**32, 128, ["int"])


def test_a_string_in_a_long_key_column_is_refused():
    with pytest.raises(KeyTypeError, match=r"'abc' .*'long'"):
        key_group("abc", 128, ["long"])


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}], ids=["list", "dict"])
def test_a_list_or_dict_key_value_is_refused_naming_the_column_and_value(value):
    runner = LocalRunner(count, key=["k", "j"], clock=Clock(), key_types=["long", "string"])
    frame = pd.DataFrame({"k": [1, 2], "j": ["a", "b"]})
    frame["j"] = pd.Series(["a", value], dtype=object)
    with pytest.raises(TypeError, match=rf"key column 'j' holds a {type(value).__name__}"):
        runner.process(frame)


# ---------------------------------------------------------------- configuration
def test_nan_is_refused_for_max_delay_ms():
    with pytest.raises(ValueError, match="max_delay_ms .* nan"):
        mini_batch(max_delay_ms=float("nan"))


def test_nan_is_refused_for_watermark_delay_ms():
    with pytest.raises(ValueError, match="watermark_delay_ms .* nan"):
        LocalRunner(count, key="k", event_time="ts", watermark_delay_ms=float("nan"))


def test_a_watermark_delay_that_is_not_a_number_names_the_argument():
    with pytest.raises(TypeError, match="watermark_delay_ms must be a number of milliseconds, got str '5s'"):
        LocalRunner(count, key="k", event_time="ts", watermark_delay_ms="5s")


def test_an_empty_state_path_is_refused():
    with pytest.raises(ValueError, match="path must name a directory, got ''"):
        cached_state(store="rocksdb", path="")


def test_a_policy_instance_given_to_cached_state_is_refused():
    with pytest.raises(ValueError, match="pass the policy class or a factory"):
        cached_state(max_entries=10, policy=ClockPolicy())


def test_a_policy_class_given_to_cached_state_gives_each_instance_its_own(tmp_path):
    fn = cached_state(max_entries=10, policy=ClockPolicy)(count)
    runner = LocalRunner(fn, key="k", parallelism=2, clock=Clock())
    runner.process(pd.DataFrame({"k": list(range(40))}))
    first, second = runner.instances
    assert first.cache.policy is not second.cache.policy
    assert len(runner.state()) == 40


def test_a_tilde_in_a_state_path_means_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    fn = cached_state(store="rocksdb", path="~/state")(count)
    runner = LocalRunner(fn, key="k", clock=Clock())
    runner.process(pd.DataFrame({"k": [1]}))
    assert os.path.isdir(tmp_path / "state" / "instance-0-of-1")
    runner.close()


def test_a_tilde_in_a_checkpoint_location_means_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    runner = LocalRunner(count, key="k", checkpoint_location="~/ckpt", clock=Clock())
    runner.process(pd.DataFrame({"k": [1]}))
    runner.close()
    assert os.path.isdir(tmp_path / "ckpt" / "manifests")
    assert not os.path.exists(os.path.join(os.getcwd(), "~"))
