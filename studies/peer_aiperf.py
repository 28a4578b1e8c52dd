"""studies/peer.py's workloads driven by NVIDIA's aiperf instead of our own client.

aiperf (0.13.0, the client issue 40 measured with) runs in a virtual environment of
its own, outside the project (it is a study tool, with transformers, pandas and
more): ``python -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install
aiperf==0.13.0``. It needs a Hugging Face tokenizer folder and none can be
downloaded here: ``tokenizer_folder`` writes one from the GGUF itself (the
``tokenizer.json`` tandem's workers build from its vocabulary and merges, and the
chat template and end tokens from its metadata).

Each workload is one ``aiperf profile`` run over a ``single-turn`` input file of our
prompts (the same texts our client sends: 500 tokens once templated, a 400-token
shared prefix where asked), at the workload's concurrency for exactly its request
count, streaming, ``max_tokens`` = ``min_tokens`` = 128. aiperf counts output tokens
by re-tokenizing the streamed text with that tokenizer (not the server's usage).
Its own summary export (``profile_export_aiperf.json``) gives every number: latencies,
chunk gaps (``inter_chunk_latency``), and the usage each server reported (prompt,
cached and completion tokens, and how far the completion count is from aiperf's).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tandem.common.tokenizer import TokenizerSpec

AIPERF = Path("/tmp/aiperf-venv/bin/aiperf")
RUN_TIMEOUT_S = 1800


def tokenizer_folder(spec: TokenizerSpec, out: Path) -> Path:
    """A folder ``AutoTokenizer.from_pretrained`` loads offline: the GGUF's tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    doc = json.loads(spec.tokenizer_json)
    names = {t["id"]: t["content"] for t in doc.get("added_tokens", [])}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": spec.chat_template,
        "eos_token": names.get(spec.eos_ids[0]) if spec.eos_ids else None,
        "bos_token": names.get(spec.bos_id) if spec.bos_id is not None else None,
        "add_bos_token": spec.add_bos,
        "model_max_length": 8192,
    }
    (out / "tokenizer.json").write_text(spec.tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out


def write_inputs(prompts: list[str], output_tokens: int, path: Path) -> Path:
    """aiperf's ``single-turn`` JSONL: one request per prompt, in order."""
    rows = (json.dumps({"text": t, "output_length": output_tokens}) for t in prompts)
    path.write_text("\n".join(rows) + "\n")
    return path


def model_id(port: int) -> str:
    """The model name the server lists (aiperf sends it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
        return str(json.load(r)["data"][0]["id"])


def profile(
    port: int, prompts: list[str], conc: int, output_tokens: int, tokenizer: Path, out: Path
) -> dict[str, float]:
    """One aiperf run of ``prompts`` at ``conc``; its metrics in peer.py's summary keys."""
    out.mkdir(parents=True, exist_ok=True)
    model = model_id(port)
    inputs = write_inputs(prompts, output_tokens, out / "inputs.jsonl")
    cmd = [str(AIPERF), "profile", "--model", model, "--url", f"http://127.0.0.1:{port}",
           "--endpoint-type", "chat", "--streaming", "--use-legacy-max-tokens",
           "--tokenizer", str(tokenizer), "--input-file", str(inputs),
           "--custom-dataset-type", "single-turn", "--dataset-sampling-strategy", "sequential",
           "--concurrency", str(conc), "--request-count", str(len(prompts)),
           "--extra-inputs", f"min_tokens:{output_tokens}",
           "--extra-inputs", "temperature:0", "--extra-inputs",
           '{"stream_options": {"include_usage": true}}',
           "--export-level", "summary", "--output-artifact-dir", str(out), "--ui-type", "none",
           "--no-server-metrics", "--no-gpu-telemetry", "--no-auto-plot",
           "--request-timeout-seconds", str(RUN_TIMEOUT_S)]  # fmt: skip
    with open(out / "aiperf.log", "wb") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True,
                       timeout=RUN_TIMEOUT_S)  # fmt: skip
    return summary(out)


def summary(out: Path) -> dict[str, float]:
    """peer.py's keys from aiperf's summary export in ``out`` (times in seconds)."""
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"aiperf wrote no summary under {out} (see its aiperf.log)")
    doc = json.loads(found[0].read_text())

    def stat(tag: str, key: str, scale: float = 1e-3) -> float:
        return float((doc.get(tag) or {}).get(key) or 0.0) * scale

    return {
        "out_tok_s": stat("output_token_throughput", "avg", 1.0),
        "ttft_p50": stat("time_to_first_token", "p50"),
        "itl_p50": stat("inter_token_latency", "p50"),
        "itl_p99": stat("inter_token_latency", "p99"),
        "gap_p99": stat("inter_chunk_latency", "p99"),
        "gap_max": stat("inter_chunk_latency", "max"),
        "e2e_p50": stat("request_latency", "p50"),
        "tokens_min": stat("output_sequence_length", "min", 1.0),  # re-tokenized text
        "usage_tokens_min": stat("usage_completion_tokens", "min", 1.0),
        "usage_diff_pct_max": stat("usage_completion_tokens_diff_pct", "max", 1.0),
        "prompt_tokens_min": stat("usage_prompt_tokens", "min", 1.0),
        "prompt_tokens_max": stat("usage_prompt_tokens", "max", 1.0),
        "cached_mean": stat("usage_prompt_cache_read_tokens", "avg", 1.0),
        "requests": stat("request_count", "avg", 1.0),
        "errors": float(len(doc.get("error_summary") or [])),
    }
