"""Busy mode (the bench's req/s case: max_tokens 1, 256 in flight) behind a router with
N null workers: req/s and the router's CPU per request, round after round.
usage: busy_workers.py N [ROUNDS]. With N >= 2 every decision scores candidates
(finish_time over the workers' in-flight loads); with 1 the request is placed alone."""

import sys

import psutil
import zmq

from tandem.bench import null_peers
from tandem.bench import router_overhead as ro


def named_null_worker(address: str, mode: str, stop, worker_id: str) -> None:
    """bench/null_peers.py's null worker under another name (it registers as "null")."""
    original = null_peers.ready
    null_peers.ready = lambda _name, spec, with_spec=True: original(worker_id, spec, with_spec)
    null_peers.null_worker(address, mode, stop)


def main() -> None:
    n = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    c, w = ro._addr(), ro._addr()
    stop = ro.SPAWN.Event()
    procs = [ro.SPAWN.Process(target=ro._run_router, args=(c, w, stop), daemon=True)]
    procs[0].start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(c)
    try:
        # One at a time: a null worker sends its Ready once, and a router without the
        # tokenizer yet asks one worker at a time for it (real workers retry).
        for i in range(n):
            args = (w, "router", stop, f"null{i}")
            procs.append(ro.SPAWN.Process(target=named_null_worker, args=args, daemon=True))
            procs[-1].start()
            if ro._wait_registered(c, i + 1, timeout_s=30.0) != i + 1:
                raise RuntimeError(f"null{i} did not register")
        ro._warm(sock, procs=procs)
        router = psutil.Process(procs[0].pid)
        for _ in range(rounds):
            frames = [ro._submit(f"q{i}", 1) for i in range(4000)]  # ids as _drive counts them
            c0 = router.cpu_times()
            secs, _, _ = ro._drive(sock, frames, 256)
            c1 = router.cpu_times()
            cpu = (c1.user + c1.system) - (c0.user + c0.system)
            rate, per_req = len(frames) / secs, 1e6 * cpu / len(frames)
            now = ro._wait_registered(c, n, timeout_s=0.1)  # none expired meanwhile
            print(f"workers {now}/{n}  req/s {rate:.0f}  per req {per_req:.0f} us")
    finally:
        sock.close(0)
        stop.set()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


if __name__ == "__main__":
    main()
