"""The twin's GPU slows down mid-burst: how soon does the live step model follow?

An experiment, not a suite scenario (a drift has no "correct price" to compare
with): the GPU of the robustness suite's fleet (sim h200-gpu, measured fast at
start) costs X times its profile from its N-th step on. Each 48- and 8-burst of
the suite runs the default policy on it, beside the same fleet fast throughout,
slow throughout (a steady GPU X slower, told its rates), and least_loaded on the
drifting GPU.

    python docs/results/twin/drift.py 1.5 60 > drift.md
"""

from __future__ import annotations

import dataclasses
import logging
import sys

from tandem.broker.policies import DEFAULT_POLICY
from tandem.common.model_files import default_model_path
from tandem.common.tokenizer import TextTokenizer, tokenizer_spec_from_gguf
from tandem.twin import device, replay
from tandem.twin import robustness as rb
from tandem.twin.device import Tail

X = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
N = int(sys.argv[2]) if len(sys.argv) > 2 else 60
DRIFTS = Tail(999, 1.0)  # marks the drifting GPU (a tail of every 999th step at 1x: none)
_run = device.TwinDevice.run


def _drifting_run(self, decode, prefill):  # type: ignore[no-untyped-def]
    before = self.owner.now
    out = _run(self, decode, prefill)
    if self.tail is DRIFTS and self.steps > N:
        extra = (self.owner.now - before) * (X - 1)
        self.owner.now += extra
        self.busy_s += extra
    return out


def main() -> None:
    logging.getLogger("tandem.workers.rates").setLevel(logging.ERROR)
    device.TwinDevice.run = _drifting_run  # type: ignore[method-assign]
    warm = replay._warm_up  # the start-up measurement sees the fast device
    replay._warm_up = lambda spec: warm(dataclasses.replace(spec, tail=None))
    encode = TextTokenizer(tokenizer_spec_from_gguf(default_model_path())).encode
    drift = rb.Scenario("drift", gpu_tail=DRIFTS)
    slow = rb.Scenario("slow", steady_gpu=Tail(2, 2 * X - 1))  # a run of steps X slower
    print(f"GPU {X}x slower from its step {N} on; makespan s (requests on the CPU)\n")
    print("| burst | drifting GPU | fast throughout | slow throughout | least_loaded, drifting |")
    print("| --- | --- | --- | --- | --- |")
    for case in rb.FULL:
        d, c = rb.makespan(case, drift, DEFAULT_POLICY, encode)
        f, fc = rb.makespan(case, rb.Scenario("fast"), DEFAULT_POLICY, encode)
        s, sc = rb.makespan(case, slow, DEFAULT_POLICY, encode)
        ll, llc = rb.makespan(case, drift, "least_loaded", encode)
        cells = [f"{d:.2f} ({c})", f"{f:.2f} ({fc})", f"{s:.2f} ({sc})", f"{ll:.2f} ({llc})"]
        print(f"| {case.label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
