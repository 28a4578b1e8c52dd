"""Three drivers of the one router core, behind one small interface, for replays.

A scripted session (tests/unit/test_decision_replay.py) starts workers, submits
requests and sends what the workers report; each driver carries that to the
router core its own way and reports the Assigns the workers were sent and the
decision records written:

- ``live``: the router process's loop (broker/router.py) on inproc sockets, pumped
  by hand (tests.helpers.Harness); records from its ``--decision-log`` file;
- ``core``: ``RouterCore`` alone, its events called directly on a clock that moves
  a millisecond per event, what it owes kept by ``Kept`` peers (broker/outgoing.py);
- ``twin``: the twin's loop (twin/loop.py), its deliveries run on the twin's
  virtual clock (twin/world.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tandem.bench.driver import RequestRecord
from tandem.broker.config import RouterConfig
from tandem.broker.core import RouterCore
from tandem.broker.outgoing import Kept
from tandem.common import protocol as p
from tandem.twin.loop import TwinLoop
from tandem.twin.world import World
from tests.helpers import Harness, fake_ready, tiny_tokenizer

Rates = tuple[float, list[float]]


class Link(Protocol):
    def start_worker(self, wid: str, rates: Rates, max_active: int) -> None: ...
    def submit(self, sub: p.Submit) -> None: ...
    def from_worker(self, wid: str, msg: p.Message) -> None: ...
    def assigned(self) -> list[tuple[str, p.Assign]]: ...
    def decisions(self) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


class LiveLink:
    def __init__(self, tmp_path: Path, cfg: dict[str, Any]) -> None:
        self.h = Harness(tmp_path, **cfg)

    def start_worker(self, wid: str, rates: Rates, max_active: int) -> None:
        self.h.add_worker(wid, rates, max_active)

    def submit(self, sub: p.Submit) -> None:
        self.h.client.send(sub)
        self.h.pump()

    def from_worker(self, wid: str, msg: p.Message) -> None:
        self.h.workers[wid].send(msg)
        self.h.pump()

    def assigned(self) -> list[tuple[str, p.Assign]]:
        got = []
        for wid, sock in self.h.workers.items():
            while sock.poll(0):
                msg = sock.recv()
                if isinstance(msg, p.Assign):
                    got.append((wid, msg))
        while self.h.client.poll(0):
            self.h.client.recv()
        return got

    def decisions(self) -> list[dict[str, Any]]:
        return self.h.decisions()

    def close(self) -> None:
        self.h.close()


class CoreLink:
    def __init__(self, tmp_path: Path, cfg: dict[str, Any]) -> None:
        self.core = RouterCore(RouterConfig(accept_hold_ms=0.0, **cfg))
        self.core.log_decisions = True
        self.now, self.spec = 0.0, tiny_tokenizer()
        self.peers = Kept()

    def _clock(self) -> float:
        self.now += 1e-3
        return self.now

    def start_worker(self, wid: str, rates: Rates, max_active: int) -> None:
        now = self._clock()
        self.core.worker(wid.encode(), fake_ready(wid, rates, max_active, self.spec), now)
        self.core.flush(self.peers, now)

    def submit(self, sub: p.Submit) -> None:
        now = self._clock()
        self.core.client(b"client", sub, now)
        self.core.route_and_flush(self.peers, now)

    def from_worker(self, wid: str, msg: p.Message) -> None:
        now = self._clock()
        self.core.worker(wid.encode(), msg, now)
        self.core.drained()
        self.core.route_and_flush(self.peers, now)

    def assigned(self) -> list[tuple[str, p.Assign]]:
        sent, self.peers.workers = self.peers.workers, []
        return [(peer.decode(), m) for peer, m in sent if isinstance(m, p.Assign)]

    def decisions(self) -> list[dict[str, Any]]:
        return [record | {"time": now} for now, record in self.peers.records]

    def close(self) -> None:
        pass


class TwinLink:
    def __init__(self, tmp_path: Path, cfg: dict[str, Any]) -> None:
        self.world = World()
        self.sent: list[tuple[str, p.Assign]] = []
        estimate = cfg.get("decode_estimate", "budget")
        self.loop = TwinLoop(cfg["policy"], self._deliver, cfg["calibrate"], estimate)
        self.spec = tiny_tokenizer()

    def _deliver(self, wid: str, msg: p.Message, now: float) -> None:
        if isinstance(msg, p.Assign):
            self.world.at(now, self.sent.append, (wid, msg))

    def _at_next_ms(self, fn: Any, *args: Any) -> None:
        self.world.at(self.world.now + 1e-3, fn, *args)
        self.world.run()

    def start_worker(self, wid: str, rates: Rates, max_active: int) -> None:
        r = fake_ready(wid, rates, max_active, self.spec)
        self._at_next_ms(lambda: self.loop.register(r, self.world.now))

    def submit(self, sub: p.Submit) -> None:
        rec = RequestRecord(-1, sub.request_id, False, self.world.now)
        tokens, budget = list(sub.tokens or ()), sub.sampling.max_tokens
        self._at_next_ms(lambda: self.loop.submit(rec, tokens, budget, self.world.now))

    def from_worker(self, wid: str, msg: p.Message) -> None:
        frame = p.encode(msg)  # as the live link's socket carries it
        self._at_next_ms(lambda: self.loop.on_worker(wid, [frame], self.world.now))

    def assigned(self) -> list[tuple[str, p.Assign]]:
        got, self.sent = self.sent, []
        return got

    def decisions(self) -> list[dict[str, Any]]:
        return self.loop.decisions

    def close(self) -> None:
        pass


LINKS: dict[str, Any] = {"live": LiveLink, "core": CoreLink, "twin": TwinLink}
