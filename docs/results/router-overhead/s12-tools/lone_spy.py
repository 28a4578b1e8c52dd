"""py-spy (wall clock, 1 kHz, not pausing the process) over the router while lone
requests go through for 10 s. usage: lone_spy.py OUT (PY_SPY: the py-spy binary)."""

import os
import subprocess
import sys
import time

from spin import lone_path, lone_requests, plain_router

if __name__ == "__main__":
    out = sys.argv[1]
    with lone_path(plain_router) as (sock, procs):
        spy = os.environ.get("PY_SPY", "py-spy")
        cmd = [spy, "record", "-r", "1000", "--nonblocking", "-p", str(procs[0].pid)]
        cmd += ["-f", "raw", "-o", out, "-d", "12"]
        rec = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        t_end, n = time.monotonic() + 10, 0
        while time.monotonic() < t_end:
            n += len(lone_requests(sock, 100))
        rec.wait()
        print("requests", n)
