"""Large prompts tokenized beside the router's loop, not on it: the live loop's
``Offload`` (broker/offload.py; the core owns no thread).

Tokenizing a 1 Mi-character prompt takes ~0.9 s here; on the loop, 16 of them
stood every stream still for 13.9 s (docs/results/reliability.md). A request whose
prompt is longer than ``OFF_LOOP_CHARS`` leaves the pending queue for a small pool
of threads when its turn to be routed comes, and goes back to the queue's head,
tokens in hand, when they are ready; requests behind it are routed meanwhile. The
tokenizers library releases the GIL while it encodes a batch
(``TextTokenizer.encode(release_gil=True)``), so the loop runs on during the work.

A finished job writes a byte to a socket pair the loop polls with its sockets, so
the loop wakes for it at once (sockets, not a pipe: a router dropped without
``close``, as tests do, gives their descriptors back when collected). A cancel
while a prompt is tokenized drops the job: its result, when it comes, is thrown
away.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from tandem.broker.admission import prompt_chars, prompt_units
from tandem.broker.offload import Key
from tandem.broker.requests import ClientRequest, PromptTokenizer, prompt_tokens

# Below about 1 Ki characters a prompt costs the loop less inline than the pool's
# hand-off; above, the pool wins more the longer it is (docs/results/reliability.md).
OFF_LOOP_CHARS = 1024
# One thread per two cores: the loop keeps a core (on 2 cores, two tokenizing threads
# stalled a stream up to 0.2 s); the threads run at a lower priority, for the same reason.
THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))
NICE = 10


def _yield_to_the_loop() -> None:
    """Lower this pool thread's priority (Linux: per thread), so that the loop wins
    a core whenever it has work."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


class Tokenizing:
    """The router loop's ``Offload`` (broker/offload.py): the requests whose prompts are
    being tokenized off the loop, by key, on a pool of threads the loop owns."""

    def __init__(self, threads: int = THREADS, off_loop_chars: int = OFF_LOOP_CHARS) -> None:
        self.off_loop_chars = off_loop_chars
        self._pool = ThreadPoolExecutor(
            threads, thread_name_prefix="tandem-tokenize", initializer=_yield_to_the_loop
        )
        self.wake, self._waker = socket.socketpair()  # the loop polls ``wake``
        self.wake.setblocking(False)
        self.fd = self.wake.fileno()  # zmq.Poller reports a native socket by its descriptor
        self._waker.setblocking(False)
        self._jobs: dict[Key, tuple[ClientRequest, Future[list[int]]]] = {}
        self.units = 0  # prompt units of the jobs (admission counts them as pending)

    def wants(self, req: ClientRequest) -> bool:
        return req.tokens is None and prompt_chars(req.submit) > self.off_loop_chars

    def start(self, req: ClientRequest, tokenizer: PromptTokenizer) -> None:
        job = self._pool.submit(prompt_tokens, req.submit, tokenizer, True)
        self._jobs[(req.client, req.submit.request_id)] = (req, job)
        self.units += prompt_units(req.submit)
        job.add_done_callback(self._wake)

    def _wake(self, job: Future[list[int]]) -> None:
        # From a pool thread. OSError: closed (the router has stopped), or full (a
        # byte already waits: the loop will wake).
        with contextlib.suppress(OSError):
            self._waker.send(b"\x01")

    def finished(self) -> Iterator[tuple[ClientRequest, list[int] | BaseException]]:
        """The jobs done since the last call, in the order they were started, each
        with its token ids or the exception that ended it."""
        with contextlib.suppress(BlockingIOError):  # drained
            while self.wake.recv(4096):
                pass
        done = [key for key, (_, job) in self._jobs.items() if job.done()]
        for key in done:
            req, job = self._jobs.pop(key)
            self.units -= prompt_units(req.submit)
            error = job.exception()
            yield req, (error if error is not None else job.result())

    def cancel(self, key: Key) -> ClientRequest | None:
        """Drop the job of ``key``; its request, or None when there is none."""
        held = self._jobs.pop(key, None)
        if held is None:
            return None
        req, job = held
        job.cancel()  # not started yet: never runs; running: its result is dropped
        self.units -= prompt_units(req.submit)
        return req

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.wake.close()
        self._waker.close()
