"""dynamic against greedy and easy-oracle on lab-like traces (issue 16), in one run.

    python benchmarks/simulate_lab.py [--jobs-per-host 200] [--seeds 1,2,3] [--shapes diurnal,flat,philly]
                                      [--load 0.85] [--no-write]

Traces from `runnerctl.sim.labtrace.lab_trace` (heavy-tailed durations, bursts of 50
1-GPU jobs, five users with their own job mixes, timeouts, foreign use, offered load
0.85 on average) on 1 x 8, 2 x 8 and 4 x 8 GPUs, in three shapes: `diurnal` (a lab's
working day: about 1.8 offered in working hours, 0.1 of that rate at night), `flat`
(arrivals uniform over the span) and `philly` (flat, with run times drawn from a
production GPU cluster's: the Philly trace's, `runnerctl.sim.philly`). For each shape,
trace and seed: dynamic's makespan as a ratio of greedy's and of easy-oracle's (both
measured in the same run), its p95 wait per GPU count against easy-oracle's, its longest
8-GPU wait against greedy's (and easy-oracle's against greedy's, what a clairvoyant
reservation gets), and issue 16's first acceptance point checked: makespan <= 1.03x
greedy's and <= 1.06x easy-oracle's, p95 wait of every GPU count <= 2x easy-oracle's (at
least a minute), longest 8-GPU wait <= 1/3 of greedy's.

The first table's `dynamic` knows every pending job's timeout from the trace
(`SimConfig.pending_timeouts` "trace"), which no real controller can: GitLab's jobs API
has none. A second table runs `dynamic` as a real controller could, against the same
greedy and easy-oracle runs: "none" (no pending timeout known: runnerctl by default,
without `[controller] runner_max_timeout_s`, with run-time estimates from its job
history), "none, by estimate" (the same, backfilling by those estimates:
`backfill_estimated`), "none, no history" (the same before any history) and "cap"
(every runner's maximum timeout set to
the trace's longest timeout, the lab's longest job class: every pending job ends by that),
"cap, 1-GPU 2 h" (the 1-GPU runners' cap at 2 h, so 1-GPU jobs may backfill; it
kills longer 1-GPU jobs, and its references run with the same caps) and "caps by size"
(2 h on 1-GPU runners, 3 h on 2- and 4-GPU ones, the backfill bounds, and the trace's
longest timeout on 8-GPU ones; the same for its references). Writes both into
benchmarks/RESULTS.md between the simulate-lab markers (not with --no-write).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Result = dict[str, object]

if TYPE_CHECKING:
    from runnerctl.sim.simulator import ForeignUse, SimConfig, TraceJob


def main() -> int:
    from results_md import write_section

    from runnerctl.sim.labtrace import lab_trace

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs-per-host", type=int, default=200)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated trace seeds")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--load", type=float, default=0.85,
                        help="offered load over the trace's span (RESULTS.md's figures: 0.85; "
                             "other loads with --no-write)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only
    if not 0 < args.load <= 10:
        parser.error("--load is from 0 (exclusive) to 10")
    if args.load != 0.85 and not args.no_write:
        parser.error("RESULTS.md's figures are at --load 0.85: give --no-write with another load")
    seeds = [int(s) for s in args.seeds.split(",")]
    shapes = args.shapes.split(",")
    if not shapes or any(s not in SHAPES for s in shapes):
        parser.error(f"--shapes takes {', '.join(SHAPES)}, comma-separated")
    lines = ["## Lab-like traces: dynamic against greedy and easy-oracle", "",
             f"`python benchmarks/simulate_lab.py` ({args.jobs_per_host} jobs per host, seeds "
             f"{args.seeds}; `runnerctl.sim.labtrace`: lognormal durations with sigma 1.5-1.8 killed at "
             "their timeout, bursts of 50 1-GPU jobs, five users, 4 foreign uses per host, offered "
             "load 0.85 on average; `diurnal`: arrivals on a working day, 09:00-19:00 on weekdays at 10 "
             "times the rate of other hours, so about 1.8 offered in working hours; `flat`: uniform "
             "arrivals; `philly`: uniform arrivals, and each job's run time drawn from the Philly "
             "trace's job run times (`runnerctl.sim.philly`, sigma about 2.0) scaled to its user's "
             "median). Waits in minutes; p95 per GPU count 1/2/4/8 as dynamic / easy-oracle; "
             "a check is `ok` when issue 16's bound holds. `dynamic` here reads every pending job's "
             "timeout from the trace, which no real controller can (the next table).", "",
             "| trace | seed | " + HEADER, "|---|---|---|---|---|---|---|---|---|"]
    faithful: list[str] = []  # the second table's rows
    summary: dict[str, list[str]] = {v: [] for v in VARIANTS}
    caps: set[float] = set()
    for shape in shapes:
        failed: dict[str, dict[str, int]] = {v: {} for v in VARIANTS}
        for hosts in (1, 2, 4):
            for seed in seeds:
                jobs, foreign = lab_trace(args.jobs_per_host * hosts, hosts=hosts, seed=seed, load=args.load,
                                          diurnal=shape == "diurnal",
                                          durations="philly" if shape == "philly" else "lognormal")
                cap = max(j.timeout or 0.0 for j in jobs)
                caps.add(cap)
                for variant, (result, refs, knows) in _variants(jobs, foreign, hosts=hosts, cap=cap).items():
                    row, checks = _row(result, refs)
                    for name, ok in checks.items():
                        failed[variant][name] = failed[variant].get(name, 0) + (not ok)
                    label = f"| {shape} {hosts}x8 + foreign | {seed} | "
                    (lines if variant == "trace" else faithful).append(
                        label + ("" if variant == "trace" else f"{knows} | ") + row)
                    print(f"{knows:24} {label}{row}", flush=True)
        runs_total = 3 * len(seeds)
        for variant in VARIANTS:
            holds = "; ".join(f"{name} holds in {runs_total - bad}/{runs_total}"
                              for name, bad in failed[variant].items())
            summary[variant] += ["", f"Checks over the {runs_total} {shape} runs, dynamic knowing "
                                     f"{KNOWS[variant]}: {holds}."]
            print(summary[variant][-1])
    intro = ["", "### The same traces, dynamic knowing only what a real controller can", "",
             "GitLab's jobs API gives no pending job's timeout, and GitLab fixes a job's timeout "
             "only when a runner picks it (min of the job's and the runner's `maximum_timeout`), so the "
             "table above, where `dynamic` reads every pending job's timeout from the trace, is an "
             "upper bound. Here `dynamic` knows of pending jobs' timeouts only what runnerctl's "
             "controller can know (`runnerctl simulate --pending-timeouts`), against the same greedy "
             "and easy-oracle runs: **`none` is what a real runnerctl achieves with default "
             "settings**, its runners without a maximum job timeout (its controller then knows no pending "
             "job's timeout: no backfill, and size credits only for jobs whose project and job name "
             "never ran over 30 minutes lately, `controller.estimates`; each user's jobs of one "
             "size share a name here); `none, by estimate` is the same with `[controller.planner] "
             "backfill_estimated = true` (jobs backfill drains by their name's longest recent run, their "
             "runner's maximum timeout set to end at the drain's end; the row counts the jobs GitLab "
             "killed there, docs/controller.md \"Backfill by estimate\"); `none, no history` is the same "
             "controller before any job of "
             "a name ended (size credits for all, as runnerctl before run-time estimates); `cap` is "
             "runnerctl with `[controller] "
             "runner_max_timeout_s` at the trace's longest timeout (the lab's longest job class) for every "
             "size, which its runners then have, so every pending job is known to end by it (age order; no "
             "backfill either, as no running job ends later than the cap). The cap in these traces: "
             f"{', '.join(f'{c / 3600:g} h' for c in sorted(caps))}. `cap, 1-GPU 2 h` sets the 1-GPU "
             "runners' maximum timeout to 2 h instead (`runner_max_timeout_s` \"1\" = 7200, "
             "`backfill_max_s`), so 1-GPU jobs may backfill "
             "blocks drained behind longer jobs, as docs/controller.md suggests; it kills the 1-GPU "
             "jobs that would run longer (the trace's count in the row) before their own timeout, and the "
             "references of that row run with the same caps. `caps by size` also caps the 2- and "
             "4-GPU runners, at 3 h (`backfill_blocks_max_s`), so pairs and quads may backfill as well "
             "(the 8-GPU runners keep the trace's longest timeout); its references likewise.", "",
             "| trace | seed | planner knows | " + HEADER, "|---|---|---|---|---|---|---|---|---|---|"]
    faithful_summary = [line for variant in VARIANTS[1:] for line in summary[variant]]
    section = [*lines, *summary["trace"], *intro, *faithful, *faithful_summary]
    if not args.no_write:
        write_section("simulate-lab", section)
    return 0


SHAPES = ("diurnal", "flat", "philly")  # arrivals on a working day or flat; Philly run times
# what dynamic knows of pending jobs' timeouts
VARIANTS = ("trace", "none", "none, by estimate", "none, no history", "cap", "cap, 1-GPU 2 h", "caps by size")
KNOWS = {"trace": "the trace's timeouts (an upper bound)",
         "none": "no pending timeout, run times from its history (runnerctl's defaults: no "
                 "runner_max_timeout_s)",
         "none, by estimate": "no pending timeout, backfill by its history's estimates "
                              "(`backfill_estimated = true`)",
         "none, no history": "no pending timeout and no history (a controller's first day)",
         "cap": "the runners' maximum timeout",
         "cap, 1-GPU 2 h": "the runners' maximum timeouts, 2 h on 1-GPU runners",
         "caps by size": "the runners' maximum timeouts, 2 h on 1-GPU, 3 h on 2- and 4-GPU runners"}
SINGLES_CAP_S = 7200.0  # the 1-GPU runners' maximum timeout (= PlanPolicy.backfill_max_s)
BLOCKS_CAP_S = 10800.0  # the 2- and 4-GPU runners' in `caps by size` (= PlanPolicy.backfill_blocks_max_s)


def _variants(jobs: list[TraceJob], foreign: list[ForeignUse], *, hosts: int,
              cap: float) -> dict[str, tuple[Result, dict[str, Result], str]]:
    """Per variant: dynamic's result, the greedy and easy-oracle results it is held
    against, and the row's label. `cap, 1-GPU 2 h` kills the 1-GPU jobs that would run
    longer, and its references run with the same caps (they lose the same work)."""
    from runnerctl.settings import PlanPolicy
    from runnerctl.sim.simulator import SimConfig, Simulator

    def run(config: SimConfig) -> Result:
        return Simulator(jobs, config, foreign).run()

    base = SimConfig(hosts=hosts)
    refs = {p: run(dataclasses.replace(base, policy=p)) for p in ("greedy", "easy-oracle")}
    capped = dataclasses.replace(base, pending_timeouts="cap", runner_max_timeout_s=cap)
    singles = dataclasses.replace(capped, runner_max_timeout_by_gpus=((1, SINGLES_CAP_S),))
    by_size = dataclasses.replace(capped, runner_max_timeout_by_gpus=(
        (1, SINGLES_CAP_S), (2, BLOCKS_CAP_S), (4, BLOCKS_CAP_S)))

    def over(caps: dict[int, float]) -> int:  # jobs of the trace that run longer than their cap
        return sum(min(j.duration, j.timeout or j.duration) > caps.get(j.gpus, cap) for j in jobs)

    estimated = run(dataclasses.replace(base, pending_timeouts="none",
                                        plan_policy=PlanPolicy(backfill_estimated=True)))

    def capped_refs(config: SimConfig) -> dict[str, Result]:
        return {p: run(dataclasses.replace(config, policy=p)) for p in refs}

    return {"trace": (run(base), refs, "trace"),
            "none": (run(dataclasses.replace(base, pending_timeouts="none")), refs, "none"),
            "none, by estimate": (estimated, refs,
                                  f"none, by estimate ({estimated['jobs_killed_at_deadline']} killed)"),
            "none, no history": (run(dataclasses.replace(base, pending_timeouts="none", history=False)),
                                 refs, "none, no history"),
            "cap": (run(capped), refs, "cap"),
            "cap, 1-GPU 2 h": (run(singles), capped_refs(singles),
                               f"cap, 1-GPU 2 h ({over({1: SINGLES_CAP_S})} over the cap)"),
            "caps by size": (run(by_size), capped_refs(by_size),
                             f"caps by size ({over(dict(by_size.runner_max_timeout_by_gpus))} over a cap)")}
HEADER = ("makespan / greedy (<= 1.03) | makespan / easy-oracle (<= 1.06) | "
          "p95 wait dynamic / easy-oracle 1/2/4/8 (min) | worst p95 ratio (<= 2) | "
          "max 8-GPU wait / greedy's (<= 1/3) | easy-oracle's / greedy's | dropped |")


def _row(dynamic: Result, runs: dict[str, Result]) -> tuple[str, dict[str, bool]]:
    """The table's cells after the trace's (one `dynamic` run against the run's references)."""
    greedy, easy = runs["greedy"], runs["easy-oracle"]
    makespan = _f(dynamic["makespan_s"])
    vs_greedy, vs_easy = makespan / _f(greedy["makespan_s"]), makespan / _f(easy["makespan_s"])
    p95, p95_easy = _d(dynamic["wait_p95_s"]), _d(easy["wait_p95_s"])
    ratios = [p95[n] / max(p95_easy[n], 60.0) for n in p95 if n in p95_easy]  # a minute's floor
    worst = max(ratios, default=0.0)
    max8, max8_greedy, max8_easy = (_d(r["wait_max_s"]).get(8, 0.0) for r in (dynamic, greedy, easy))
    starve = max8 / max8_greedy if max8_greedy else 0.0
    easy_starve = max8_easy / max8_greedy if max8_greedy else 0.0
    waits = "/".join(f"{p95[n] / 60:.0f}/{p95_easy.get(n, 0.0) / 60:.0f}" if n in p95 else "-"
                     for n in (1, 2, 4, 8))
    dropped = dynamic["jobs_dropped"]
    assert isinstance(dropped, dict)
    checks = {"makespan <= 1.03x greedy": vs_greedy <= 1.03, "makespan <= 1.06x easy-oracle": vs_easy <= 1.06,
              "p95 wait <= 2x easy-oracle": worst <= 2.0, "8-GPU max wait <= 1/3 greedy": starve <= 1 / 3}
    marks = [("ok" if ok else "FAIL") for ok in checks.values()]
    row = (f"{vs_greedy:.3f} {marks[0]} | {vs_easy:.3f} {marks[1]} | {waits} | "
           f"{worst:.2f} {marks[2]} | {starve:.2f} {marks[3]} | {easy_starve:.2f} | "
           f"{sum(dropped.values())} |")
    return row, checks


def _f(value: object) -> float:
    assert isinstance(value, (int, float))
    return float(value)


def _d(value: object) -> dict[int, float]:
    assert isinstance(value, dict)
    return {int(k): float(v) for k, v in value.items()}


if __name__ == "__main__":
    raise SystemExit(main())
