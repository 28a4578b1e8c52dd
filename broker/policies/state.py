"""``tandem route explain``'s STATE.json, read into the same ``RouteRequest`` /
``WorkerView`` objects the router builds, so an explanation runs exactly the code
the live router runs."""

from __future__ import annotations

from typing import Any

from tandem.broker.policies.views import Load, RouteRequest, WorkerView


def state_from_json(state: Any) -> tuple[RouteRequest, list[WorkerView]]:
    """Parse a ``tandem route explain`` STATE document; ValueError says what is wrong.

    ``{"request": {"prompt_tokens", "max_tokens", "arrivals_before"?: [seconds]},
    "workers": [{"id",
    "prefill_rate", "decode_rate", "cached_tokens"?, "max_active"?, "device"?,
    "active"?: [{"prefill_remaining", "decode_remaining"}], "queued"?: [...]}]}``.
    ``decode_rate`` is one number or a list of aggregate tok/s by batch size
    (then ``max_active`` defaults to its length, else to 4).
    """
    if not isinstance(state, dict):
        raise ValueError("STATE must be a JSON object with 'request' and 'workers'")
    r = _obj(state.get("request"), "request")
    req = RouteRequest(
        _int(r, "prompt_tokens", "request", lo=1),
        _int(r, "max_tokens", "request"),
        _ages(r.get("arrivals_before", []), "request.arrivals_before"),
    )
    workers = state.get("workers")
    if not isinstance(workers, list) or not workers:
        raise ValueError("'workers' must be a non-empty list")
    views = [_worker_view(_obj(w, f"workers[{i}]"), f"workers[{i}]") for i, w in enumerate(workers)]
    ids = [v.id for v in views]
    if len(set(ids)) != len(ids):
        raise ValueError(f"worker ids must be unique, got {ids}")
    return req, views


def _ages(raw: Any, where: str) -> tuple[float, ...]:
    """Seconds before the request, newest first (as the decision log writes them)."""
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a list of seconds")
    ages = []
    for x in raw:
        if isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x < 1e6:
            raise ValueError(f"{where} must hold seconds >= 0, got {x!r}")
        ages.append(float(x))
    if ages != sorted(ages):
        raise ValueError(f"{where} must be newest first (ascending seconds)")
    return tuple(ages)


def _worker_view(w: dict[str, Any], where: str) -> WorkerView:
    wid = w.get("id")
    if not isinstance(wid, str) or not wid:
        raise ValueError(f"{where}.id must be a non-empty string")
    prefill = _rate(w.get("prefill_rate"), f"{where}.prefill_rate")
    raw = w.get("decode_rate")
    if isinstance(raw, list):
        if not raw:
            raise ValueError(f"{where}.decode_rate must not be empty")
        decode = tuple(_rate(x, f"{where}.decode_rate") for x in raw)
    else:
        decode = (_rate(raw, f"{where}.decode_rate"),)
    return WorkerView(
        id=wid,
        prefill_rate=prefill,
        decode_rates=decode,
        max_active=_int(
            w, "max_active", where, default=len(decode) if len(decode) > 1 else 4, lo=1
        ),
        device=str(w.get("device", "")),
        cached_tokens=_int(w, "cached_tokens", where, default=0),
        active=_loads(w.get("active", []), f"{where}.active"),
        queued=_loads(w.get("queued", []), f"{where}.queued"),
    )


def _loads(items: Any, where: str) -> tuple[Load, ...]:
    if not isinstance(items, list):
        raise ValueError(f"{where} must be a list")
    out = []
    for i, item in enumerate(items):
        x = _obj(item, f"{where}[{i}]")
        p = _int(x, "prefill_remaining", f"{where}[{i}]", default=0)
        out.append(Load(p, _int(x, "decode_remaining", f"{where}[{i}]", default=0)))
    return tuple(out)


def _obj(x: Any, where: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise ValueError(f"{where} must be an object")
    return x


def _int(d: dict[str, Any], key: str, where: str, default: int | None = None, lo: int = 0) -> int:
    v = d.get(key, default)
    if v is None:
        raise ValueError(f"{where}.{key} is required")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{where}.{key} must be an integer >= {lo}, got {v!r}")
    return v


def _rate(v: Any, where: str) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
        raise ValueError(f"{where} must be a positive number (tok/s), got {v!r}")
    return float(v)
