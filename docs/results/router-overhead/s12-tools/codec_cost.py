"""Per-frame cost of the protocol's two paths, us (min of 5 x N calls): msgpack alone,
the hand-written path (``_decode_slow``: what every frame took before msgspec) and
the fast path (``decode`` / ``encode``); both with the bounds checks. The
hand-written encoder, dead once msgspec packed every frame, was removed after the
results table was made with it (at 2e10477): its column is not measured here any
more. usage: codec_cost.py [N]"""

import sys
import timeit

import msgpack

from tandem.common import protocol as p

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rows = [p.RequestRow(f"r{i}", 512, 256, 0, 100) for i in range(4)]
FRAMES = {
    "submit (3 tokens)": p.Submit("q1", tokens=[1, 2, 3], sampling=p.SamplingParams(1)),
    "submit (512 tokens)": p.Submit("q1", tokens=list(range(512)), sampling=p.SamplingParams(64)),
    "assign (512 tokens)": p.Assign("w1", list(range(512)), p.SamplingParams(64)),
    "tokens": p.TokenDelta("q1", [5], "x"),
    "step_tokens (8 rows)": p.StepTokens(
        [f"w{i}" for i in range(8)], [[i] for i in range(8)], ["x"] * 8
    ),  # fmt: skip
    "done": p.Done(
        "q1",
        p.FinishReason.LENGTH,
        {
            "prompt_tokens": 3,
            "cached_tokens": 0,
            "output_tokens": 1,
            "prefill_s": 0.002,
            "decode_s": 0.0,
        },
    ),  # fmt: skip
    "heartbeat (4 rows)": p.Heartbeat("w", 7, rows[:2], rows[2:], 1024, 65536, {"add": [1, 2]}),
}


def t(f):
    return min(timeit.repeat(f, number=N, repeat=5)) / N * 1e6


print("| frame | msgpack alone | hand-written decode | msgspec decode | msgspec encode |")
print("|---|---|---|---|---|")
for name, msg in FRAMES.items():
    frame = p.encode(msg)
    assert p.decode(frame) == p._decode_slow(frame) == msg
    cells = (
        t(lambda: msgpack.unpackb(frame)),  # noqa: B023
        t(lambda: p._decode_slow(frame)),  # noqa: B023
        t(lambda: p.decode(frame)),  # noqa: B023
        t(lambda: p.encode(msg)),  # noqa: B023
    )
    print(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
