"""A starting worker's announcements: who is coming, doing what, ready in how long.

A worker can register only once its model is loaded and its prices known
(workers/startup.py): seconds on a CPU, minutes for a large model or a GPU's
first kernels. Until then the router knew nothing of it, and a request that
waited could only say "waiting for a worker". So as soon as the process starts
(its id known), an ``Announcer`` thread connects a socket of its own to the router
and sends ``Starting`` (id, instance, device, model, stage, estimated seconds
left), at once on every stage change and again every ``every_s`` (a silent one is
forgotten, as a silent worker is expired: broker/starting.py). It stops right
before the worker's link sends its Ready, which replaces the entry.

Its own socket, not the link's: the link's identity and Ready need what loading
builds (the tokenizer, the prices), and the announcer must not hold the worker's
start up. Nothing it does can fail the worker: a router that is not there yet
just never hears it.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import zmq

from tandem.common import protocol as p
from tandem.common.auth import peer_setup
from tandem.common.model_files import model_display_name
from tandem.common.transport import DealerSocket
from tandem.workers.config import WorkerConfig

log = logging.getLogger(__name__)

EVERY_S = 1.0  # how often a starting worker repeats its announcement


class Announcer:
    """Announce this starting worker (``stage``) until ``close``; ``device`` may be
    set once the backend says which it is."""

    def __init__(
        self,
        router: str,
        worker_id: str,
        instance: str,
        device: str,
        model: str,
        keys: str | None = None,
        every_s: float = EVERY_S,
    ) -> None:
        self.router, self.keys, self.every_s = router, keys, every_s
        self.worker_id, self.instance, self.device, self.model = worker_id, instance, device, model
        self._stage: tuple[str, float | None] = (p.StartStage.LOADING, None)
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def message(self) -> p.Starting:
        stage, eta_s = self._stage
        eta = None if eta_s is None else round(max(0.0, eta_s), 1)
        return p.Starting(
            worker_id=self.worker_id, instance=self.instance, device=self.device,
            model=self.model, stage=p.StartStage(stage), eta_s=eta, every_s=self.every_s,
        )  # fmt: skip

    def start(self) -> Announcer:
        self._thread = threading.Thread(target=self._run, name="tandem-announce", daemon=True)
        self._thread.start()
        return self

    def stage(self, stage: str, eta_s: float | None = None) -> None:
        """The worker is now at ``stage``, with about ``eta_s`` seconds left (None:
        unknown): announced at once."""
        self._stage = (stage, eta_s)
        self._changed.set()

    def close(self) -> None:
        """Stop announcing (the Ready goes next), after sending the last stage."""
        self._stop.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        try:  # as the link connects (a bad address or keys folder is said there)
            sock = DealerSocket(self.router, setup=peer_setup(self.keys, "worker"))
        except Exception as exc:
            log.debug("cannot announce to %s: %s", self.router, exc)
            return
        sock.sock.setsockopt(zmq.SNDHWM, 4)  # no backlog of stale stages for a late router
        try:
            while True:
                self._send(sock)
                if self._stop.is_set():
                    break
                self._changed.wait(self.every_s)
                self._changed.clear()
                while sock.poll(0):  # the router answers nothing; an error is only logged
                    msg = sock.recv()
                    if isinstance(msg, p.Error | p.ProtocolError):
                        log.warning("the router refused our announcement: %s", msg)
        except Exception:  # announcing is a courtesy: the worker starts regardless
            log.warning("announcing this worker's start failed", exc_info=True)
        finally:
            sock.close()

    def _send(self, sock: DealerSocket) -> None:
        # No router connected yet (zmq.Again): the next one goes when it is.
        with contextlib.suppress(zmq.Again):
            sock.sock.send(p.encode(self.message()), zmq.NOBLOCK)


def announce(cfg: WorkerConfig, worker_id: str, instance: str, device: str) -> Announcer:
    """Start announcing the worker ``cfg`` starts, as ``worker_id`` on ``device``."""
    model = model_display_name(cfg.model)
    return Announcer(cfg.router, worker_id, instance, device, model, cfg.keys).start()
