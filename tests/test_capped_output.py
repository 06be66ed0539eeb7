"""CappedOutput in-process: what a command's output becomes once it passes the cap."""

from __future__ import annotations

import pytest

from trajforge.tail import CappedOutput


def capped(data: bytes, limit: int, chunk: int | None = None) -> CappedOutput:
    output = CappedOutput(limit)
    step = chunk or max(len(data), 1)
    for start in range(0, len(data), step):
        output.feed(data[start : start + step])
    return output


@pytest.mark.parametrize("size", [0, 1, 9, 10])
def test_output_within_the_limit_is_kept_whole_without_a_marker(size):
    data = bytes(range(97, 97 + size))
    output = capped(data, 10)
    assert output.text() == data.decode() and output.dropped == 0


def test_output_over_the_limit_keeps_head_and_tail_around_a_marker_with_the_dropped_count():
    output = capped(b"0123456789abcdefghij", 10)
    assert output.dropped == 10
    assert output.text() == "01234\n[... 10 bytes of output omitted ...]\nfghij"


def test_one_byte_over_the_limit_is_counted():
    output = capped(b"01234x56789", 10)
    assert output.text() == "01234\n[... 1 bytes of output omitted ...]\n56789"


def test_an_odd_limit_keeps_half_of_it_rounded_down_at_each_end():
    output = capped(b"abcdefghijkl", 7)
    assert (bytes(output.head), bytes(output.tail), output.dropped) == (b"abc", b"jkl", 6)


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 7, 11, 64, 1000])
def test_chunk_boundaries_do_not_change_the_result(chunk):
    data = bytes(i % 251 for i in range(1000))
    whole = capped(data, 100)
    pieces = capped(data, 100, chunk)
    assert (bytes(pieces.head), bytes(pieces.tail), pieces.dropped) == (data[:50], data[-50:], 900)
    assert pieces.text() == whole.text()


def test_a_character_split_between_chunks_is_decoded_whole():
    data = "größe €".encode()
    assert capped(data, 100, 1).text() == "größe €"


def test_empty_chunks_change_nothing():
    output = CappedOutput(10)
    for chunk in (b"", b"01234", b"", b"56789abc", b""):
        output.feed(chunk)
    assert output.text() == "01234\n[... 3 bytes of output omitted ...]\n89abc"
