"""state.raw: the byte helpers of raw keys (a 2-byte big-endian key group, then the encoded key)."""

from __future__ import annotations

import numpy as np
import pytest

from state.raw import fixed_width_cuts, key_group_of_raw, key_groups_of_raw


def test_key_groups_of_raw_equal_key_group_of_raw_of_each_key_whatever_its_width():
    keys = [b"\x00\x00\x01", b"\x7f\xff\x01abc", b"\x01\x00\x01" + bytes(8), b"\x00\xff\x01\x00\x00"]
    assert key_groups_of_raw(keys).tolist() == [key_group_of_raw(k) for k in keys]
    assert key_groups_of_raw([]).tolist() == []


def test_key_groups_of_raw_refuses_a_key_shorter_than_the_prefix():
    with pytest.raises(ValueError, match="shorter"):
        key_groups_of_raw([b"\x00\x01\x01", b"\x00"])


def test_fixed_width_cuts_keep_trailing_zero_bytes_and_start_at_the_offset():
    keys = [b"\x00\x01\x01" + (0).to_bytes(8, "big"), b"\x00\x02\x01" + (256).to_bytes(8, "big")]
    assert fixed_width_cuts(b"head" + b"".join(keys), 11, 2, offset=4) == keys


def test_fixed_width_cuts_split_a_structured_array_into_its_records_bytes():
    records = np.zeros(3, dtype=[("kg", ">u2"), ("key", ">i8")])
    records["key"] = [1, 2, 3]
    assert fixed_width_cuts(records, records.dtype.itemsize, 3) == [r.tobytes() for r in records]
