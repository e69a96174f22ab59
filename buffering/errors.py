"""A failure of the user's code, as every runner reports it: the user's exception, naming the key, the call and the batch.

Where opbuffer calls the user's function or ``StatefulProcessor`` (the calls of :data:`CALLS`), an
exception is annotated once (:func:`annotate`), in the except branch only, so the hot path pays
nothing: a note (``add_note``) names the key as the user sees it, the call and the batch, and a
:class:`UserFailure` rides on the exception. LocalRunner raises the user's exception itself; a Spark
task re-raises it as :class:`UserCodeError` (the user's exception its ``__cause__``), whose message
carries a marker (:meth:`UserFailure.marker`) that the driver finds in whatever text Spark makes of
the task's failure (:meth:`UserFailure.from_text`) and rebuilds the user's exception from
(:meth:`UserFailure.rebuild`).

The marker is JSON (zlib-compressed, base64): nothing read from an error text is unpickled, so a
crafted exception message can at most mislead a report, never run code on the driver. The user's
exception type is looked up among the modules the reading process has imported (never imported
because a text names it).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import sys
import traceback
import zlib
from dataclasses import dataclass
from typing import Any, Optional

#: The calls of the user's code opbuffer makes (a function's rows and timeouts; a processor's
#: handleInputRows, handleExpiredTimer, handleInitialState, init and close).
CALLS = ("data", "timeout", "timer", "initial state", "init", "close")

_ATTRIBUTE = "_opbuffer_failure"
_PREFIX = "[opbuffer-failure:"
_MARKER = re.compile(r"\[opbuffer-failure:([A-Za-z0-9_=-]+)\]")
#: Keep a task's marker to about this much text (the user's message and frames are cut to fit).
_TASK_LIMIT = 8_000
#: The user's traceback frames are kept to this many, the innermost.
_FRAMES = 30
#: Sources of opbuffer itself (its frames are not the user's).
_OWN_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
    for name in ("buffering", "state", "checkpoint")
)
_NO_KEY = object()


def _one_line(text: str, limit: int) -> str:
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_args(args: tuple) -> Optional[list]:
    """The exception's args when each is a plain JSON value (so the driver can call the type with them)."""
    if all(a is None or isinstance(a, (str, int, float, bool)) for a in args):
        if sum(len(a) for a in args if isinstance(a, str)) <= _TASK_LIMIT // 2:
            return list(args)
    return None


def user_frames(exc: BaseException) -> str:
    """The frames of ``exc``'s traceback in the user's code (not opbuffer's), as ``traceback`` prints them."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.startswith(_OWN_DIRS)]
    chosen = (own or frames[-1:])[-_FRAMES:]
    return "".join(traceback.format_list(chosen))


@dataclass(frozen=True)
class UserFailure:
    """What the user's code raised, and where: enough to report it, and to rebuild it in another process."""

    #: The exception's type: its module and qualified name.
    module: str
    name: str
    #: ``str()`` of the exception (cut to fit a marker).
    message: str
    #: One of :data:`CALLS`.
    call: str
    #: ``repr`` of the key as the user's code sees it (plain Python values); None: a call of no key (init, close).
    key: Optional[str] = None
    #: The batch (version) it ran in; None: not known where it was raised.
    batch: Optional[int] = None
    #: The user's frames of its traceback (:func:`user_frames`).
    frames: str = ""
    #: The exception's args when they are plain JSON values (None: rebuild from :attr:`message`).
    args: Optional[tuple] = None

    @classmethod
    def of(cls, exc: BaseException, call: str, key: Any = _NO_KEY, batch: Optional[int] = None) -> "UserFailure":
        """The failure ``exc`` is, raised in ``call`` for ``key`` (plain Python, as the user sees it)."""
        try:
            message = str(exc)
        except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
            message = f"<str() of the {type(exc).__name__} failed>"
        args = _json_args(exc.args) if isinstance(getattr(exc, "args", None), tuple) else None
        return cls(
            module=type(exc).__module__,
            name=type(exc).__qualname__,
            message=message[: _TASK_LIMIT // 2],
            call=call,
            key=None if key is _NO_KEY else _one_line(repr(key), 500),
            batch=batch,
            frames=user_frames(exc)[-_TASK_LIMIT // 2 :],
            args=None if args is None else tuple(args),
        )

    # ------------------------------------------------------------ words
    @property
    def type_name(self) -> str:
        """The exception's type as a traceback names it (``ValueError``, ``mypkg.errors.BadRow``)."""
        return self.name if self.module == "builtins" else f"{self.module}.{self.name}"

    def where(self) -> str:
        """``the data call for key (3,), batch 2``."""
        text = f"the {self.call} call"
        if self.key is not None:
            text += f" for key {self.key}"
        if self.batch is not None:
            text += f", batch {self.batch}"
        return text

    def note(self) -> str:
        """The note the user's exception gets: where opbuffer called the code that raised it."""
        return f"opbuffer: raised in {self.where()}"

    def summary(self, limit: int = 300) -> str:
        """One line: ``ValueError: boom (in the data call for key (3,), batch 2)``."""
        return f"{self.type_name}: {_one_line(self.message, limit)} (in {self.where()})"

    # ------------------------------------------------------------ crossing processes
    def shortened(self, message: int = 160, key: int = 100) -> "UserFailure":
        """Without the frames, the message and key cut: what fits a short error text."""
        args = self.args
        if args is not None and sum(len(a) for a in args if isinstance(a, str)) > message:
            args = None
        cut_key = None if self.key is None else _one_line(self.key, key)
        return dataclasses.replace(self, message=_one_line(self.message, message), key=cut_key, frames="", args=args)

    def marker(self) -> str:
        """``[opbuffer-failure:...]``: this failure, to be found in an error text (:meth:`from_text`)."""
        data = {
            "m": self.module, "n": self.name, "s": self.message, "c": self.call, "k": self.key, "b": self.batch,
            "f": self.frames, "a": None if self.args in (None, (self.message,)) else list(self.args),
        }
        raw = json.dumps({k: v for k, v in data.items() if v not in (None, "")}, separators=(",", ":")).encode()
        packed = zlib.compress(raw, 9)
        body = b"z" + packed if len(packed) < len(raw) else b"j" + raw
        return _PREFIX + base64.urlsafe_b64encode(body).decode("ascii") + "]"

    @classmethod
    def from_text(cls, text: str) -> Optional["UserFailure"]:
        """The failure of the last marker in ``text`` that decodes (None: there is none).

        The last: opbuffer's own message comes after the user's exception in a traceback's text.
        """
        for match in reversed(list(_MARKER.finditer(text))):
            failure = cls._decode(match.group(1))
            if failure is not None:
                return failure
        return None

    @classmethod
    def _decode(cls, body: str) -> Optional["UserFailure"]:
        try:
            raw = base64.urlsafe_b64decode(body.encode("ascii"))
            data = json.loads(zlib.decompress(raw[1:]) if raw[:1] == b"z" else raw[1:])
            batch = data.get("b")
            args = data.get("a")
            return cls(
                module=str(data["m"]),
                name=str(data["n"]),
                message=str(data.get("s", "")),
                call=str(data["c"]),
                key=None if data.get("k") is None else str(data["k"]),
                batch=None if batch is None else int(batch),
                frames=str(data.get("f", "")),
                args=tuple(args) if isinstance(args, list) else None,
            )
        except Exception:  # noqa: BLE001 - not a marker of ours after all
            return None

    def same_place(self, other: "UserFailure") -> bool:
        """Whether ``other`` is this failure (perhaps shortened): same type, call and batch."""
        return (self.module, self.name, self.call, self.batch) == (other.module, other.name, other.call, other.batch)

    def rebuild(self) -> BaseException:
        """The user's exception again: its type (if this process has its module) and message, with notes naming
        the key, the call and the batch and holding the user's frames; else a :class:`UserCodeError`."""
        exc: Optional[BaseException] = None
        cls = _loaded_type(self.module, self.name)
        if cls is not None:
            for args in ((self.args,) if self.args is not None else ()) + ((self.message,),):
                try:
                    candidate = cls(*args)
                    str(candidate)
                except Exception:  # noqa: BLE001 - a type whose constructor wants more: the fallback below
                    continue
                exc = candidate
                break
        if exc is None:
            exc = UserCodeError(self)
        else:
            add_note(exc, self.note())
        if self.frames:
            add_note(exc, "the user's code, where it raised (most recent call last):\n" + self.frames.rstrip("\n"))
        setattr(exc, _ATTRIBUTE, self)
        return exc


def _loaded_type(module: str, name: str) -> Optional[type]:
    """The exception type ``module.name`` if this process imported ``module`` (nothing is imported here)."""
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+); on 3.10 the note is kept in ``__notes__`` all the same."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


class UserCodeError(Exception):
    """The user's code failed in a Spark task (``__cause__``: its exception), or a rebuilt failure whose type
    this process lacks.

    The message names the exception's type, its message, the key, the call and the batch, and ends with
    the marker the driver reads the failure back from (:attr:`failure`).
    """

    def __init__(self, failure: UserFailure) -> None:
        super().__init__(f"{failure.summary()} {failure.marker()}")
        self.failure = failure

    def __reduce__(self) -> Any:
        return (type(self), (self.failure,))


def annotate(exc: BaseException, call: str, key: Any = _NO_KEY, batch: Optional[int] = None) -> None:
    """In the except branch around user calls: mark ``exc`` as raised in ``call`` for ``key`` (a note and its
    :class:`UserFailure`), once: the innermost call that saw it names it. The caller re-raises ``exc``."""
    if getattr(exc, _ATTRIBUTE, None) is not None:
        return
    try:
        failure = UserFailure.of(exc, call, key, batch)
        setattr(exc, _ATTRIBUTE, failure)
        add_note(exc, failure.note())
    except Exception:  # noqa: BLE001 - the user's exception goes on as it is
        pass


def failure_of(exc: BaseException) -> Optional[UserFailure]:
    """The :class:`UserFailure` :func:`annotate` gave ``exc`` (None: not a failure of user code)."""
    failure = getattr(exc, _ATTRIBUTE, None)
    return failure if isinstance(failure, UserFailure) else None


def task_error(exc: BaseException, batch: int) -> Optional[UserCodeError]:
    """What a Spark task raises for ``exc`` (from ``exc``): a :class:`UserCodeError` naming ``batch`` where the
    annotation did not; None when ``exc`` is no failure of user code."""
    failure = failure_of(exc)
    if failure is None:
        return None
    if failure.batch is None:
        failure = dataclasses.replace(failure, batch=batch)
    return UserCodeError(failure)
