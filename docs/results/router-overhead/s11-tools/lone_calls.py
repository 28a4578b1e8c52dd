"""A lone request's time inside the router, call by call (wrappers on the router's methods
and sockets; inclusive times per turn). usage: lone_calls.py [N]"""

import collections
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lone_path import lone_path, serve

from tandem.bench import router_overhead as ro


def inst_router(client, worker, stop):
    from tandem.broker.router import Router, RouterConfig
    from tandem.common.settings import Addresses

    logging.basicConfig(level=logging.ERROR)
    pc = time.perf_counter
    marks = []
    r = Router(RouterConfig(addresses=Addresses(client, worker)))

    def wrap(obj, name, tag):
        f = getattr(obj, name)

        def g(*a, **k):
            marks.append((tag + ">", pc()))
            out = f(*a, **k)
            marks.append((tag + "<", pc()))
            return out

        setattr(obj, name, g)

    for obj, names in (
        (
            r,
            [
                "turn",
                "_drain",
                "on_client",
                "submit",
                "dispatch_pending",
                "route",
                "_assign",
                "_flush",
                "on_worker",
                "relay_tokens",
                "relay",
                "_send_tokens",
            ],
        ),
        (r.client_sock, ["recv_frames_nowait", "parse", "flush", "waiting"]),
        (r.worker_sock, ["recv_frames_nowait", "parse", "flush", "waiting"]),
        (r.views, ["candidates"]),
        (r.calibration, ["route_request"]),
    ):
        for n in names:
            wrap(
                obj, n, ("C." if obj is r.client_sock else "W." if obj is r.worker_sock else "") + n
            )
    import tandem.broker.router as rm

    for n in ["PromptBlocks", "prompt_tokens", "validate_submit"]:
        orig = getattr(rm, n)

        def mk(orig=orig, n=n):
            def g(*a, **k):
                marks.append((n + ">", pc()))
                out = orig(*a, **k)
                marks.append((n + "<", pc()))
                return out

            return g

        setattr(rm, n, mk())
    try:
        serve(r, stop)
    finally:
        Path(tempfile.gettempdir(), "router_marks.json").write_text(json.dumps(marks[-200000:]))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with lone_path(inst_router) as (sock, procs):
        frames = [ro._submit(f"q{i}", 1) for i in range(n)]
        ro._drive(sock, frames, 1)
    time.sleep(0.5)
    marks = json.loads(Path(tempfile.gettempdir(), "router_marks.json").read_text())
    # per turn: split at "turn>" ; print durations of each tag (self time not computed; inclusive)
    turns, cur = [], None
    for tag, t in marks:
        if tag == "turn>":
            cur = [(tag, t)]
            turns.append(cur)
        elif cur is not None:
            cur.append((tag, t))
    incl = collections.defaultdict(list)
    kinds = collections.Counter()
    for tr in turns:
        tags = [t for t, _ in tr]
        kind = "submit" if "submit>" in tags else "done" if "relay>" in tags else "other"
        kinds[kind] += 1
        if kind == "other":
            continue
        t0 = tr[0][1]
        stack = {}
        for tag, t in tr:
            if tag.endswith(">"):
                stack[tag[:-1]] = t
            else:
                nm = tag[:-1]
                if nm in stack:
                    incl[(kind, nm)].append((t - stack.pop(nm)) * 1e6)
                    # also time since turn start at first exit
        # time to first W.flush exit / C.flush exit
        for tag, t in tr:
            if tag in ("W.flush<", "C.flush<"):
                incl[(kind, "since turn start: " + tag)].append((t - t0) * 1e6)
                break
    print(kinds)
    for (kind, nm), xs in sorted(incl.items()):
        print(
            f"{kind:7s} {nm:40s} n={len(xs):5d}  median {statistics.median(xs):7.1f} us"
            f"  (per turn {sum(xs) / kinds[kind]:7.1f})"
        )


if __name__ == "__main__":
    main()
