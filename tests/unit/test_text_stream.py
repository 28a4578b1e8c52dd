"""Incremental detokenization with stop strings."""

from __future__ import annotations

from tandem.workers.request import TextStream


def feed_all(ts: TextStream, pieces: list[bytes]) -> str:
    return "".join(ts.feed(x) for x in pieces) + ts.flush()


def test_multibyte_characters_split_across_tokens():
    data = "héllo 世界".encode()
    pieces = [data[i : i + 1] for i in range(len(data))]
    ts = TextStream([])
    outs = [ts.feed(x) for x in pieces]
    assert "".join(outs) + ts.flush() == "héllo 世界"
    assert all("\ufffd" not in o for o in outs)


def test_stop_string_across_pieces_is_held_back_then_cut():
    ts = TextStream(["STOP"])
    assert ts.feed(b"abc S") == "abc "
    assert ts.feed(b"TO") == ""
    assert ts.feed(b"P tail") == ""
    assert ts.stopped and ts.flush() == ""


def test_false_alarm_is_released():
    ts = TextStream(["STOP"])
    assert ts.feed(b"ST") == ""
    assert ts.feed(b"ay") == "STay"
    assert not ts.stopped


def test_earliest_of_several_stops_wins():
    ts = TextStream(["\n\n", "END"])
    assert feed_all(ts, [b"one END two\n\n"]) == "one "


def test_held_text_is_flushed_at_the_end():
    ts = TextStream(["STOP"])
    assert feed_all(ts, [b"xx", b"STO"]) == "xxSTO"
