"""worker_agent.log_delivery.merge: contiguous chunks of a stream join into frames of up to 4 MiB, in the
order they arrived, but never across the boundaries of a batch that was in flight when the worker
stopped (the server may hold those chunks under their offsets; a merged chunk there would be ignored
whole and its new bytes lost). split undoes it for the JSON endpoint."""
from __future__ import annotations

from worker_agent.log_delivery import cut_points, frames_body, merge, split
from worker_agent.supervisor import LogChunk


def chunks(*items):
    return [LogChunk(stream, offset, data) for stream, offset, data in items]


def shape(batch):
    return [(c.stream, c.offset, c.data) for c in batch]


def test_contiguous_chunks_of_a_stream_merge_and_the_order_of_streams_is_kept():
    batch = chunks(("stdout", 0, b"ab"), ("stdout", 2, b"cd"), ("stderr", 0, b"E"), ("stdout", 4, b"ef"),
                   ("stdout", 9, b"gap"))
    assert shape(merge(batch)) == [("stdout", 0, b"abcd"), ("stderr", 0, b"E"), ("stdout", 4, b"ef"),
                                   ("stdout", 9, b"gap")]
    assert shape(merge(chunks(("stdout", 0, b"ab"), ("stdout", 2, b"cd"), ("stdout", 4, b"ef")), limit=4)) == [
        ("stdout", 0, b"abcd"), ("stdout", 4, b"ef")]


def test_chunks_re_cut_after_a_restart_stay_as_they_were_sent():
    cuts = cut_points([["stdout", 2, 4]])  # the server may hold stdout [2, 6)
    batch = chunks(("stdout", 0, b"ab"), ("stdout", 2, b"cd"), ("stdout", 4, b"ef"), ("stdout", 6, b"gh"),
                   ("stdout", 8, b"ij"))
    assert shape(merge(batch, cuts=cuts)) == [("stdout", 0, b"ab"), ("stdout", 2, b"cdef"), ("stdout", 6, b"ghij")]


def test_split_cuts_large_chunks_for_the_json_endpoint_and_frames_say_where_each_goes():
    assert shape(split(chunks(("stderr", 10, b"abcde")), limit=2)) == [
        ("stderr", 10, b"ab"), ("stderr", 12, b"cd"), ("stderr", 14, b"e")]
    assert frames_body(chunks(("stdout", 5, b"a\nb"), ("stderr", 0, b""))) == b"stdout 5 3\na\nbstderr 0 0\n"
