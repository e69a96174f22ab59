"""Word count: a tiny opbuffer operator, runnable as a LocalRunner job or in applyInPandasWithState.

The function has the shape ``groupBy("word").applyInPandasWithState`` takes.
``mini_batch`` buffers incoming words and pre-counts them (one partial per
word instead of one row per occurrence), and calls the function once per
word when 10,000 rows are buffered or the oldest is a second old;
``cached_state`` keeps the running counts behind a bounded write-back cache.

Run it locally::

    python examples/word_count.py

Its unit test is ``examples/test_word_count_example.py``. Under Spark the same
function is used unchanged::

    lines_df.select(F.explode(F.split(F.lower("line"), r"\\W+")).alias("word")).where("word != ''") \
        .groupBy("word").applyInPandasWithState(
            word_count, "word string, count long", "count long", "update", "NoTimeout")
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pandas as pd

import buffering
from buffering import Count

_WORD = re.compile(r"\w+")


@buffering.mini_batch(max_rows=10_000, max_delay_ms=1_000, combine={"count": Count()})
@buffering.cached_state(max_entries=100_000)
def word_count(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """The running count of one word; ``rows`` hold pre-counted occurrences (column ``count``)."""
    (total,) = state.get if state.exists else (0,)
    for counted in rows:
        total += int(counted["count"].sum())
    state.update((total,))
    yield pd.DataFrame({"word": [key[0]], "count": [total]})


def words(lines: list[str]) -> pd.DataFrame:
    """One row per lower-cased word of ``lines`` (the input of ``word_count``)."""
    return pd.DataFrame({"word": [w for line in lines for w in _WORD.findall(line.lower())]}, dtype=object)


def main() -> None:
    runner = buffering.LocalRunner(word_count, key="word")
    runner.process(words(["the quick brown fox", "jumps over the lazy dog"]))
    runner.process(words(["The dog sleeps"]))
    out = runner.advance_time(1_000)  # the oldest buffered word is now a second old: the buffer flushes
    print(out.sort_values(["count", "word"], ascending=[False, True]).to_string(index=False))
    runner.close()


if __name__ == "__main__":
    main()
