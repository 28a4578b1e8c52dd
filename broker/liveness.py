"""When the router gives a worker up: silence, no progress, or a closed connection.

- Silence: nothing heard for the worker's liveness window. A stall of the
  router's own loop never counts: after a turn longer than ``STALL_S`` every
  worker gets a fresh window (its heartbeats were waiting in the socket, unread).
- No progress: a worker that holds requests but neither relays output nor
  shrinks the remaining work its heartbeats report for ``no_progress_s`` is
  expired, even though it heartbeats (a stuck or lying worker must not hold
  requests forever).
- Disconnect: a socket monitor reports a closed worker connection at once (the
  process died, kill -9 included). The event does not say whose, so every
  registered worker is probed with a cheap send: with ROUTER_MANDATORY a send
  to a departed peer fails, and that worker is dropped there and then instead
  of after its liveness window. Probes repeat shortly after, because the socket
  may still list the peer when the event arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STALL_S = 0.5  # a loop turn longer than this gives every worker a fresh window
PROBE_AFTER_S = (0.0, 0.05, 0.25, 1.0)  # after a disconnect event


@dataclass
class Progress:
    """One worker's last sign of progress on the requests it holds."""

    at: float
    remaining: int = -1  # work its last heartbeat reported (-1: none yet)


@dataclass
class Liveness:
    no_progress_s: float
    progress: dict[str, Progress] = field(default_factory=dict)
    stalled_until: float = 0.0  # end of the last long loop turn
    probes: list[float] = field(default_factory=list)  # times to probe all workers

    def turn_took(self, start: float, end: float) -> None:
        if end - start > STALL_S:
            self.stalled_until = end

    def silent_for(self, last_seen: float, now: float) -> float:
        return now - max(last_seen, self.stalled_until)

    def on_output(self, worker_id: str, now: float) -> None:
        """The worker relayed tokens, a Done or an Error: it is making progress."""
        last = self.progress.get(worker_id)
        if last is None:
            self.progress[worker_id] = Progress(now)
        else:  # its remaining work as last reported: only the time moves (in place)
            last.at = now

    def on_heartbeat(self, worker_id: str, remaining: int, holds: bool, now: float) -> None:
        """``remaining``: work its heartbeat lists; ``holds``: it has requests of ours."""
        last = self.progress.get(worker_id)
        if last is None or not holds or remaining != last.remaining:
            self.progress[worker_id] = Progress(now, remaining)

    def stuck_for(self, worker_id: str, holds: bool, now: float) -> float:
        """Seconds without progress while holding requests (0 when it holds none)."""
        if not holds:
            self.progress[worker_id] = Progress(now)
            return 0.0
        return now - self.progress.setdefault(worker_id, Progress(now)).at

    def why_expired(
        self, worker_id: str, last_seen: float, window_s: float, holds: bool, now: float
    ) -> str | None:
        """Why the router should give this worker up now, or None."""
        silent_s = self.silent_for(last_seen, now)
        if silent_s > window_s:
            return f"silent for {silent_s:.1f}s"
        stuck_s = self.stuck_for(worker_id, holds, now)
        if stuck_s > self.no_progress_s:
            return f"no progress on its requests for {stuck_s:.1f}s"
        return None

    def forget(self, worker_id: str) -> None:
        self.progress.pop(worker_id, None)

    # ------------------------------------------------------------ disconnects
    def on_disconnect(self, now: float) -> None:
        self.probes = sorted(set(self.probes) | {now + d for d in PROBE_AFTER_S})

    def probe_due(self, now: float) -> bool:
        if not self.probes:  # every turn asks: most have nothing to probe
            return False
        due = [t for t in self.probes if t <= now]
        self.probes = [t for t in self.probes if t > now]
        return bool(due)
