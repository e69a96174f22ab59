"""Fixtures of the operator-layer tests."""

from __future__ import annotations

import weakref
from typing import Iterator

import pytest

from buffering import OperatorInstance


@pytest.fixture(autouse=True)
def close_operator_instances(monkeypatch) -> Iterator[None]:
    """Close every operator instance a test created and still holds once it is done.

    Tests keep runners they never close (a restore that raises, a crash kept for
    inspection); each instance holds a RocksDB working copy and the claim on its
    directory. The instances are held weakly: one the test dropped is released
    by its own finalizer, as a user's would be. Closing is what the test did
    not do, after it has finished, so it cannot change what the test saw.
    """
    created: "weakref.WeakSet[OperatorInstance]" = weakref.WeakSet()
    original = OperatorInstance.__init__

    def tracking_init(self, *args, **kwargs):
        created.add(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(OperatorInstance, "__init__", tracking_init)
    yield
    for instance in list(created):
        try:
            instance.close()
        except Exception:  # noqa: BLE001 - already closed, or never fully opened
            pass
