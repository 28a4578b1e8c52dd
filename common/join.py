"""The join exchange: how a machine outside the cluster gets a worker key the router
accepts, from a one-time token (``tandem join``; docs/PROTOCOL.md, "Joining").

A token is ``tdj1.`` and the URL-safe base64 of the router's CURVE public key (32
bytes) and a random secret (16 bytes). The joiner connects to the join service with
CURVE, the router's key from the token as the server key and a key pair of its own:
only the holder of the router's secret key can complete that handshake, so the
joiner knows it talks to the router it was invited to, and everything after the
handshake (the secret included) is encrypted. It sends a ``JoinRequest`` with the
secret; the service answers ``JoinAccepted`` (having authorized the joiner's public
key for the worker socket) or ``JoinRefused`` with the reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Annotated, Literal

import msgspec
from msgspec import Meta
from zmq.utils import z85

from tandem.common.validation import Label, NodeName

JOIN_VERSION = 1
TOKEN_PREFIX = "tdj1."
SECRET_BYTES = 16
KEY_BYTES = 32
MAX_JOIN_FRAME_BYTES = 4096  # the service's MAXMSGSIZE: a request is ~100 bytes
# Why a join is refused (JoinRefused.reason): the token (unknown, used, expired), the
# node name (node_taken: another host joined under it), the request (bad_request).
Refusal = Literal["unknown", "used", "expired", "node_taken", "bad_request"]


class BadToken(ValueError):
    """Text that is not a join token (mistyped, cut short): said before any connect."""


class JoinToken(msgspec.Struct, frozen=True):
    router_key: bytes  # Z85, 40 characters: the router's CURVE public key
    secret: bytes  # SECRET_BYTES random bytes

    def text(self) -> str:
        raw = z85.decode(self.router_key) + self.secret
        return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def parse(cls, text: str) -> JoinToken:
        text = text.strip()
        if not text.startswith(TOKEN_PREFIX):
            raise BadToken(f"not a tandem join token (they start {TOKEN_PREFIX!r})")
        body = text.removeprefix(TOKEN_PREFIX)
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != KEY_BYTES + SECRET_BYTES:
            raise BadToken("the join token is damaged (copy it whole, as tandem serve printed it)")
        return cls(z85.encode(raw[:KEY_BYTES]), raw[KEY_BYTES:])

    def fingerprint(self) -> str:
        """A short name for the router's key (the joiner's state folder)."""
        return key_fingerprint(self.router_key)


def key_fingerprint(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def secret_digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


class JoinRequest(msgspec.Struct, tag="join", forbid_unknown_fields=True):
    """Joiner -> service, after the CURVE handshake."""

    v: int
    secret: Annotated[bytes, Meta(min_length=SECRET_BYTES, max_length=SECRET_BYTES)]
    node: NodeName
    devices: Annotated[list[Label], Meta(max_length=64)] = []  # informational, for the screen


class JoinAccepted(msgspec.Struct, tag="accepted", forbid_unknown_fields=True):
    """Service -> joiner: its key is authorized; what its workers need."""

    v: int
    worker_addr: Label  # as the router binds it; a wildcard host means "the host you reached"
    model: Label = ""  # --model for the workers: a hub name, "" for the embedded default
    model_name: Label = ""  # the served model's file or folder name
    weights: Label = ""  # its digest (common.gguf_file.weights_digest); "" unknown
    portable: bool = True  # False: the model is a file on the router's host (give --model)


class JoinRefused(msgspec.Struct, tag="refused", forbid_unknown_fields=True):
    """Service -> joiner: nothing authorized, and why."""

    v: int
    reason: Refusal
    message: Annotated[str, Meta(max_length=1024)]


JoinReply = JoinAccepted | JoinRefused
_REQUEST = msgspec.msgpack.Decoder(JoinRequest)
_REPLY = msgspec.msgpack.Decoder(JoinReply)
encode = msgspec.msgpack.encode


def decode_request(frame: bytes) -> JoinRequest:
    """A JoinRequest; ValueError (worded for the joiner) for anything else."""
    try:
        msg = _REQUEST.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not a join request: {exc}") from None
    if msg.v != JOIN_VERSION:
        raise ValueError(f"join protocol {msg.v}, this router speaks {JOIN_VERSION}")
    return msg


def decode_reply(frame: bytes) -> JoinReply:
    try:
        return _REPLY.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"the join service's answer is not one this tandem reads: {exc}") from None
