"""Unit tests of the word-count example, run with LocalRunner and an injected clock (no Spark needed).

    pytest examples/test_word_count_example.py
"""

from __future__ import annotations

import pandas as pd

from buffering import LocalRunner
from state.group_state import GroupState
from word_count import word_count, words


class Clock:
    """Processing time in ms that the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def counts(out: pd.DataFrame) -> dict[str, int]:
    return dict(zip(out["word"], out["count"]))


def test_words_are_counted_across_micro_batches_once_the_buffer_flushes():
    runner = LocalRunner(word_count, key="word", clock=Clock())
    assert runner.process(words(["the quick fox", "the lazy dog"])).empty  # buffered: no trigger yet
    assert runner.process(words(["The dog"])).empty
    out = runner.advance_time(1_000)  # max_delay_ms: the oldest word is a second old
    assert counts(out) == {"the": 3, "quick": 1, "fox": 1, "lazy": 1, "dog": 2}


def test_the_count_trigger_flushes_without_waiting():
    runner = LocalRunner(word_count, key="word", clock=Clock())
    out = runner.process(words(["spam"] * 10_000))
    assert counts(out) == {"spam": 10_000}


def test_counts_survive_a_restart_from_the_checkpoint(tmp_path):
    clock = Clock()
    first = LocalRunner(word_count, key="word", clock=clock, checkpoint_location=tmp_path / "ckpt")
    first.process(words(["to be or not to be"]))
    first.close()  # the buffered words are part of the checkpoint
    second = LocalRunner(word_count, key="word", clock=clock, checkpoint_location=tmp_path / "ckpt")
    second.process(words(["to be"]))
    clock.now = 1_000
    out = second.advance_time(0)
    assert counts(out) == {"to": 3, "be": 3, "or": 1, "not": 1}


def test_the_function_runs_as_applyInPandasWithState_calls_it():
    state = GroupState((2,), batch_processing_time_ms=0)
    out = pd.concat(list(word_count(("dog",), iter([words(["dog dog", "dog"])]), state)))
    assert counts(out) == {"dog": 5}
    assert state.get == (5,)
