"""Fixtures of the operator-layer tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from buffering import OperatorInstance


@pytest.fixture(autouse=True)
def close_operator_instances(monkeypatch) -> Iterator[None]:
    """Close every operator instance a test created once it is done, closed or not.

    Tests drop runners on purpose (crashes) or never get one back (a restore that
    raises); each instance holds a RocksDB working copy in a temp directory that
    only ``close()`` removes. Closing is what the test did not do, after it has
    finished, so it cannot change what the test saw.
    """
    created: list[OperatorInstance] = []
    original = OperatorInstance.__init__

    def tracking_init(self, *args, **kwargs):
        created.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(OperatorInstance, "__init__", tracking_init)
    yield
    for instance in created:
        try:
            instance.close()
        except Exception:  # noqa: BLE001 - already closed, or never fully opened
            pass
