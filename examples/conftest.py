"""The examples' tests use the test suite's one ``spark`` fixture (tests/conftest.py).

A conftest only serves the tests below it, so the fixture is imported here.
When tests/ and examples/ run in one session, both see the same local
SparkSession: the fixture's ``getOrCreate()`` returns the one already running.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # `pytest examples` run from elsewhere: make the `tests` package importable
    sys.path.insert(0, _ROOT)

from tests.conftest import spark  # noqa: E402,F401  (re-exported fixture)
