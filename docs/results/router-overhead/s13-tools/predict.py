"""One exact prediction (drain_ahead + predict_finish_s) on two views: the busy
bench's null worker with 128 requests queued, and a GPU-like worker with 8 active and
4 queued. usage: predict.py (microseconds, best of 7 x 300)."""

import timeit

from tandem.broker.policies import Load, RouteRequest, WorkerView
from tandem.broker.policies.finish import drain_ahead, predict_finish_s

REQ = RouteRequest(3, 1)
GPU_RATES = tuple(b / (0.0034 * (1 + 0.1 * (b - 1))) for b in range(1, 9))
VIEWS = {
    "null 128 queued": WorkerView("w", 1e6, (1e4,) * 8, 256, queued=(Load(3, 1),) * 128),
    "gpu 8 active + 4 queued": WorkerView(
        "g",
        2551.0,
        GPU_RATES,
        8,
        active=tuple(Load(0 if j % 2 else 40, 60 + j) for j in range(8)),
        queued=(Load(300, 128),) * 4,
    ),
}


def main() -> None:
    for name, w in VIEWS.items():

        def once(w: WorkerView = w) -> float:
            return predict_finish_s(REQ, w, drain_ahead(w))

        best = min(timeit.repeat(once, number=300, repeat=7)) / 300
        print(name, round(best * 1e6, 1), "us")


if __name__ == "__main__":
    main()
