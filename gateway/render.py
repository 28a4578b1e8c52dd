"""tandem results -> OpenAI response objects and server-sent-event chunks.

One ``Reply`` per request knows its kind (chat or text completion), id, creation
time and model, and builds every object the answer needs in OpenAI's shapes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from tandem.client.session import Result
from tandem.common import protocol as p

# tandem's finish reasons in OpenAI's vocabulary: an end-of-generation token is a stop.
FINISH_REASONS = {"stop": "stop", "eos": "stop", "length": "length"}
DONE_EVENT = b"data: [DONE]\n\n"
# OpenAI's logprob for a token the model rules out: JSON has no -infinity.
LOGPROB_FLOOR = -9999.0


def usage(stats: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage object from a tandem Done's stats."""
    prompt = int(stats.get("prompt_tokens") or 0)
    completion = int(stats.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(stats.get("cached_tokens") or 0)},
    }


def finish_reason(reason: str) -> str:
    return FINISH_REASONS.get(reason, reason)


def _floored(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _chat_token(piece: str, logprob: float) -> dict[str, Any]:
    return {"token": piece, "logprob": _floored(logprob), "bytes": list(piece.encode())}


def chat_logprobs(lps: list[p.TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat ``choices[].logprobs`` for these tokens (a whole answer's or one
    chunk's). ``bytes``: the UTF-8 of the token's text as the worker decoded it."""
    content = []
    for t in lps:
        tops = [_chat_token(s, x) for _, s, x in t.top]
        content.append({**_chat_token(t.token, t.logprob), "top_logprobs": tops})
    return {"content": content, "refusal": None}


def completion_logprobs(lps: list[p.TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy completions ``choices[].logprobs`` for these tokens; ``offset``:
    the characters of output before the first (``text_offset`` counts from the
    completion's start: the prompt is not echoed)."""
    offsets = []
    for t in lps:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in lps],
        "token_logprobs": [_floored(t.logprob) for t in lps],
        "top_logprobs": [{s: _floored(x) for _, s, x in t.top} for t in lps],
        "text_offset": offsets,
    }


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Reply:
    chat: bool  # chat.completion(.chunk) or text_completion
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    _cut: tuple[bytes, bytes] | None = field(default=None, repr=False)
    _offset: int = 0  # completions: output characters before the next chunk's logprobs

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def complete(self, result: Result) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        choice: dict[str, Any] = {"index": 0, "logprobs": self._logprobs(result.logprobs)}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        choice["finish_reason"] = finish_reason(result.finish_reason)
        obj = "chat.completion" if self.chat else "text_completion"
        return {
            **self._head(obj),
            "choices": [choice],
            "usage": usage(result.stats),
            "system_fingerprint": None,
            "tandem": extras(result),
        }

    def _logprobs(self, lps: list[p.TokenLogprob] | None) -> dict[str, Any] | None:
        if lps is None:
            return None
        if self.chat:
            return chat_logprobs(lps)
        out = completion_logprobs(lps, self._offset)
        self._offset += sum(len(t.token) for t in lps)
        return out

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        role: bool = False,
        logprobs: list[p.TokenLogprob] | None = None,
    ) -> bytes:
        """One streamed chunk: new ``text`` (with its tokens' ``logprobs`` when asked
        for), the opening role (chat), or the finish reason."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = self._logprobs(logprobs)
        choice["finish_reason"] = finish_reason(finish) if finish else None
        return sse({**self._head(self._chunk_object), "choices": [choice]})

    def text_chunk(self, text: str) -> bytes:
        """``chunk(text)``, from a template cut once per request: a stream sends one
        chunk per token, and encoding only the text keeps the gateway's cost per token
        low (the overhead goal is >= 0.95x the Python client's tokens/s)."""
        if self._cut is None:
            marker = "\x00tandem-text\x00"
            head, tail = self.chunk(marker).split(json.dumps(marker).encode())
            self._cut = (head, tail)
        head, tail = self._cut
        return head + json.dumps(text).encode() + tail

    def usage_chunk(self, result: Result) -> bytes:
        """The last chunk when stream_options.include_usage: no choices, the usage."""
        return sse({**self._head(self._chunk_object), "choices": [], "usage": usage(result.stats)})

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def extras(result: Result) -> dict[str, Any]:
    """What tandem adds to a response: where it ran and how long it took."""
    st = result.stats
    return {
        "worker": result.worker,
        "ttft_s": st.get("ttft_s"),
        "e2e_s": st.get("e2e_s"),
        "queue_s": st.get("queue_s"),
    }
