"""Checkpoint values are pickles: with a checkpoint key, a manifest must be signed with it before anything is read."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from checkpoint import (
    KEY_ENV,
    CheckpointCorruptError,
    CheckpointStorage,
    CheckpointTrustError,
    read_state,
    restore,
)
from checkpoint.__main__ import main
from checkpoint.storage import manifest_path, seal

from .helpers import checkpoint_version

KEY = "a secret only the job knows"


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)


class Payload:
    """A value whose unpickling leaves a file behind: what a crafted checkpoint could do (here, harmlessly)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _path(storage, rel):
    return os.path.join(storage.location, *rel.split("/"))


def _write_version(storage, make_tables, version, values, **kwargs):
    tables = make_tables(max_parallelism=8, track=True)
    tables["state"].put_many(values)
    return checkpoint_version(storage, version, tables, metadata={"key_columns": ["k"]},
                              snapshot_encoding="records", **kwargs)


@pytest.fixture
def crafted(tmp_path, make_tables):
    """An attacker's version 1 (valid checksums, no key) with a value that runs code when unpickled."""
    marker = str(tmp_path / "code-ran")
    storage = CheckpointStorage(tmp_path / "crafted")
    _write_version(storage, make_tables, 1, [((1,), Payload(marker))])
    return storage, marker


def test_without_a_key_a_crafted_checkpoint_runs_code_in_read_state(crafted):
    """The threat the README warns about, shown once: reading a location unpickles what its writer chose."""
    storage, marker = crafted
    read_state(storage.location)
    assert os.path.exists(marker)


def test_with_a_key_read_state_refuses_an_unsigned_checkpoint_before_unpickling(crafted):
    storage, marker = crafted
    with pytest.raises(CheckpointTrustError, match="not signed") as info:
        read_state(storage.location, checkpoint_key=KEY)
    assert info.value.file == manifest_path(1) and manifest_path(1) in str(info.value)
    assert not os.path.exists(marker)


def test_with_the_key_in_the_environment_an_unsigned_checkpoint_is_refused(crafted, monkeypatch):
    storage, marker = crafted
    monkeypatch.setenv(KEY_ENV, KEY)
    with pytest.raises(CheckpointTrustError):
        read_state(storage.location)
    assert not os.path.exists(marker)


def test_a_signed_checkpoint_reads_back_with_its_key(tmp_path, make_tables):
    storage = CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY)
    _write_version(storage, make_tables, 1, [((i,), i * 10) for i in range(5)])
    text = open(_path(storage, manifest_path(1))).read()
    assert '"signature": "hmac-sha256:' in text
    frame = read_state(storage.location, checkpoint_key=KEY)
    assert sorted(frame["state"]) == [0, 10, 20, 30, 40]


def test_a_manifest_signed_with_another_key_is_refused(tmp_path, make_tables):
    storage = CheckpointStorage(tmp_path / "ckpt", checkpoint_key="another key")
    _write_version(storage, make_tables, 1, [((1,), 1)])
    with pytest.raises(CheckpointTrustError, match="does not match the checkpoint key"):
        CheckpointStorage(storage.location, checkpoint_key=KEY).read_manifest(1)


def test_a_manifest_rewritten_with_a_matching_checksum_but_no_valid_signature_is_refused(tmp_path, make_tables):
    storage = CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY)
    _write_version(storage, make_tables, 1, [((1,), 1)])
    path = _path(storage, manifest_path(1))
    body = json.loads(open(path).read())
    signature = body.pop("signature")
    body.pop("checksum")
    body["metadata"]["key_columns"] = ["evil"]
    unsigned = seal(body, None)  # a correct plain checksum: anyone can compute it
    with open(path, "wb") as f:
        f.write(unsigned)
    with pytest.raises(CheckpointTrustError, match="not signed"):
        storage.read_manifest(1)
    resigned = json.loads(unsigned)
    resigned["signature"] = signature  # the old, genuine signature over other content
    with open(path, "w") as f:
        f.write(json.dumps(resigned, indent=1))
    with pytest.raises(CheckpointTrustError, match="does not match"):
        storage.read_manifest(1)


def test_a_data_section_replaced_together_with_its_checksum_in_the_manifest_is_refused(
    tmp_path, make_tables, crafted
):
    attacker, marker = crafted
    storage = CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY)
    _write_version(storage, make_tables, 1, [((1,), "harmless")])
    # The attacker's task file goes next to the genuine one, and the manifest's chains point at it,
    # with their (correct) offsets and checksums; the manifest's plain checksum is recomputed.
    evil = attacker.read_manifest(1)
    for name in evil.files():
        shutil.copy(_path(attacker, name), _path(storage, name))
    path = _path(storage, manifest_path(1))
    body = json.loads(open(path).read())
    body.pop("checksum")
    signature = body.pop("signature")
    body["key_groups"] = evil.to_dict()["key_groups"]
    crafted_file = json.loads(seal(body, None))
    crafted_file["signature"] = signature
    with open(path, "w") as f:
        f.write(json.dumps(crafted_file, indent=1))
    with pytest.raises(CheckpointTrustError):
        read_state(storage, checkpoint_key=KEY)
    with pytest.raises(CheckpointTrustError):
        restore(storage, 1, range(8), make_tables(max_parallelism=8))
    assert not os.path.exists(marker)


def test_with_a_key_restore_hard_links_no_checkpoint_file_into_the_store(tmp_path, make_tables):
    """A file linked into the store (or mapped) could be changed by a writer of the location after its check."""
    storage = CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY)
    tables = make_tables(max_parallelism=8, track=True)
    tables["state"].put_many(((i,), i) for i in range(5_000))
    manifest = checkpoint_version(storage, 1, tables, sst_min_entries=10)
    sst_files = {f for chain in manifest.chains.values() for ref in chain for f in ref.sst_files}
    assert sst_files
    target = make_tables(max_parallelism=8)
    restore(storage, 1, range(8), target)
    assert [os.stat(_path(storage, f)).st_nlink for f in sorted(sst_files)] == [1] * len(sst_files)
    assert len(list(target["state"].iter_raw())) == 5_000


def test_an_empty_checkpoint_key_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="checkpoint_key must not be empty"):
        CheckpointStorage(tmp_path / "ckpt", checkpoint_key="")
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(ValueError, match=KEY_ENV):
        CheckpointStorage(tmp_path / "ckpt")


def test_a_storage_given_with_another_key_is_refused(tmp_path):
    storage = CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY)
    with pytest.raises(ValueError, match="checkpoint_key differs"):
        CheckpointStorage.of(storage, checkpoint_key="other")


def test_inspect_verifies_the_signature_with_a_key_file(crafted, tmp_path, capsys):
    storage, _ = crafted
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert main(["inspect", storage.location, "--checkpoint-key-file", str(key_file)]) == 1
    assert "not signed" in capsys.readouterr().err


def test_with_a_key_an_unsigned_processing_time_record_is_refused(tmp_path):
    unsigned = CheckpointStorage(tmp_path / "ckpt")
    unsigned.record_processing_time(3, 1_000)
    with pytest.raises(CheckpointTrustError, match="batches/v0000000003.json"):
        CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY).processing_time(3)


def test_a_trust_error_is_a_corrupt_checkpoint_error_naming_the_file(crafted):
    storage, _ = crafted
    with pytest.raises(CheckpointCorruptError) as info:
        CheckpointStorage(storage.location, checkpoint_key=KEY).read_manifest(1)
    assert info.value.file == manifest_path(1)


# ---------------------------------------------------------------- SHA-256 digests of sections and SST files
def _keyed_version(tmp_path, make_tables, **kwargs):
    storage = CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY)
    tables = make_tables(max_parallelism=8, track=True)
    tables["state"].put_many(((i,), i) for i in range(5_000))
    return storage, checkpoint_version(storage, 1, tables, **kwargs)


def test_with_a_key_every_section_and_sst_file_has_a_sha256_digest_in_the_manifest(tmp_path, make_tables):
    storage, manifest = _keyed_version(tmp_path, make_tables, sst_min_entries=10)
    refs = [ref for chain in manifest.chains.values() for ref in chain]
    assert refs and all(len(ref.digest) == 64 for ref in refs)
    assert any(ref.sst_files for ref in refs)
    assert all(len(ref.sst_digests) == len(ref.sst_files) for ref in refs)
    assert storage.read_manifest(1).chains == manifest.chains  # the digests survive the manifest's JSON


def test_with_a_key_a_section_whose_xxh64_was_forged_is_refused(tmp_path, make_tables, monkeypatch):
    """xxh64 is no defence against a forger (it can be matched at will); the SHA-256 digest is."""
    import checkpoint.reader as reader

    storage, manifest = _keyed_version(tmp_path, make_tables, snapshot_encoding="records")
    g = sorted(manifest.chains)[0]
    ref = manifest.chain(g)[0]
    with open(_path(storage, ref.file), "r+b") as f:
        f.seek(ref.offset + ref.length - 1)
        byte = f.read(1)
        f.seek(ref.offset + ref.length - 1)
        f.write(bytes([byte[0] ^ 0x01]))
    monkeypatch.setattr(reader, "checksum", lambda data: ref.checksum)  # the forger matched the xxh64
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch") as info:
        restore(storage, 1, range(g, g + 1), make_tables(max_parallelism=8))
    assert info.value.file == ref.file and info.value.key_group == g


def test_with_a_key_an_sst_file_whose_xxh3_was_forged_is_refused(tmp_path, make_tables, monkeypatch):
    import checkpoint.reader as reader

    storage, manifest = _keyed_version(tmp_path, make_tables, sst_min_entries=10)
    name = next(f for chain in manifest.chains.values() for ref in chain for f in ref.sst_files)
    with open(_path(storage, name), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))

    class Forged:  # the forger matched the file's xxh3
        def __init__(self):
            self.checksum = None

        def update(self, chunk):
            pass

        def intdigest(self):
            return self.checksum

    forged = Forged()
    real_copy = reader._copy_verified

    def copy(storage_, use, path):
        forged.checksum = use.ref.checksum
        return real_copy(storage_, use, path)

    monkeypatch.setattr(reader, "file_hasher", lambda: forged)
    monkeypatch.setattr(reader, "_copy_verified", copy)
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch") as info:
        restore(storage, 1, range(8), make_tables(max_parallelism=8))
    assert info.value.file == name


def test_with_a_key_a_section_written_without_the_key_is_refused(tmp_path, make_tables):
    from checkpoint import CheckpointWriter, commit

    unkeyed = CheckpointStorage(tmp_path / "ckpt")
    keyed = CheckpointStorage(tmp_path / "ckpt", checkpoint_key=KEY)
    tables = make_tables(max_parallelism=8, track=True)
    tables["state"].put_many(((i,), i) for i in range(20))
    report = CheckpointWriter(unkeyed, key_groups=range(8), task="t0").write(1, tables, None, None)
    commit(keyed, 1, [report])  # signed, but the sections carry no digest
    with pytest.raises(CheckpointTrustError, match="no SHA-256 digest") as info:
        restore(keyed, 1, range(8), make_tables(max_parallelism=8))
    assert info.value.file == report.file
