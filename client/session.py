"""What the sync and async clients share: building Submits and assembling results."""

from __future__ import annotations

import difflib
import uuid
from dataclasses import dataclass, field
from typing import Any

from tandem.client.checks import check_submit
from tandem.client.errors import TandemError, from_error
from tandem.common import protocol as p


@dataclass
class Result:
    """A finished generation."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: p.FinishReason
    stats: dict[str, Any]
    worker: str | None = None
    # One per output token when the request asked for logprobs (SamplingParams.logprobs).
    logprobs: list[p.TokenLogprob] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "worker": self.worker,
            "stats": self.stats,
        }


@dataclass(frozen=True)
class Delta:
    """A piece of a streamed generation."""

    token_ids: list[int]
    text: str
    logprobs: list[p.TokenLogprob] | None = None  # aligned with token_ids, when asked for


def make_submit(
    prompt: str | None = None,
    *,
    tokens: list[int] | None = None,
    messages: list[dict[str, Any]] | None = None,
    request_id: str | None = None,
    stream: bool = True,
    worker: str | None = None,
    sampling: p.SamplingParams | None = None,
    **params: Any,
) -> p.Submit:
    """A Submit with a fresh request id, as every call of the client libraries (and
    the gateway) builds it. ``params``: SamplingParams fields (max_tokens,
    temperature, ...), or a whole ``sampling``; a name SamplingParams lacks is a
    TypeError naming it. Raises BadRequest, naming the field, for a value the
    router's decoder would refuse (client/checks.py)."""
    if sampling is None:
        sampling = sampling_params(**params)
    elif params:
        raise TypeError(f"give sampling= or its fields {sorted(params)}, not both")
    submit = p.Submit(
        request_id=request_id or uuid.uuid4().hex,
        prompt=prompt,
        tokens=tokens,
        messages=messages,
        sampling=sampling,
        stream=stream,
        worker=worker,
    )
    check_submit(submit)  # BadRequest naming the field, before anything is sent
    return submit


def sampling_params(**params: Any) -> p.SamplingParams:
    """SamplingParams from its fields by name; ``stop`` may be one string. A name it
    does not have is a TypeError naming it (and the nearest field)."""
    unknown = sorted(set(params) - set(p.SamplingParams.__struct_fields__))
    if unknown:
        near = difflib.get_close_matches(unknown[0], p.SamplingParams.__struct_fields__, 1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise TypeError(f"SamplingParams has no field {unknown[0]!r}{hint}")
    stop = params.get("stop")
    if isinstance(stop, str):  # one stop string, not its characters
        params["stop"] = [stop]
    elif isinstance(stop, tuple):
        params["stop"] = list(stop)
    return p.SamplingParams(**params)


@dataclass
class Assembly:
    """Folds the router's messages for one request into a Result."""

    request_id: str
    worker: str | None = None
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    result: Result | None = None
    logprobs: list[p.TokenLogprob] | None = None  # when the request asked for them

    def apply(self, msg: p.Message) -> Delta | None:
        """Update from one message; returns a Delta for token messages, raises on Error."""
        if isinstance(msg, p.Accepted):
            self.worker = msg.worker_id
        elif isinstance(msg, p.TokenDelta):
            self.token_ids.extend(msg.token_ids)
            self.text.append(msg.text)
            if msg.logprobs is not None:  # extended in place, not copied per delta
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.extend(msg.logprobs)
            return Delta(list(msg.token_ids), msg.text, msg.logprobs)
        elif isinstance(msg, p.Done):
            self.result = Result(
                self.request_id,
                "".join(self.text),
                self.token_ids,
                msg.finish_reason,
                msg.stats.as_dict(),
                msg.stats.worker or self.worker,  # the last one, if it migrated
                self.logprobs,
            )
        elif isinstance(msg, p.Error):
            raise from_error(msg)
        else:
            raise TandemError(f"unexpected {msg.TYPE} for request {self.request_id}")
        return None


def request_id_of(msg: p.Message) -> str | None:
    return getattr(msg, "request_id", None)
