"""The OpenAI-compatible gateway, end to end: the official `openai` SDK against a real
gateway + router + llama.cpp worker on the embedded model."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from tandem.broker.policies import DEFAULT_POLICY
from tandem.common.nodes import default_node
from tandem.launcher.cluster import Cluster, WorkerSpec, free_tcp_port
from tests.helpers import LLAMA_ARGS, needs_llama

openai = pytest.importorskip("openai")
pytestmark = [needs_llama, pytest.mark.model]

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def served():
    """A router with /metrics, one worker, and two gateways: open and keyed."""
    metrics_port = free_tcp_port()
    with Cluster(
        workers=[WorkerSpec("cpu0", LLAMA_ARGS)],
        router_args=["--metrics-port", str(metrics_port)],
    ) as c:
        c.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        c.url = c.start_gateway()
        # Keyed, and admitting one request at a time (for the 429 test).
        c.keyed_url = c.start_gateway("gateway-keyed", ("--api-key", KEY, "--max-concurrent", "1"))
        yield c


def sdk(url: str, key: str = "unused", cls=None):
    cls = cls or openai.OpenAI
    # No retries: a 5xx or 429 must reach the test as it was answered.
    return cls(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120.0)


def call(url: str, body: bytes | None = None) -> tuple[int, dict]:
    """Status and JSON body of a GET (or a POST of ``body``), errors included."""
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def scrape(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, keyed like the text format: name{a="x",b="y"}."""
    out = {}
    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def counting(n: int) -> str:
    """A prompt the small model continues by counting on from n + 6 (checked greedily)."""
    return ", ".join(str(n + i) for i in range(6)) + ","


def test_chat_completion_has_text_usage_and_ids(served):
    client = sdk(served.url)
    model = client.models.list().data[0].id
    assert client.models.retrieve(model).id == model
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name three primary colors."}],
        max_tokens=12,
        temperature=0,
    )
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.model == model and r.created > 0
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_adds_up_and_reports_usage(served):
    client = sdk(served.url)
    chunks = list(
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "Write a short poem about the sea."}],
            max_completion_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text.strip() and finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert len({c.id for c in chunks}) == 1


def test_completions_streamed_and_not_agree(served):
    client = sdk(served.url)
    kw = dict(
        model=client.models.list().data[0].id, prompt=counting(3), max_tokens=4, temperature=0
    )
    whole = client.completions.create(**kw)
    streamed = list(client.completions.create(**kw, stream=True))
    assert whole.object == "text_completion" and whole.choices[0].text.startswith(" 9")
    assert whole.usage.completion_tokens == 4 and whole.choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


def test_stop_strings_end_the_text_before_them(served):
    client = sdk(served.url)
    kw = dict(model=client.models.list().data[0].id, prompt=counting(20), temperature=0)
    free = client.completions.create(**kw, max_tokens=8).choices[0].text
    assert free.startswith(" 26, 27"), free
    r = client.completions.create(**kw, max_tokens=8, stop=["27"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == " 26, "
    chat = client.chat.completions.create(
        model=kw["model"],
        messages=[{"role": "user", "content": "Count from 1 to 10."}],
        max_tokens=40,
        temperature=0,
        stop="5",
    )
    assert "5" not in chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "stop"


def test_bad_requests_get_openai_errors_with_statuses(served):
    client = sdk(served.url)
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=msgs, n=2)
    assert e.value.status_code == 400 and e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=msgs, temperature=7)
    with pytest.raises(openai.BadRequestError) as e:  # 4096-token context, 5000-token budget
        client.chat.completions.create(model=model, messages=msgs, max_tokens=5000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=msgs)
    assert e.value.code == "model_not_found"
    status, body = call(f"{served.url}/v1/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


def test_api_key_is_required_when_set(served):
    with pytest.raises(openai.AuthenticationError) as e:
        sdk(served.keyed_url, "sk-wrong").models.list()
    assert e.value.status_code == 401
    status, body = call(f"{served.keyed_url}/v1/models")  # no Authorization header at all
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert sdk(served.keyed_url, KEY).models.list().data
    assert call(f"{served.keyed_url}/health")[0] == 200  # health stays open


def test_over_max_concurrent_is_a_429(served):
    client = sdk(served.keyed_url, KEY)
    kw = dict(model="SmolLM2-135M-Instruct.Q4_1.gguf", prompt="Once upon a time", temperature=0)
    with client.completions.create(
        **kw, max_tokens=500, stream=True, extra_body={"ignore_eos": True}
    ) as first:
        next(iter(first))  # admitted and running
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(**kw, max_tokens=2)
        assert e.value.status_code == 429
    # The first one is closed: once the gateway has seen the disconnect, a slot is free.
    for _ in range(100):
        try:
            r = client.completions.create(**kw, max_tokens=2)
            break
        except openai.RateLimitError:
            time.sleep(0.1)
    assert r.usage.completion_tokens == 2


def test_no_worker_is_a_503():
    """Starting: /health says so; a request waits at the router for a first worker,
    and is a 503 no_workers once the router's wait for one runs out."""
    with Cluster(router_args=["--no-worker-wait-s", "1"]) as empty:
        url = empty.start_gateway()
        status, body = call(f"{url}/health")
        assert status == 503 and body["status"] == "starting"
        with pytest.raises(openai.InternalServerError) as e:
            sdk(url).chat.completions.create(
                model="any", messages=[{"role": "user", "content": "hi"}]
            )
        assert e.value.status_code == 503 and e.value.code == "no_workers"


def test_32_concurrent_streams_each_get_their_own_text(served):
    client = sdk(served.url, cls=openai.AsyncOpenAI)

    async def one(n: int) -> tuple[int, str]:
        stream = await client.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1.gguf",
            prompt=counting(n),
            max_tokens=4,
            temperature=0,
            stream=True,
        )
        return n, "".join([c.choices[0].text async for c in stream])

    async def run() -> list[tuple[int, str]]:
        try:
            return await asyncio.gather(*(one(n) for n in range(1, 33)))
        finally:
            await client.close()

    results = asyncio.run(run())
    assert len(results) == 32
    wrong = [(n, text) for n, text in results if not text.startswith(f" {n + 6}")]
    assert not wrong


def test_client_disconnect_mid_stream_frees_the_worker_slot(served):
    body = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "prompt": "Once upon a time",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        r = conn.getresponse()
        assert r.status == 200
        got = [r.readline() for _ in range(6)]  # a few tokens: it is running
        assert any(line.startswith(b"data: {") for line in got)
        with served.client() as c:
            assert c.status().workers[0]["inflight"] == 1
        # Counted before the hang-up: a cancel may land before a scrape taken after it.
        before = scrape(served.metrics_url)
    finally:
        conn.sock.shutdown(socket.SHUT_RDWR)  # hang up mid-stream
        conn.close()
    # The connection is closed; the router must hear a cancel long before 1000 tokens.
    with served.client() as c:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            st = c.status()
            w = st.workers[0]
            if st.requests_in_flight == 0 and w["active"] == 0 and w["queued"] == 0:
                break
            time.sleep(0.1)
        assert st.requests_in_flight == 0 and w["active"] == 0, st
    after = scrape(served.metrics_url)
    cancelled = f'tandem_requests_total{{outcome="cancelled",policy="{DEFAULT_POLICY}"}}'
    assert after[cancelled] == before.get(cancelled, 0) + 1
    tokens = 'tandem_generation_tokens_total{worker="cpu0"}'
    assert after[tokens] - before[tokens] < 1000  # stopped early, not run to its budget


def test_metrics_parse_and_move_with_traffic(served):
    before = scrape(served.metrics_url)
    with served.client() as c:
        c.generate(counting(5), max_tokens=3, temperature=0.0, ignore_eos=True)
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.connect(served.client_addr)
        raw.send(b"not msgpack")  # a frame the router must refuse (and count)
        assert raw.poll(10_000) and raw.recv()
        raw.close(linger=0)
    after = scrape(served.metrics_url)
    w = '{worker="cpu0"}'
    assert (
        after[f"tandem_generation_tokens_total{w}"]
        == before.get(f"tandem_generation_tokens_total{w}", 0) + 3
    )
    routed = f'tandem_requests_routed_total{{policy="{DEFAULT_POLICY}",worker="cpu0"}}'
    assert after[routed] == before.get(routed, 0) + 1
    length = f'tandem_requests_total{{outcome="length",policy="{DEFAULT_POLICY}"}}'
    assert after[length] == before.get(length, 0) + 1
    ttft = f"tandem_time_to_first_token_seconds_count{w}"
    assert after[ttft] == before.get(ttft, 0) + 1
    assert after["tandem_routing_decision_seconds_count"] >= 1
    bad = 'tandem_frames_rejected_total{reason="malformed",source="client"}'
    assert after[bad] == before.get(bad, 0) + 1
    assert after["tandem_workers"] == 1
    node = default_node()  # the worker's machine labels its gauges (TANDEM_NODE unset here)
    wn = f'{{node="{node}",worker="cpu0"}}'
    assert after[f"tandem_worker_kv_capacity_tokens{wn}"] == 4096
    assert after[f"tandem_worker_cached_blocks{wn}"] >= 0
    labels = f'batch="1",node="{node}",source="advertised",worker="cpu0"'
    adv = f"tandem_worker_decode_tokens_per_second{{{labels}}}"
    assert after[adv] > 0


@pytest.mark.parametrize("quit_with", ["q", "ctrl-c"])
def test_top_shows_the_workers_and_quits(served, quit_with):
    pexpect = pytest.importorskip("pexpect")
    args = ["-m", "tandem", "top", "--router", served.client_addr, "--interval-s", "0.3"]
    env = {**os.environ, "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, args, dimensions=(40, 120), timeout=30, env=env)
    try:
        child.expect("cpu0")
        child.expect("req/s")
        child.sendintr() if quit_with == "ctrl-c" else child.send("q")
        child.expect(pexpect.EOF)
        child.wait()  # its exit status, not a close's signal to a process still exiting
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
