"""The join tokens ``tandem serve`` hands out, and the check of a presented secret:
pure (the caller passes the time), so tests drive it on any clock.

A token admits ONE host: the first key that presents its secret within ``ttl_s``
uses it up. That same key may present it again later (a rebooted host re-running
the printed command: it holds its key pair already, so nothing new is granted);
any other key is refused ("used"). At most ``max_kept`` tokens are remembered
(used, expired and live together, the oldest forgotten first): a forgotten token
reads "unknown".
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from tandem.common.join import SECRET_BYTES, JoinToken, secret_digest

TOKEN_TTL_S = 3600.0  # an unused token admits nobody after an hour
MAX_KEPT = 256


@dataclass
class Issued:
    digest: bytes  # sha256 of the secret: the secret itself is never kept
    expires_s: float
    used_by: bytes | None = None  # the joiner's public key (Z85) once used
    node: str = ""

    def live(self, now: float) -> bool:
        return self.used_by is None and now < self.expires_s


@dataclass(frozen=True)
class Verdict:
    issued: Issued | None  # the token, when it admits the key
    reason: str = ""  # JoinRefused.reason when it does not
    repeat: bool = False  # the key that used it, again


class JoinTokens:
    def __init__(self, router_key: bytes, ttl_s: float = TOKEN_TTL_S, max_kept: int = MAX_KEPT):
        if ttl_s <= 0 or max_kept < 1:
            raise ValueError("ttl_s must be > 0 and max_kept >= 1")
        self.router_key, self.ttl_s, self.max_kept = router_key, ttl_s, max_kept
        self.issued: list[Issued] = []

    def issue(self, now: float) -> JoinToken:
        secret = secrets.token_bytes(SECRET_BYTES)
        self.issued.append(Issued(secret_digest(secret), now + self.ttl_s))
        del self.issued[: -self.max_kept]
        return JoinToken(self.router_key, secret)

    def redeem(self, secret: bytes, key: bytes, node: str, now: float) -> Verdict:
        """Whether ``secret`` admits the public key ``key``; uses the token up if so."""
        digest = secret_digest(secret)
        found = None
        for t in self.issued:  # every entry compared in constant time: no timing hint
            if hmac.compare_digest(t.digest, digest):
                found = t
        if found is None:
            return Verdict(None, "unknown")
        if found.used_by is not None:
            same = hmac.compare_digest(found.used_by, key)
            return Verdict(found, repeat=True) if same else Verdict(None, "used")
        if now >= found.expires_s:
            return Verdict(None, "expired")
        if any(t.node == node and t.used_by != key for t in self.issued if t.used_by):
            return Verdict(None, "node_taken")  # its workers' ids would clash: NODE-cpu0
        found.used_by, found.node = key, node
        return Verdict(found)

    def live(self, now: float) -> int:
        return sum(t.live(now) for t in self.issued)
