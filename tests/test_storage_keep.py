"""mado.storage.keep_if_hash: the one way an upload's bytes become a stored file (a job's outputs in a
batch, a dataset archive's members). A file whose bytes do not hash to what was declared is never kept,
and one cut short is never kept either; what was stored before stays as it was."""
import hashlib
import io

import pytest

from mado import storage


def test_matching_bytes_are_kept_under_the_target_name(tmp_path):
    data = b"weights" * 1000
    target = tmp_path / "model.bin"
    assert storage.keep_if_hash(io.BytesIO(data), tmp_path / "part", target, hashlib.sha256(data).hexdigest())
    assert target.read_bytes() == data and not (tmp_path / "part").exists()


def test_bytes_that_do_not_match_leave_the_stored_file_as_it_was(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"before")
    assert not storage.keep_if_hash(io.BytesIO(b"changed"), tmp_path / "part", target,
                                    hashlib.sha256(b"other").hexdigest())
    assert target.read_bytes() == b"before" and not (tmp_path / "part").exists()


def test_a_sized_read_takes_exactly_its_bytes_and_leaves_the_rest_of_the_stream(tmp_path):
    stream = io.BytesIO(b"first" + b"second")
    assert storage.keep_if_hash(stream, tmp_path / "part", tmp_path / "a", hashlib.sha256(b"first").hexdigest(),
                                size=5)
    assert (tmp_path / "a").read_bytes() == b"first" and stream.read() == b"second"


def test_a_stream_that_ends_early_keeps_nothing(tmp_path):
    with pytest.raises(EOFError):
        storage.keep_if_hash(io.BytesIO(b"abc"), tmp_path / "part", tmp_path / "a",
                             hashlib.sha256(b"abcdef").hexdigest(), size=6)
    assert not (tmp_path / "a").exists() and not (tmp_path / "part").exists()
