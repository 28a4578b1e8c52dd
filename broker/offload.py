"""Work the core hands to its driver to do beside the loop: tokenizing large prompts.

The core owns no thread: it asks an ``Offload`` whether a request's prompt should be
tokenized beside the loop, starts the job, and takes the finished jobs back when the
driver says some are done. The live router's offload is a small thread pool
(broker/tokenize.py); a driver without threads (the twin, a core pumped by hand in a
test) gives none, and every prompt is tokenized as it is routed (``Inline``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from tandem.broker.requests import ClientRequest, PromptTokenizer

Key = tuple[bytes, str]  # (client identity, request id)


class Offload(Protocol):
    """The requests whose prompts are being tokenized beside the loop, by key."""

    units: int  # prompt units of the jobs (admission counts them as pending)

    def wants(self, req: ClientRequest) -> bool:
        """Whether ``req``'s prompt is worth tokenizing beside the loop."""
        ...

    def start(self, req: ClientRequest, tokenizer: PromptTokenizer) -> None:
        """Begin tokenizing ``req``'s prompt (only when ``wants`` said so)."""
        ...

    def finished(self) -> Iterator[tuple[ClientRequest, list[int] | BaseException]]:
        """The jobs done since the last call, in the order they were started, each
        with its token ids or the exception that ended it."""
        ...

    def cancel(self, key: Key) -> ClientRequest | None:
        """Drop the job of ``key``; its request, or None when there is none."""
        ...

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...


class Inline:
    """No tokenizing beside the loop: every prompt is tokenized as it is routed (for a
    driver without threads, such as the twin or a core pumped by hand)."""

    units = 0

    def wants(self, req: ClientRequest) -> bool:
        return False

    def start(self, req: ClientRequest, tokenizer: PromptTokenizer) -> None:
        raise RuntimeError("nothing is tokenized beside the loop")  # wants() said no

    def finished(self) -> Iterator[tuple[ClientRequest, list[int] | BaseException]]:
        return iter(())

    def cancel(self, key: Key) -> ClientRequest | None:
        return None

    def __contains__(self, key: object) -> bool:
        return False

    def __len__(self) -> int:
        return 0
