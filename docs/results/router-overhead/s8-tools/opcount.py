"""A deterministic cost proxy: bytecodes and calls (Python and C) per lone request
in Router.turn."""

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import inproc


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    r, c, w, P = inproc.setup()
    times = []
    for i in range(200):
        inproc.one(r, c, w, P, i, times)
    counts = collections.Counter()
    per_fn = collections.Counter()

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts["opcodes"] += 1
            q = frame.f_code.co_qualname
            if q.endswith("__init__") and "self" in frame.f_locals:
                q = type(frame.f_locals["self"]).__name__ + ".__init__"
            per_fn[q + " " + frame.f_code.co_filename.rsplit("/", 1)[-1]] += 1
        return tracer

    def prof(frame, event, arg):
        if event == "call":
            counts["py_calls"] += 1
        elif event == "c_call":
            counts["c_calls"] += 1

    orig = r.turn

    def turn(ready=None):
        sys.settrace(tracer)
        sys.setprofile(prof)
        try:
            return orig(ready)
        finally:
            sys.settrace(None)
            sys.setprofile(None)

    r.turn = turn
    for i in range(n):
        inproc.one(r, c, w, P, 1000 + i, times)
    print({k: round(v / n, 1) for k, v in counts.items()})
    if len(sys.argv) > 2:
        for k, v in per_fn.most_common(int(sys.argv[2])):
            print(f"{v / n:8.1f} {k}")


if __name__ == "__main__":
    main()
