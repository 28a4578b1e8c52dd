"""``tandem top``: a live view of the cluster, redrawn from the router's status.

Workers with their load, KV use, cached blocks and rates (advertised, and
priced: what routing uses now); requests and tokens per second, from the
router's running totals; the most recent routing decisions. ``q`` or Ctrl-C quits.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tandem.cli.options import client_addr, keys_option, ray_option, via_ray
from tandem.cli.tables import CAPABILITIES_LEGEND, cache_cell, capabilities_cell, worker_label
from tandem.client.waiting import stage_words
from tandem.common import protocol as p

DECISIONS_SHOWN = 8
PIPED_WIDTH = 200  # columns when the output is not a terminal (tables take their natural width)


@dataclass
class Rates:
    """Requests and tokens per second between two status replies."""

    t: float = 0.0
    routed: int = 0
    tokens: int = 0
    req_s: float = 0.0
    tok_s: float = 0.0

    def update(self, activity: dict[str, Any], now: float) -> None:
        routed = int(activity.get("requests_routed", 0))
        tokens = int(activity.get("tokens_relayed", 0))
        dt = now - self.t
        # A first sample, or totals that went back (a router restart), rate nothing.
        if self.t and dt > 0 and routed >= self.routed and tokens >= self.tokens:
            self.req_s = (routed - self.routed) / dt
            self.tok_s = (tokens - self.tokens) / dt
        self.t, self.routed, self.tokens = now, routed, tokens


def render(
    st: p.StatusReply | None, rates: Rates, address: str, error: str = "", live: bool = True
) -> Group:
    """One frame of the view (pure: what it shows depends on its arguments alone);
    ``live``: redrawn until a key quits it (not ``--once``), which its header says."""
    if st is None:
        return Group(Text(f"tandem top - router {address}: {error or 'no answer'}", "bold red"))
    act = st.activity
    head = Text.assemble(
        ("tandem top", "bold"),
        f"  router {address}  policy {st.policy}  workers {len(st.workers)}  ",
        f"in flight {st.requests_in_flight}  pending {st.requests_pending}  ",
        (f"{rates.req_s:.1f} req/s  {rates.tok_s:.0f} tok/s", "bold cyan"),
        f"  up {float(act.get('uptime_s', 0)):.0f}s" + ("   (q quits)" if live else ""),
    )
    return Group(head, workers_table(st.workers, st.starting), decisions_table(act))


def workers_table(rows: list[dict[str, Any]], starting: Sequence[dict[str, Any]] = ()) -> Table:
    """Rates read "advertised (priced)" tok/s; decode is at batch 1. ``starting``:
    workers announced but not registered yet, with their stage and seconds left."""
    t = Table(
        title="workers  (rates: advertised (priced) tok/s; * provisional)",
        title_justify="left",
        caption=CAPABILITIES_LEGEND,
        caption_justify="left",
    )
    left = ("worker", "node", "device")
    for col in (*left, "act", "queue", "infl", "routed", "KV", "blocks", "cache"):
        t.add_column(col, justify="left" if col in left else "right")
    for col in ("prefill", "decode", "seen", "caps"):
        t.add_column(col, justify="right", no_wrap=True)
    for w in rows:
        cap = w.get("kv_capacity_tokens") or 0
        t.add_row(
            worker_label(w),
            str(w.get("node") or "-"),
            str(w["device"]),
            f"{w['active']}/{w['max_active']}",
            str(w["queued"]),
            str(w["inflight"]),
            str(w["routed_total"]),
            f"{100 * w['kv_used_tokens'] / cap:.0f}%" if cap else "-",
            str(w["cached_blocks"]),
            cache_cell(w),
            _rate(w["prefill_tok_s"], w.get("priced_prefill_tok_s")),
            _rate(_first(w["decode_tok_s"]), _first(w.get("priced_decode_tok_s"))),
            f"{w['last_seen_s']:.1f}s",
            capabilities_cell(w),
        )
    for s in starting:  # by column: the stage where the rates go, the estimate after it
        eta = s.get("eta_s")
        cells = {"worker": str(s["id"]), "device": str(s["device"]), "act": "starting",
                 "prefill": stage_words(s["stage"]),
                 "decode": "-" if eta is None else f"~{eta:.0f}s",
                 "seen": f"{s['last_seen_s']:.1f}s"}  # fmt: skip
        t.add_row(*(cells.get(str(c.header), "") for c in t.columns), style="dim")
    if not rows and not starting:
        t.add_row("(no worker registered)", *[""] * (len(t.columns) - 1))
    return t


def decisions_table(activity: dict[str, Any]) -> Table:
    t = Table(title="recent routing decisions", title_justify="left")
    for col in ("time", "request", "worker", "policy", "prompt", "cached", "of", "score", "ms"):
        t.add_column(col, justify="right" if col not in ("request", "worker", "policy") else "left")
    for d in reversed(activity.get("recent_decisions", [])[-DECISIONS_SHOWN:]):
        score = d.get("score")
        t.add_row(
            time.strftime("%H:%M:%S", time.localtime(d["time"])),
            str(d["request"])[:12],
            str(d["worker"]),
            str(d["policy"]),
            str(d["prompt_tokens"]),
            str(d["cached_tokens"]),
            str(d["candidates"]),
            f"{score:.3g}" if isinstance(score, int | float) else "-",
            f"{d['decision_ms']:.2f}",
        )
    return t


def _first(rates: list[float] | None) -> float | None:
    return rates[0] if rates else None


def _rate(advertised: float | None, priced: float | None) -> str:
    if advertised is None:
        return "-"
    return f"{advertised:.0f}" + (f" ({priced:.0f})" if priced is not None else "")


@contextlib.contextmanager
def key_reader() -> Iterator[Any]:
    """A function waiting up to ``timeout_s`` for a key (None if none), with the
    terminal in cbreak mode for the duration; without a terminal, it only waits.

    Ctrl-C is read as ``q``: while this runs it sets a flag rather than raising
    KeyboardInterrupt wherever it lands (inside rich's Live starting up, the screen
    stayed switched and a test under load saw it now and then), and wakes the wait
    at once through the signal's wakeup descriptor."""
    stopped = threading.Event()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)  # as set_wakeup_fd wants it
    old_fd = signal.set_wakeup_fd(wake_w)
    old_handler = signal.signal(signal.SIGINT, lambda *_: stopped.set())
    keys = [sys.stdin.fileno()] if sys.stdin and sys.stdin.isatty() else []  # none: waits
    saved = [termios.tcgetattr(fd) for fd in keys]
    for fd in keys:
        tty.setcbreak(fd)

    def read(timeout_s: float) -> str | None:
        if not stopped.is_set():
            ready, _, _ = select.select([wake_r, *keys], [], [], timeout_s)
            if wake_r in ready:  # another signal's byte too: drained, or select spins
                os.read(wake_r, 512)
            typed = [fd for fd in keys if fd in ready]
            if typed and not stopped.is_set():
                return os.read(typed[0], 1).decode(errors="replace")
        return "q" if stopped.is_set() else None

    try:
        yield read
    finally:
        for fd, mode in zip(keys, saved, strict=True):
            termios.tcsetattr(fd, termios.TCSADRAIN, mode)
        signal.signal(signal.SIGINT, old_handler)
        signal.set_wakeup_fd(old_fd)
        os.close(wake_r)
        os.close(wake_w)


@click.command()
@client_addr
@click.option("--interval-s", type=float, default=1.0, show_default=True)
@click.option("--once", is_flag=True, help="Print one frame and exit (no live redraw).")
@keys_option
@ray_option
def top(
    router_addr: str, interval_s: float, once: bool, keys: str | None, ray_address: str | None
) -> None:
    """A live view of the cluster: workers, load, rates, recent routing decisions."""
    from tandem.client import Client, RouterUnavailable, TandemError

    router_addr, keys = via_ray(ray_address, router_addr, keys)

    if interval_s <= 0:
        raise click.UsageError("--interval-s must be > 0")
    rates = Rates()
    first: list[RouterUnavailable] = []  # no router at the start: say so and stop

    def frame(c: Client) -> RenderableType:
        try:
            st = c.status()
        except RouterUnavailable as exc:
            if rates.t == 0.0:
                first.append(exc)
            return render(None, rates, router_addr, str(exc))
        except TandemError as exc:
            return render(None, rates, router_addr, str(exc))
        rates.update(st.activity, time.monotonic())
        return render(st, rates, router_addr, live=not once)

    # Piped or captured (`tandem top --once > file`), rich would squeeze the tables into
    # 80 columns (or $COLUMNS, which harnesses set to 80) until no header could be read:
    # give them their natural width there.
    console = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
    try:
        client = Client(router_addr, connect_timeout_s=min(interval_s, 2.0), retries=0, keys=keys)
    except ValueError as exc:  # e.g. not a keys folder
        raise click.UsageError(str(exc)) from None
    with client as c:
        view = frame(c)
        if first:  # later, a lost router shows in the view while top asks again
            click.echo(f"error ({first[0].code}): {first[0].message}", err=True)
            sys.exit(1)
        if once:
            console.print(view)
            return
        # Ctrl-C may land anywhere (a status call, a redraw): catch it around it all.
        with (
            contextlib.suppress(KeyboardInterrupt),
            key_reader() as read_key,
            Live(view, console=console, screen=True) as live,
        ):
            while read_key(interval_s) not in ("q", "Q"):
                live.update(frame(c))
