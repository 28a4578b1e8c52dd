"""A blocking request in flight: sending it (with retries) and iterating its Deltas."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tandem.client.errors import RequestTimeout, TandemError
from tandem.client.session import Assembly, Delta, Result
from tandem.common import protocol as p

if TYPE_CHECKING:
    from tandem.client.sync import Client

WAIT_NOTICE_S = 1.0  # a request not accepted this fast: the client's ``on_wait`` hears why
WAIT_AGAIN_S = 2.0  # while the router holds it, ``on_wait`` hears the status this often


class Stream:
    """Iterate for Deltas; ``result`` holds the finished Result afterwards. Leaving
    the iteration before the end (``break``, an exception in the loop's body)
    cancels the request, as the AsyncClient does: its worker's slot is freed."""

    def __init__(self, client: Client, submit: p.Submit) -> None:
        self.client = client
        self.submit = submit
        self.request_id = submit.request_id
        self._asm = Assembly(submit.request_id)
        self._held = False  # the router said it holds the request (``on_wait`` heard why)
        self._send_with_retry()

    @property
    def result(self) -> Result:
        if self._asm.result is None:
            raise TandemError("the stream has not finished yet")
        return self._asm.result

    def __iter__(self) -> Iterator[Delta]:
        c = self.client
        rid = self.request_id
        if self._asm.result is None and rid not in c._open and not c._mail.get(rid):
            raise TandemError("this stream was left before its end: its request was cancelled")
        try:
            while self._asm.result is None:
                msg = self._while_held() if self._held else c._next(rid, c.timeout_s)
                if msg is None:
                    c.cancel(rid)
                    self._close()
                    raise RequestTimeout(f"no reply for {c.timeout_s}s", rid)
                try:
                    delta = self._asm.apply(msg)
                except TandemError:
                    self._close()
                    raise
                if delta is not None:
                    yield delta
            self._close()  # finished
        finally:
            if rid in c._open:  # the caller left mid-stream: free the worker's slot
                if not c._sock.sock.closed:
                    c.cancel(rid)
                self._close()

    def _while_held(self) -> p.Message | None:
        """The request's next message, while the router holds it: ``on_wait`` hears the
        router's status every WAIT_AGAIN_S meanwhile (a starting worker loads, then
        measures itself), until anything for the request comes or ``timeout_s``."""
        c = self.client
        deadline = time.monotonic() + c.timeout_s
        while (left_s := deadline - time.monotonic()) > 0:
            msg = c._next(self.request_id, min(WAIT_AGAIN_S, left_s))
            if msg is not None:
                self._held = False
                return msg
            c._send(p.StatusQuery())
            status = c._next(None, c.connect_timeout_s)
            if isinstance(status, p.StatusReply) and c.on_wait is not None:
                c.on_wait(status)
        return None

    def _close(self) -> None:
        """Finished or failed: forget its mailbox; late messages for it are dropped."""
        self.client._open.discard(self.request_id)
        self.client._mail.pop(self.request_id, None)

    def _send_with_retry(self) -> None:
        """Send; if nothing comes back in time, ask the router's status. An answer:
        the request waits there (e.g. for a first worker; ``on_wait`` hears it).
        Silence: send again on a fresh socket. No connection: RouterUnavailable."""
        c = self.client
        first_s = WAIT_NOTICE_S if c.on_wait is not None else c.connect_timeout_s
        try:
            for _attempt in range(c.retries + 1):
                c._check_connection()  # before it opens: an old close is not its loss
                c._open.add(self.request_id)
                since = time.monotonic()
                c._send(self.submit)
                msg = c._next(self.request_id, first_s, since)
                if msg is not None:
                    c._mail[self.request_id].appendleft(msg)  # Accepted (or Error): iter reads it
                    return
                c._mail.pop(None, None)
                c._send(p.StatusQuery())
                status = c._next(None, c.connect_timeout_s, since)
                if status is not None:  # the router is alive and holds the request
                    if c.on_wait is not None and isinstance(status, p.StatusReply):
                        c.on_wait(status)
                        self._held = True
                    return
                c._reconnect()
        except BaseException:
            self._close()  # e.g. BadRequest (too large): nothing stays open or watched
            raise
        self._close()
        raise RequestTimeout(f"the router at {c.address} did not accept the request")
