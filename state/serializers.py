"""Value serializers. Pickle protocol 5 by default, cloudpickle only where pickle cannot."""

from __future__ import annotations

import pickle
from typing import Any, Protocol, runtime_checkable

import cloudpickle


@runtime_checkable
class Serializer(Protocol):
    """Turns state values into bytes and back. ``loads(dumps(v)) == v`` must hold."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class PickleSerializer:
    """pickle protocol 5; falls back to cloudpickle for lambdas, local classes and the like.

    cloudpickle writes ordinary pickles, so one ``pickle.loads`` reads both.
    """

    __slots__ = ("protocol", "dumps", "loads")

    def __init__(self, protocol: int = 5) -> None:
        self.protocol = protocol
        self.loads = pickle.loads
        dumps = pickle.dumps
        fallback = cloudpickle.dumps

        def _dumps(value: Any, _dumps=dumps, _protocol=protocol) -> bytes:
            try:
                return _dumps(value, _protocol)
            except (pickle.PicklingError, AttributeError, TypeError):
                return fallback(value, _protocol)

        self.dumps = _dumps  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return f"PickleSerializer(protocol={self.protocol})"


DEFAULT_SERIALIZER = PickleSerializer()
