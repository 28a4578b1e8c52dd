"""The req/s case round after round in one router process: req/s and the router's CPU per
request (it is CPU-bound). usage: busy.py [ROUNDS]; SPY=1 records a py-spy profile of round 2."""

import os
import subprocess
import sys
import tempfile
import time

import psutil

from tandem.bench import router_overhead as ro


def main():
    spy = os.environ.get("SPY")
    with ro.path("router") as (sock, pid):
        proc = psutil.Process(pid)
        for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
            frames = [ro._submit(f"q{i}", 1) for i in range(20000 if spy else 4000)]
            st = None
            if spy and r == 1:
                st = subprocess.Popen(
                    [
                        os.environ.get("PY_SPY", "py-spy"),
                        "record",
                        "-r",
                        "400",
                        "-n",
                        "-p",
                        str(pid),
                        "-f",
                        "raw",
                        "-o",
                        os.path.join(tempfile.gettempdir(), "router_spy.txt"),
                        "-d",
                        "4",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.5)
            c0 = proc.cpu_times()
            t0 = time.monotonic()
            secs, _, _ = ro._drive(sock, frames, 256)
            c1 = proc.cpu_times()
            t1 = time.monotonic()
            th = sorted(round(t.user_time + t.system_time, 2) for t in proc.threads())
            cpu = (c1.user + c1.system) - (c0.user + c0.system)
            share, per_req = 100 * cpu / (t1 - t0), 1e6 * cpu / len(frames)
            rate = len(frames) / secs
            print(f"req/s {rate:.0f}  router cpu {share:.0f}%  per req {per_req:.0f} us  {th}")
            if st:
                st.wait()


if __name__ == "__main__":
    main()
