"""Value serializers: pickle protocol 5, cloudpickle only where pickle cannot."""

from __future__ import annotations

import pickle
import threading

import pytest

from state import PickleSerializer, Serializer, WriteBackCache


def test_plain_values_are_protocol_5_pickles():
    data = PickleSerializer().dumps({"a": [1, 2.5, "x", b"y", None]})
    assert data[:2] == b"\x80\x05"
    assert pickle.loads(data) == {"a": [1, 2.5, "x", b"y", None]}


def test_a_lambda_round_trips():
    serializer = PickleSerializer()
    fn = serializer.loads(serializer.dumps(lambda x: x * 3))
    assert fn(4) == 12


def test_a_closure_round_trips():
    factor = 5

    def times(x):
        return x * factor

    serializer = PickleSerializer()
    assert serializer.loads(serializer.dumps(times))(2) == 10


def test_an_instance_of_a_local_class_round_trips():
    class Counter:
        def __init__(self, n):
            self.n = n

        def bump(self):
            self.n += 1
            return self.n

    serializer = PickleSerializer()
    restored = serializer.loads(serializer.dumps(Counter(41)))
    assert restored.bump() == 42


def test_cloudpickle_output_is_read_by_plain_pickle():
    serializer = PickleSerializer()
    assert pickle.loads(serializer.dumps(lambda: "hi"))() == "hi"


def test_an_unpicklable_value_raises():
    with pytest.raises(TypeError):
        PickleSerializer().dumps(threading.Lock())


def test_pickle_serializer_is_a_serializer():
    assert isinstance(PickleSerializer(), Serializer)


def test_local_values_survive_a_cache_over_rocksdb(make_backend):
    class Box:
        def __init__(self, fn):
            self.fn = fn

    cache = WriteBackCache(make_backend("rocksdb"), max_entries=1, write_batch_entries=1)
    cache.put("box", Box(lambda x: x + 1))
    cache.put("fn", lambda: "lambda")
    cache.put("other", 0)  # evicts both through the serializer
    cache.flush()
    assert cache.backend.get("box").fn(1) == 2
    assert cache.get("fn")() == "lambda"


def test_a_custom_serializer_is_used_by_the_store(make_backend, backend_kind):
    class Tagged:
        def __init__(self):
            self.dumped = 0

        def dumps(self, value):
            self.dumped += 1
            return b"T" + pickle.dumps(value)

        def loads(self, data):
            assert data[:1] == b"T"
            return pickle.loads(data[1:])

    serializer = Tagged()
    store = make_backend(backend_kind, serializer=serializer)
    store.put(1, {"v": 1})
    assert store.get(1) == {"v": 1}
    if backend_kind == "rocksdb":
        assert serializer.dumped == 1
        assert next(store.iter_raw())[1][:1] == b"T"
