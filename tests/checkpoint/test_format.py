"""The task file format: records, sections, index and footer."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoint import CheckpointCorruptError
from checkpoint.format import (
    DELTA,
    RECORDS,
    SNAPSHOT,
    Block,
    TaskFileWriter,
    checksum,
    decode_records,
    decode_section,
    encode_records,
    encode_section,
    read_task_file_index,
)

from .helpers import hsettings


@hsettings(max_examples=50)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=20), st.none() | st.binary(max_size=50)), max_size=30))
def test_records_round_trip_keeps_values_and_tombstones(pairs):
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    assert decode_records(encode_records(keys, values)) == (keys, values)


@hsettings(max_examples=50)
@given(st.integers(0, 12), st.integers(0, 40), st.integers(0, 30), st.booleans())
def test_records_of_one_length_round_trip_from_bytes_and_views(key_width, value_width, n, tombstones):
    # one key (value) length takes the numpy path: trailing zero bytes must survive, views must work
    keys = [bytes([i % 3, 0] * key_width)[:key_width] for i in range(n)]
    values = [None if tombstones and i % 4 == 1 else bytes([7, 0] * value_width)[:value_width] for i in range(n)]
    payload = encode_records(keys, values)
    for data in (payload, memoryview(b"??" + payload)[2:]):
        decoded = decode_records(data)
        assert decoded == (keys, values)
        assert all(type(k) is bytes for k in decoded[0])
    if n:
        with pytest.raises(CheckpointCorruptError):
            decode_records(payload[:-1] if value_width or key_width else payload + b"x")


def test_section_round_trip_keeps_every_table_block():
    blocks = [Block("state", RECORDS, encode_records([b"\x00\x05a"], [b"1"])),
              Block("timers", RECORDS, encode_records([b"\x00\x05b"], [None]))]
    data = encode_section(5, DELTA, blocks)
    decoded = decode_section(data, file="f", key_group=5, kind=DELTA)
    assert [(b.table, b.encoding, bytes(b.payload)) for b in decoded] == [
        (b.table, b.encoding, b.payload) for b in blocks
    ]


def test_section_of_another_key_group_is_rejected():
    data = encode_section(5, SNAPSHOT, [])
    with pytest.raises(CheckpointCorruptError, match="key group 6"):
        decode_section(data, file="f", key_group=6, kind=SNAPSHOT)


def _task_file(sections):
    stream = io.BytesIO()
    writer = TaskFileWriter(stream, {"version": 3})
    entries = [writer.add_section(g, kind, data) for g, kind, data in sections]
    size = writer.finish()
    return stream.getvalue(), entries, size


def test_task_file_index_lists_sections_with_offsets_and_checksums():
    sections = [(1, SNAPSHOT, encode_section(1, SNAPSHOT, [])), (2, DELTA, encode_section(2, DELTA, []))]
    blob, entries, size = _task_file(sections)
    assert size == len(blob)
    header, index = read_task_file_index(lambda o, n: blob[o : o + n], len(blob), file="x")
    assert header == {"version": 3}
    assert index == entries
    for entry, (_, _, data) in zip(index, sections):
        assert blob[entry.offset : entry.offset + entry.length] == data
        assert entry.checksum == checksum(data)


def test_truncated_task_file_fails_its_footer_check():
    blob, _, _ = _task_file([(1, SNAPSHOT, encode_section(1, SNAPSHOT, []))])
    cut = blob[:-5]
    with pytest.raises(CheckpointCorruptError, match="'x'"):
        read_task_file_index(lambda o, n: cut[o : o + n], len(cut), file="x")
