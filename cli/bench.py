"""``tandem bench``: start clusters, run workloads under several policies, report.

``tandem bench [OPTIONS]`` runs a bench; ``tandem bench report RESULT.json``
re-renders the markdown report and plots of a finished one; ``tandem bench merge``
joins results. The work itself lives in ``bench/``; this module maps options onto it.
"""

from __future__ import annotations

import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from tandem.bench.workload import KINDS
from tandem.broker.policies import DEFAULT_POLICY
from tandem.cli.extras import BENCH_MODULES, require_extra

_DEFAULTS: dict[str, Any] = {
    "workers": (),
    "policies": ("forced:@fastest", DEFAULT_POLICY),
    "workload": "burst",
    "requests": (8,),
    "spacing_ms": 50.0,
    "rate": 1.0,
    "duration_s": 30.0,
    "bursts": 3,
    "gap_s": 10.0,
    "hit_mix": (1.0,),
    "prefix_tokens": 512,
    "prompt_tokens": 516,
    "output_tokens": 128,
    "same_prompt": False,
    "max_active": 4,
    "runs": 3,
    "trace": "",
    "length_scale": 16.0,
    "output_scale": 1.0,
    "time_scale": 1.0,
    "limit": 0,
    "ttft_slo_s": 2.0,
}


def _opt(*names: str, key: str, help: str, **kw: Any) -> Any:
    """An option whose default comes from the preset, else from _DEFAULTS."""
    show = _DEFAULTS[key]
    return click.option(*names, key, default=None, help=f"{help} [default: {show}]", **kw)


@click.group(invoke_without_command=True)
@click.option("--preset", type=click.Choice(["seed"]), default=None, help="A named protocol.")
@_opt("--worker", key="workers", multiple=True, help="BACKEND[:ITEM...], e.g. llama.cpp:threads=1")
@_opt(
    "--policy",
    key="policies",
    multiple=True,
    help="Router policy[+static|+calibrate][+ratio]; forced:@fastest = GPU.",
)
@_opt("--workload", key="workload", type=click.Choice(KINDS), help="Shape.")
@_opt("--requests", key="requests", type=int, multiple=True, help="burst size (repeatable)")
@_opt("--spacing-ms", key="spacing_ms", type=float, help="Gap between arrivals in a burst.")
@_opt("--rate", key="rate", type=float, help="poisson: requests per second.")
@_opt("--duration-s", key="duration_s", type=float, help="poisson: arrival window.")
@_opt("--bursts", key="bursts", type=int, help="onoff: number of bursts.")
@_opt("--gap-s", key="gap_s", type=float, help="onoff: idle seconds between bursts.")
@_opt("--hit-mix", key="hit_mix", type=float, multiple=True, help="Fraction sharing the prefix.")
@_opt("--prefix-tokens", key="prefix_tokens", type=int, help="Seeded prefix length.")
@_opt("--prompt-tokens", key="prompt_tokens", type=int, help="Prompt length.")
@_opt("--output-tokens", key="output_tokens", type=int, help="Tokens generated per request.")
@_opt("--same-prompt/--distinct-prompts", key="same_prompt", help="All hits send one prompt.")
@_opt("--max-active", key="max_active", type=int, help="Active requests per worker.")
@_opt("--trace", key="trace", type=click.Path(dir_okay=False), help="trace: Mooncake JSONL file.")
@_opt("--length-scale", key="length_scale", type=float, help="trace: prompt lengths / this.")
@_opt("--output-scale", key="output_scale", type=float, help="trace: output lengths / this.")
@_opt("--time-scale", key="time_scale", type=float, help="trace: arrival times / this.")
@_opt("--limit", key="limit", type=int, help="trace: first N requests (0: all).")
@_opt(
    "--ttft-slo-s", key="ttft_slo_s", type=float, help="Goodput counts requests with TTFT <= this."
)
@click.option("--sweep-max-active", default=None, help="Concurrency sweep, e.g. 1,2,4,8,16.")
@_opt("--runs", key="runs", type=int, help="Runs per case (+2 when CV > 5 %).")
@click.option("--rates", type=click.Choice(["measured", "advertised"]), default="measured",
              show_default=True, help="Worker rates the oracle bound uses.")  # fmt: skip
@click.option("--transport", type=click.Choice(["ipc", "tcp"]), default="ipc", show_default=True)
@click.option("--reuse-workers", is_flag=True,
              help="Start each group's workers once; every run gets a fresh router.")  # fmt: skip
@click.option("--seed", "rng_seed", type=int, default=0, show_default=True, help="Arrival RNG.")
@click.option("--keep-token-times", is_flag=True, help="Store every token's arrival time.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Result folder [default: bench-results/DATE-TIME].")  # fmt: skip
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--router-cpus", default=None, help="Pin each run's router to these cores (0-1).")
@click.option("--cpus", "bench_cpus", default=None,
              help="Pin this process (the load generator) to these cores.")  # fmt: skip
@click.pass_context
def bench(ctx: click.Context, /, **opts: Any) -> None:
    """Benchmark routing policies on a cluster this command starts (one per run)."""
    require_extra("bench", BENCH_MODULES, "tandem bench")
    if ctx.invoked_subcommand is not None:
        return
    from tandem.bench.run import run_bench
    from tandem.common.affinity import parse_cpus, pin

    try:
        cfg = build_config(ctx, opts)
        pin(parse_cpus(opts["bench_cpus"]) if opts["bench_cpus"] else None)
        if opts["router_cpus"]:
            parse_cpus(opts["router_cpus"])  # refused here, not in each run's router
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(opts["out_dir"] or f"bench-results/{stamp}")
    command = command_line(ctx)
    doc = run_bench(cfg, out, command, progress=not opts["no_progress"])
    from tandem.bench.report import headline

    for group in doc["groups"]:
        click.echo(f"{group['label']}: {headline(group) or '-'}", err=True)
    click.echo(f"wrote {out}/result.json, report.md and plots", err=True)


def command_line(ctx: click.Context) -> str:
    """``tandem bench`` plus the options given, rebuilt from click's parse (also right
    when invoked in-process, where sys.argv is someone else's)."""
    words = ["tandem", "bench"]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name or "") != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name or ""]
        if isinstance(param, click.Option) and param.is_flag:
            names = param.opts if value else param.secondary_opts or param.opts
            words.append(names[0])
            continue
        for v in value if isinstance(value, tuple) else (value,):
            words += [param.opts[0], str(v)]
    return shlex.join(words)


def build_config(ctx: click.Context, opts: dict[str, Any]) -> Any:
    """Preset values, overridden by options given on the command line."""
    from tandem.bench.experiment import BenchConfig
    from tandem.bench.presets import PRESETS
    from tandem.bench.spec import parse_workers
    from tandem.bench.trace import TraceScale
    from tandem.bench.workload import Workload

    v = dict(_DEFAULTS)
    v.update(PRESETS[opts["preset"]] if opts["preset"] else {})
    for key, value in opts.items():
        given = ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE
        if key in v and value not in (None, ()) and given:
            v[key] = value
    sweep = (
        tuple(int(x) for x in opts["sweep_max_active"].split(","))
        if opts["sweep_max_active"]
        else (v["max_active"],)
    )
    sizes = v["requests"] if v["workload"] != "poisson" else v["requests"][:1]
    workloads = tuple(
        Workload(
            kind=v["workload"],
            requests=n,
            spacing_s=v["spacing_ms"] / 1000,
            rate_rps=v["rate"],
            duration_s=v["duration_s"],
            bursts=v["bursts"],
            gap_s=v["gap_s"],
            hit_fraction=hit,
            prefix_tokens=v["prefix_tokens"],
            prompt_tokens=v["prompt_tokens"],
            output_tokens=v["output_tokens"],
            same_prompt=v["same_prompt"],
            trace=v["trace"],
            trace_scale=TraceScale(
                v["length_scale"], v["output_scale"], v["time_scale"], v["limit"]
            ),
        )
        for n in sizes
        for hit in v["hit_mix"]
    )
    return BenchConfig(
        workers=parse_workers(v["workers"]),
        workloads=workloads,
        policies=tuple(v["policies"]),
        max_active=sweep,
        runs=v["runs"],
        rates=opts["rates"],
        transport=opts["transport"],
        keep_token_times=opts["keep_token_times"],
        seed=opts["rng_seed"],
        preset=opts["preset"],
        router_cpus=opts["router_cpus"],
        ttft_slo_s=v["ttft_slo_s"],
        reuse_workers=opts["reuse_workers"],
    )


@bench.command("report")
@click.argument("result", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where to write report.md and plots [default: beside RESULT].")  # fmt: skip
def report(result: str, out_dir: str | None) -> None:
    """Re-render report.md and the plots of RESULT.json."""
    import json

    from tandem.bench.run import write_outputs

    doc = json.loads(Path(result).read_text())
    files = write_outputs(doc, Path(out_dir) if out_dir else Path(result).parent)
    click.echo(f"wrote {', '.join(str(f) for f in files[:3])}{' ...' if len(files) > 3 else ''}",
               err=True)  # fmt: skip


@bench.command("merge")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Where to write the merged result.json, report.md and plots.")  # fmt: skip
@click.option("--policy", "policies", multiple=True, help="Keep only these router policies.")
def merge(results: tuple[str, ...], out_dir: str, policies: tuple[str, ...]) -> None:
    """Merge RESULT.json files of the same workers (a sweep finished in two calls, ...)."""
    import json

    from tandem.bench.merge import merge_results
    from tandem.bench.run import save, write_outputs

    try:
        doc = merge_results([json.loads(Path(r).read_text()) for r in results], policies)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    save(doc, Path(out_dir))
    write_outputs(doc, Path(out_dir))
    n_runs = sum(len(c["runs"]) for g in doc["groups"] for c in g["cases"])
    click.echo(f"merged {len(results)} results: {len(doc['groups'])} groups, {n_runs} runs "
               f"-> {out_dir}", err=True)  # fmt: skip


@bench.command("twin-oracle")
@click.argument("result", type=click.Path(exists=True, dir_okay=False))
@click.option("--budget", type=int, default=400, show_default=True,
              help="Twin replays per arrival schedule (when not exhaustive).")  # fmt: skip
@click.option("--served-from", type=click.Choice(["placement", "shared", "all", "run"]),
              default="placement", show_default=True, help="The device model, a median "
              "over a group's runs: split placements on the runs that used every worker "
              "and one-worker placements on the runs of that worker alone; or one model "
              "for all placements from the shared runs / all runs; or, 'run', each run "
              "on the speeds served in that run (a search per run).")  # fmt: skip
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: beside RESULT].")  # fmt: skip
def twin_oracle(result: str, budget: int, served_from: str, out_dir: str | None) -> None:
    """Add the twin's best placement to every run of RESULT.json (twin/oracle.py).

    Needs runs with served rates (benches since --reuse-workers landed); replays
    the runs' arrivals through the twin, pinned, over the workers' served speeds."""
    import json

    from tandem.bench.run import make_encoder, save, write_outputs
    from tandem.bench.spec import parse_worker
    from tandem.twin.oracle import annotate

    doc = json.loads(Path(result).read_text())
    encode = make_encoder(parse_worker(w["spec"], set()) for w in doc["config"]["workers"])

    def say(label: str, index: int, res: dict) -> None:
        click.echo(f"{label} run {index + 1}: best {res['makespan_s']:.2f} s {res['requests']}, "
                   f"own {res['own_makespan_s']:.2f} s", err=True)  # fmt: skip

    n = annotate(doc, encode, budget, progress=say, served_from=served_from)
    out = Path(out_dir) if out_dir else Path(result).parent
    save(doc, out)
    write_outputs(doc, out)
    click.echo(f"{n} runs got a twin oracle; wrote {out}/result.json and report.md", err=True)
