"""The router's configuration: one frozen dataclass, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.broker.admission import AdmissionConfig
from tandem.broker.calibration import DECODE_ESTIMATES
from tandem.broker.policies import DEFAULT_POLICY, parse_policy
from tandem.common.peerlimit import MAX_PER_ADDRESS


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """The router's settings; `tandem router`'s options map onto these fields. The
    addresses it binds are not here: they are the live loop's (broker/router.py
    ``Router``), and the core (broker/core.py) that every driver runs binds none."""

    policy: str = DEFAULT_POLICY
    liveness_s: float = 3.0  # floor of a worker's liveness window (else 6 heartbeats)
    no_worker_wait_s: float = 30.0  # how long a request waits for a first worker
    decision_log: str | None = None
    calibrate: bool = True  # rates follow what requests take (broker/calibration.py)
    decode_estimate: str = "budget"  # "budget" | "ratio"
    cpus: tuple[int, ...] | None = None  # cores the router may run on (None: any)
    metrics_port: int | None = None  # serve /metrics there (0: any free port); None: off
    metrics_host: str = "127.0.0.1"
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    no_progress_s: float = 30.0  # a worker holding requests this long without progress
    keys: str | None = None  # CURVE keys folder (common/auth.py); None: no authentication
    # A request's Accepted waits this long for its first output and leaves in the same
    # frame (a worker that answers fast: one frame to the client, not two); 0: at once.
    accept_hold_ms: float = 2.0
    # The most the loop polls without sleeping after a turn, adapted to the traffic
    # (broker/spin.py): a sleeping thread can wake late on a VM; 0: never poll.
    spin_us: float = 2000.0
    # Connections one peer address may hold on each socket (common/peerlimit.py).
    max_connections_per_address: int = MAX_PER_ADDRESS

    def __post_init__(self) -> None:
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError("metrics_port must be in 0..65535")
        parse_policy(self.policy)  # raises ValueError on an unknown policy
        if self.decode_estimate not in DECODE_ESTIMATES:
            raise ValueError(f"decode_estimate must be one of {DECODE_ESTIMATES}")
        if not 0 <= self.spin_us <= 10_000:
            raise ValueError("spin_us must be in 0..10000")
        if self.max_connections_per_address < 1:
            raise ValueError("max_connections_per_address must be >= 1")
        if not 0 <= self.accept_hold_ms <= 1000:
            raise ValueError("accept_hold_ms must be in 0..1000")
        if self.liveness_s <= 0 or self.no_worker_wait_s < 0 or self.no_progress_s <= 0:
            raise ValueError("liveness_s, no_progress_s must be > 0 and no_worker_wait_s >= 0")
