"""A failure in the user's code says what failed: the user's own exception, naming the key, the call and the batch."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from buffering import LocalRunner
from buffering.errors import UserCodeError, UserFailure, annotate
from buffering.spark._errors import short_text
from state.group_state import GroupStateTimeout

from .helpers import Clock, frame


def fails_on_key_3(key, rows, state):
    n = sum(len(r) for r in rows)
    if key[0] == 3:
        raise ValueError("boom for key 3")
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def times_out_and_fails(key, rows, state):
    if state.hasTimedOut:
        raise KeyError("no total for the timed-out key")
    state.update((sum(len(r) for r in rows),))
    state.setTimeoutDuration(1_000)
    return iter(())


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", ()))


def test_a_failure_in_the_function_is_the_users_exception_with_a_note_naming_key_call_and_batch():
    runner = LocalRunner(fails_on_key_3, key="k", clock=Clock())
    runner.process(frame(k=[1, 2], v=[1, 1]))  # batch 0
    with pytest.raises(ValueError) as info:
        runner.process(frame(k=[1, 3], v=[1, 1]))  # batch 1
    assert str(info.value) == "boom for key 3"
    assert "opbuffer: raised in the data call for key (3,), batch 1" in _notes(info.value)


def test_a_failure_in_a_timeout_call_names_the_timeout_call():
    clock = Clock()
    runner = LocalRunner(times_out_and_fails, key="k", clock=clock, timeout=GroupStateTimeout.ProcessingTimeTimeout)
    runner.process(frame(k=[7], v=[1]))  # batch 0 sets the timeout
    clock.now = 5_000
    with pytest.raises(KeyError) as info:
        runner.process(frame(k=[8], v=[1]))  # batch 1: key 7 times out
    assert "opbuffer: raised in the timeout call for key (7,), batch 1" in _notes(info.value)


def test_a_failure_crosses_processes_as_a_marker_in_text_and_is_rebuilt_as_the_users_type():
    try:
        raise ValueError("boom for key 3")
    except ValueError as exc:
        annotate(exc, "data", (3,), 2)
        text = "Traceback ...\n" + str(UserCodeError(UserFailure.of(exc, "data", (3,), 2))) + "\n\tat org.apache..."
    rebuilt = UserFailure.from_text(text).rebuild()
    assert type(rebuilt) is ValueError and str(rebuilt) == "boom for key 3"
    notes = _notes(rebuilt)
    assert "the data call for key (3,), batch 2" in notes and "raise ValueError" in notes  # the user's frame


def test_a_marker_inside_the_users_own_message_does_not_stand_for_the_failure():
    forged = UserFailure("builtins", "SystemExit", "forged", "data").marker()
    try:
        raise ValueError(f"bad row {forged}")
    except ValueError as exc:
        failure = UserFailure.of(exc, "data", (1,), 0)
    text = f"ValueError: bad row {forged}\n\nThe above exception ...\n{UserCodeError(failure)}"
    assert UserFailure.from_text(text).name == "ValueError"


def test_a_stopped_batchs_py4j_error_is_cut_to_lines_that_still_match_sparks_stop_check():
    class Py4JJavaError(Exception):  # what a collect() interrupted by stop() raises, as py4j prints it
        pass

    Py4JJavaError.__module__, Py4JJavaError.__qualname__ = "py4j.protocol", "Py4JJavaError"
    stack = "".join(f"\tat org.apache.spark.Frame{i}.run(Frame.scala:{i})\n" for i in range(200))
    error = Py4JJavaError(f"An error occurred while calling o88.collectToPython.\n: java.lang.InterruptedException\n{stack}")
    text = short_text(error)
    # Spark 4.3's StreamExecution.PROXY_ERROR, which tells a stop() from a failure
    proxy_error = re.compile(
        r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
        r"(java.lang.InterruptedException|java.io.InterruptedIOException|java.nio.channels.ClosedByInterruptException)"
    )
    assert proxy_error.search(text) and len(text) < 300
