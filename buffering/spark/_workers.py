"""Operator instances kept warm across micro-batches by a Spark Python worker, and handed between workers.

Workers are reused across micro-batches, so a worker keeps its operator
instances (``_LIVE``) and reuses one when it already holds exactly the
version a task must start from; anything else is rebuilt from the checkpoint.
That is the whole exactly-once argument: a task of batch N always starts from
the committed version before N.

The worker processes of one machine share each instance's directory
(:func:`state_dir`). A task that checkpointed hands its working RocksDB over
by writing an ownership record (``OWNER_FILE``: the version the store holds
and a token); the next task of that instance claims the record and resumes
its own suspended instance (warm cache), adopts the store another worker left
(cold cache), or restores from the checkpoint. Stores nobody holds or names
are swept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from checkpoint import CheckpointCorruptError, CheckpointStorage, Manifest
from state.base import StoreLockedError
from state.cache import shared_manager
from state.locks import FileLock, directory_lock, process_alive

from ..operator import OperatorInstance

if TYPE_CHECKING:
    from ._task import BatchContext, TaskPlan

#: How a task got its instance (``BatchMetrics.per_instance[i]["start"]``).
RESUMED = "resumed"  # this process held it since the previous batch: warm cache
ADOPTED = "adopted"  # the working store another Python worker of this machine left: cold cache
RESTORED = "restored"  # rebuilt from the checkpoint (the executor held no current copy)
NEW = "new"  # no committed version yet: nothing to restore

#: The ownership record of an instance directory: which store holds which version, handed over.
OWNER_FILE = "OWNER.json"

#: An instance of this process: (location, query id, index, parallelism).
_Key = tuple[str, str, int, int]


@dataclass
class _Live:
    instance: OperatorInstance
    #: The token of the ownership record it released (None while a task runs on it).
    token: Optional[str]


_LIVE: dict[_Key, _Live] = {}
_MANIFESTS: dict[tuple[str, int, Optional[bytes]], Manifest] = {}


def _key(plan: TaskPlan, index: int) -> _Key:
    return (plan.location, plan.query_id, index, plan.parallelism)


def manifest(plan: TaskPlan, storage: CheckpointStorage, version: int) -> Manifest:
    """Committed manifest ``version``, read once per worker process (the tasks of a batch share it)."""
    key = (plan.location, version, plan.checkpoint_key)  # a manifest verified with one key is not with another
    cached = _MANIFESTS.get(key)
    if cached is None:
        cached = _MANIFESTS[key] = storage.read_manifest(version)
        if len(_MANIFESTS) > 16:
            _MANIFESTS.pop(next(iter(_MANIFESTS)))
    return cached


def state_dir(plan: TaskPlan, index: int) -> str:
    """The executor-local directory of instance ``index``: shared by the worker processes of one machine."""
    base = plan.workdir or os.path.join(tempfile.gettempdir(), "opbuffer-state")
    return os.path.join(base, plan.query_id, f"i{index}of{plan.parallelism}")


def _claim(directory: str) -> Optional[dict[str, Any]]:
    """Take the directory's ownership record (atomically: one claimer wins), or None."""
    claimed = os.path.join(directory, f".claimed-{os.getpid()}-{uuid.uuid4().hex}")
    try:
        os.rename(os.path.join(directory, OWNER_FILE), claimed)
    except FileNotFoundError:
        return None
    try:
        with open(claimed) as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return None
    finally:
        with contextlib.suppress(OSError):
            os.remove(claimed)


def _release(directory: str, version: int, token: str, db: str) -> None:
    """Record that ``db`` holds exactly ``version`` and is closed: the next task may take it over."""
    tmp = os.path.join(directory, f".owner-{os.getpid()}-{uuid.uuid4().hex}")
    with open(tmp, "w") as f:
        json.dump({"version": version, "token": token, "db": db, "pid": os.getpid()}, f)
    os.replace(tmp, os.path.join(directory, OWNER_FILE))


def _discard(key: _Key) -> None:
    """Forget this process's instance without flushing: it may hold a failed attempt's changes.

    What it released last (a suspended store named by OWNER.json) is on disk
    already; anything after that must not reach the store.
    """
    live = _LIVE.pop(key, None)
    if live is not None:
        with contextlib.suppress(Exception):
            live.instance.discard()


def holds_instances() -> bool:
    """Whether this process holds an operator instance (running or suspended)."""
    return bool(_LIVE)


def discard(plan: TaskPlan, index: int) -> None:
    """After a failed or abandoned task: :func:`_discard` this process's instance ``index``."""
    _discard(_key(plan, index))


def _new_instance(plan: TaskPlan, storage: CheckpointStorage, index: int, workdir: str, fresh: bool) -> OperatorInstance:
    # One manager per worker process and budget: workers are reused across tasks and batches.
    manager = shared_manager(plan.memory_budget) if plan.memory_budget is not None else None
    return OperatorInstance.for_runner(plan, index, storage=storage, manager=manager, workdir=workdir, fresh=fresh)


def instance_for(
    plan: TaskPlan, storage: CheckpointStorage, index: int, context: BatchContext
) -> tuple[OperatorInstance, str]:
    """The instance for ``index`` at the committed version before this batch, and how it started.

    In order of preference: this process's own suspended instance (warm
    cache), the working RocksDB another worker process of this machine left at
    exactly that version, or a new one restored from the checkpoint. The choice
    is made under the instance directory's lock, so that the sweep of crashed
    attempts' stores never races a hand-over.
    """
    directory = state_dir(plan, index)
    os.makedirs(directory, exist_ok=True)
    with FileLock(os.path.join(directory, ".instance.lock")):
        instance, start = _choose_instance(plan, storage, index, context, directory)
        sweep_stores(directory, keep=os.path.basename(instance.workdir or ""))
    return instance, start


def _choose_instance(
    plan: TaskPlan, storage: CheckpointStorage, index: int, context: BatchContext, directory: str
) -> tuple[OperatorInstance, str]:
    key = _key(plan, index)
    claim = _claim(directory)
    live = _LIVE.get(key)
    if claim is not None and claim.get("version") == context.previous_version:
        db = os.path.join(directory, str(claim["db"]))
        try:
            if live is not None and live.token == claim.get("token") and live.instance.suspended:
                live.instance.resume()
                live.token = None
                return live.instance, RESUMED
            _discard(key)
            instance = _new_instance(plan, storage, index, db, fresh=False)
            instance.adopt()
            _LIVE[key] = _Live(instance, None)
            return instance, ADOPTED
        except StoreLockedError:
            pass  # a straggling attempt still has it open: build a private copy
    _discard(key)
    # A claimed store that is not taken is left to sweep_stores: it is removed unless a
    # straggling attempt still holds it.
    # Directories of this query at another parallelism are stale (the job was rescaled).
    parent = os.path.dirname(directory)
    for name in os.listdir(parent):
        if not name.endswith(f"of{plan.parallelism}"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    for other in [k for k in _LIVE if k[1] == plan.query_id and k[3] != plan.parallelism]:
        _discard(other)
    instance = _new_instance(plan, storage, index, os.path.join(directory, f"db-{uuid.uuid4().hex}"), fresh=True)
    if context.previous_version is not None:
        try:
            instance.restore(manifest(plan, storage, context.previous_version))
        except CheckpointCorruptError as exc:
            raise storage.way_back_error(exc, context.previous_version) from exc
    _LIVE[key] = _Live(instance, None)
    return instance, (NEW if context.previous_version is None else RESTORED)


def hand_over(plan: TaskPlan, index: int, instance: OperatorInstance, version: int) -> None:
    """Suspend instance ``index`` at ``version`` (checkpointed) and record its store for the next task.

    Called only once every instance of the task has checkpointed. This process
    keeps the suspended instance: its next task resumes it when the ownership
    record still carries this token.
    """
    instance.suspend()
    token = uuid.uuid4().hex
    assert instance.workdir is not None
    _release(state_dir(plan, index), version, token, os.path.basename(instance.workdir))
    # Only now that the record names the store may another worker take (or a sweep judge) it.
    instance.release_workdir()
    _LIVE[_key(plan, index)].token = token


def sweep_stores(directory: str, keep: str) -> list[str]:
    """Remove the working stores of crashed or abandoned attempts in an instance directory; return their names.

    A store is in use while its process holds its claim (an open or
    suspending instance) or while the ownership record names it (handed over,
    waiting for the next task); every other ``db-*`` directory was left by an
    attempt that died or was dropped. Leftover temp files of the ownership
    record go too. Called under the instance directory's lock.
    """
    owner = None
    try:
        with open(os.path.join(directory, OWNER_FILE)) as f:
            owner = json.load(f).get("db")
    except (OSError, ValueError, AttributeError):
        pass
    removed = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name.startswith((".claimed-", ".owner-")):
            pid = name.split("-")[1]
            if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.remove(path)
            continue
        if name.startswith(".db-") and name.endswith(".lock"):  # the claim of a store (directory_lock)
            if not os.path.exists(os.path.join(directory, name[1 : -len(".lock")])):
                stale = FileLock(path)
                if stale.try_acquire():
                    with contextlib.suppress(OSError):
                        os.remove(path)
                    stale.release()
            continue
        if not name.startswith("db-") or name in (keep, owner):
            continue
        claim = directory_lock(path)
        if not claim.try_acquire():
            continue  # a live attempt holds it
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
        finally:
            claim.release()
        with contextlib.suppress(OSError):
            os.remove(claim.path)
    return removed


def close_all() -> None:
    """Close every live instance of this worker (tests, and interpreter exit)."""
    while _LIVE:
        _LIVE.popitem()[1].instance.close()
    _MANIFESTS.clear()
