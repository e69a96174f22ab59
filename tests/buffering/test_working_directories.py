"""Working directories: claimed before anything is deleted, removed when dropped, crash leftovers swept."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

import checkpoint.staging as staging
from buffering import LocalRunner, cached_state
from buffering.spark import _workers
from state import StoreLockedError
from state.locks import directory_lock

from .helpers import Clock


def count(key, rows, state):
    n = (state.get[0] if state.exists else 0) + sum(len(r) for r in rows)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def batch(*keys: int) -> pd.DataFrame:
    return pd.DataFrame({"k": list(keys)})


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ---------------------------------------------------------------- one path, one runner
def test_a_second_runner_on_the_same_path_is_refused_before_it_deletes_anything(tmp_path):
    fn = cached_state(store="rocksdb", path=str(tmp_path / "work"))(count)
    first = LocalRunner(fn, key="k", clock=Clock())
    first.process(batch(1, 1, 2))
    second = LocalRunner(fn, key="k", clock=Clock())
    with pytest.raises(StoreLockedError, match="instance-0-of-1"):
        second.process(batch(3))
    first.process(batch(1))
    assert first.get_state((1,)) == (3,) and first.get_state((2,)) == (1,)
    first.close()


def test_a_runner_in_another_process_is_refused_while_the_path_is_in_use(tmp_path):
    path = tmp_path / "work"
    fn = cached_state(store="rocksdb", path=str(path))(count)
    first = LocalRunner(fn, key="k", clock=Clock())
    first.process(batch(1, 2))
    script = textwrap.dedent(
        f"""
        import pandas as pd
        from buffering import LocalRunner, cached_state
        from state import StoreLockedError
        def count(key, rows, state):
            yield pd.DataFrame({{"k": [key[0]]}})
        runner = LocalRunner(cached_state(store="rocksdb", path={str(path)!r})(count), key="k")
        try:
            runner.process(pd.DataFrame({{"k": [9]}}))
        except StoreLockedError as exc:
            print("refused:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=os.getcwd(), timeout=120)
    assert "refused:" in done.stdout, done.stderr
    first.process(batch(1))
    assert first.get_state((1,)) == (2,) and first.get_state((2,)) == (1,)
    first.close()


def test_a_path_is_free_again_once_its_runner_is_closed(tmp_path):
    fn = cached_state(store="rocksdb", path=str(tmp_path / "work"))(count)
    first = LocalRunner(fn, key="k", clock=Clock())
    first.process(batch(1))
    first.close()
    second = LocalRunner(fn, key="k", clock=Clock())
    second.process(batch(1))
    second.close()


def test_a_runner_dropped_without_close_removes_its_temporary_store():
    runner = LocalRunner(cached_state(store="rocksdb")(count), key="k", clock=Clock())
    runner.process(batch(1, 2))
    temporary = os.path.dirname(runner.instances[0].workdir)
    assert os.path.isdir(temporary)
    del runner
    gc.collect()
    assert not os.path.exists(temporary)


def test_a_path_dropped_without_close_can_be_used_again(tmp_path):
    fn = cached_state(store="rocksdb", path=str(tmp_path / "work"))(count)
    runner = LocalRunner(fn, key="k", clock=Clock())
    runner.process(batch(1))
    del runner
    gc.collect()
    again = LocalRunner(fn, key="k", clock=Clock())
    again.process(batch(1))
    again.close()


# ---------------------------------------------------------------- leftovers of crashed processes
def test_staging_directories_of_dead_processes_are_swept_when_an_instance_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "_last_sweep", float("-inf"))
    dead = os.path.join(staging.fast_temp_dir(), f"opbuffer-ckpt-{_dead_pid()}-test")
    os.makedirs(os.path.join(dead, "sub"))
    with open(os.path.join(dead, "sub", "000001.sst"), "wb") as f:
        f.write(b"x" * 1000)
    runner = LocalRunner(count, key="k", clock=Clock(), checkpoint_location=tmp_path / "ckpt")
    runner.process(batch(1))
    runner.close()
    assert not os.path.exists(dead)


def test_staging_directories_of_live_processes_are_kept():
    mine = staging.staging_dir("ckpt")
    try:
        assert mine not in staging.sweep_stale_staging(force=True)
        assert os.path.isdir(mine)
    finally:
        os.rmdir(mine)


def test_restore_staging_beside_a_store_is_swept_too(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "_last_sweep", float("-inf"))
    work = tmp_path / "work"
    dead = work / f".opbuffer-restore-{_dead_pid()}-test"
    dead.mkdir(parents=True)
    fn = cached_state(store="rocksdb", path=str(work))(count)
    runner = LocalRunner(fn, key="k", clock=Clock(), checkpoint_location=tmp_path / "ckpt")
    runner.process(batch(1))
    runner.close()
    assert not dead.exists()


def _stores(directory) -> set[str]:
    return {name for name in os.listdir(directory) if name.startswith("db-")}


def test_stores_of_crashed_spark_attempts_are_swept(tmp_path):
    (tmp_path / "db-crashed").mkdir()
    (tmp_path / "db-current").mkdir()
    assert _workers.sweep_stores(str(tmp_path), keep="db-current") == ["db-crashed"]
    assert _stores(tmp_path) == {"db-current"}


def test_a_store_an_attempt_still_holds_is_not_swept(tmp_path):
    (tmp_path / "db-straggler").mkdir()
    claim = directory_lock(str(tmp_path / "db-straggler"))
    claim.acquire()
    try:
        assert _workers.sweep_stores(str(tmp_path), keep="db-other") == []
        assert _stores(tmp_path) == {"db-straggler"}
    finally:
        claim.release()


def test_the_store_the_ownership_record_names_is_not_swept(tmp_path):
    (tmp_path / "db-handed-over").mkdir()
    with open(tmp_path / _workers.OWNER_FILE, "w") as f:
        json.dump({"version": 3, "token": "t", "db": "db-handed-over", "pid": 1}, f)
    assert _workers.sweep_stores(str(tmp_path), keep="db-other") == []
    assert _stores(tmp_path) == {"db-handed-over"}


def test_ownership_temp_files_of_dead_processes_are_swept(tmp_path):
    pid = _dead_pid()
    (tmp_path / f".owner-{pid}-abc").write_text("{}")
    (tmp_path / f".claimed-{pid}-abc").write_text("{}")
    (tmp_path / f".owner-{os.getpid()}-abc").write_text("{}")
    _workers.sweep_stores(str(tmp_path), keep="")
    assert sorted(os.listdir(tmp_path)) == [f".owner-{os.getpid()}-abc"]

