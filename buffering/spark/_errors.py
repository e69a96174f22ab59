"""The driver's side of a failed batch: the short error ``StreamRunner.__call__`` raises to Spark, and the
user's exception ``OpbufferQuery`` raises instead of Spark's.

Why short: Spark 4.3 decides whether a foreachBatch error came from ``stop()`` with a regular
expression (``StreamExecution.PROXY_ERROR``, ``py4j.protocol.Py4JJavaError: An error occurred while
calling((.|\\r\\n|\\r|\\n)*)(java.lang.InterruptedException|...)``) over the whole text Py4J makes of
the Python error, the traceback with every chained exception and the Java stack trace in it (about
8 kB for a batch stopped in its collect). Its alternation recurses once per character, and the
stream thread dies with a StackOverflowError. So the error raised to Spark chains nothing and holds
one line (a Py4J error keeps its first line and its Java cause's, which that expression and Spark's
check for a cancelled job group read); the full error goes to the driver's log.

A failure of the user's code reaches the driver as a task's :class:`~buffering.errors.UserCodeError`,
whose marker is somewhere in the Spark error's text: the runner records it (``runner.failure``, the
whole of it, with the user's frames) and raises a shortened one, whose marker is in the text Spark
reports in turn: the client of a Spark Connect session, where the runner ran in the server, reads
the failure from there.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterator, Optional

from ..errors import UserCodeError, UserFailure

logger = logging.getLogger("buffering.spark")

#: The first line of an error (and its cause's) is cut to this many characters.
_LINE = 300
#: What an error of a batch interrupted by ``stop()`` says (the Java exceptions Spark's check looks for).
_INTERRUPTED = re.compile(r"java\.lang\.InterruptedException|java\.io\.InterruptedIOException|ClosedByInterruptException")


class BatchError(RuntimeError):
    """A batch failed for a reason other than the user's code: one line of the error (see the driver's log for all of it)."""


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - e.g. a Py4JJavaError whose JVM is gone
        return ""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its cause or context, theirs, ... (each once)."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def failure_in(exc: BaseException) -> Optional[UserFailure]:
    """The user failure whose marker is in the text of ``exc`` or of an exception it chains (None: none)."""
    for link in _chain(exc):
        failure = UserFailure.from_text(_text(link))
        if failure is not None:
            return failure
    return None


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _cut(line: str) -> str:
    return line if len(line) <= _LINE else line[: _LINE - 3] + "..."


def _head(exc: BaseException) -> str:
    """``type: first line``, and for a Py4J error the line of its Java exception (``: java.lang....``)."""
    lines = _text(exc).strip("\n").splitlines() or [""]
    head = f"{_type_name(exc)}: {_cut(lines[0])}"
    if len(lines) > 1 and lines[1].startswith(": "):  # Py4JJavaError: "An error occurred while calling o1.x.\n: <Java>"
        head += "\n" + _cut(lines[1])
    return head


def _raised(exc: BaseException) -> Optional[str]:
    """The exception line of the last Python traceback in ``exc``'s text (a PythonException holds a task's)."""
    text = _text(exc)
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    for line in text[at:].splitlines()[1:]:
        if line and not line[0].isspace():
            return _cut(line)
    return None


def short_text(exc: BaseException) -> str:
    """A few lines of ``exc``: its type and first line, the exception of a Python traceback in it (a task's),
    and its cause's type and first line (each a line, cut)."""
    links = list(_chain(exc))
    text = _head(links[0])
    raised = _raised(links[0])
    if raised is not None:
        text += f"\n(raised: {raised})"
    if len(links) > 1:
        text += f"\n(caused by {_head(links[1])})"
    return text


def batch_error(runner: Any, exc: BaseException, version: int) -> Exception:
    """What ``StreamRunner.__call__`` raises to Spark (``from None``) when batch ``version`` failed with ``exc``.

    A failure of the user's code is recorded as ``runner.failure`` and raised as a short
    :class:`UserCodeError` (its marker without the frames); anything else as a :class:`BatchError` of a
    few lines. The full error is logged.
    """
    failure = failure_in(exc)
    if failure is not None:
        try:
            runner.failure = failure
        except Exception:  # noqa: BLE001 - a runner that takes no attributes still gets its short error
            pass
        logger.error("batch %d failed: %s", version, failure.summary(), exc_info=exc)
        return UserCodeError(failure.shortened())
    text = short_text(exc)
    if _INTERRUPTED.search(text):  # the query is stopping: no failure to report at length
        logger.info("batch %d interrupted: %s", version, text)
    else:
        logger.error("batch %d failed", version, exc_info=exc)
    return BatchError(f"opbuffer: batch {version} failed: {text}")


def user_exception(runner: Any, spark_error: Optional[BaseException]) -> Optional[BaseException]:
    """The user's exception behind Spark's ``spark_error`` (rebuilt, with notes naming the key, the call
    and the batch and holding the user's frames; its ``__context__`` is ``spark_error``), or None when the
    query failed otherwise.

    The failure is read from the text Spark reports (it holds the short error's marker); the runner's
    record of it (``runner.failure``, with the frames) is used when it is that failure: it is not in
    reach of a Spark Connect client, whose runner ran in the server.
    """
    if spark_error is None:
        return None
    failure = failure_in(spark_error)
    if failure is None:
        return None
    recorded = getattr(runner, "failure", None)
    if isinstance(recorded, UserFailure) and recorded.same_place(failure):
        failure = recorded
    exc = failure.rebuild()
    exc.__context__ = spark_error
    return exc
