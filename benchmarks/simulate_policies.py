"""Every scheduling policy on a synthetic saturated trace, in one run.

    python benchmarks/simulate_policies.py [--jobs-per-host 600] [--seed 7]

1 host x 8 GPUs without foreign use, and 4 hosts x 8 GPUs with foreign use; makespan
as a ratio of the lower bound and of greedy's (the baselines, measured in the same
run), occupancy, waits by job size, and the jobs GitLab's hourly cron drops (pending
over an hour with no online unpaused runner covering them). `dynamic without stand-by`
is runnerctl without its stand-by runner, for comparison; `easy-oracle` is EASY
backfilling that knows every duration (the limit no real controller reaches). Writes its table into
benchmarks/RESULTS.md between the simulate-policies markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from results_md import write_section

    from runnerctl.sim.simulator import POLICIES, SimConfig, Simulator
    from runnerctl.sim.trace import synthetic

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs-per-host", type=int, default=600)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    parser.add_argument("--runner-max-timeout-s", type=int, default=None,
                        help="every runner has this maximum job timeout, so the planner knows it "
                             "for every pending job (docs/controller.md); implies --no-write")
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only
    lines = ["## Scheduling policies in the simulator", "",
             f"`python benchmarks/simulate_policies.py` ({args.jobs_per_host} jobs per host, seed "
             f"{args.seed}, mixed 1/2/4/8-GPU jobs offered at 1.3x capacity in bursts). GitLab's "
             "hourly cron drops jobs pending over an hour that no online unpaused runner covers; "
             "makespan and occupancy count the jobs that ran, so where jobs were dropped the "
             "makespan can fall below the lower bound of the whole trace.", "",
             "| hosts | policy | makespan / lower bound | makespan / greedy | occupancy | "
             "never started | dropped by GitLab (1/2/4/8 GPUs) | max wait 1/2/4/8 GPUs (s) | sim time (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    checks = []
    for hosts, foreign_per_host in ((1, 0), (4, 2)):
        jobs, foreign = synthetic(args.jobs_per_host * hosts, hosts=hosts, seed=args.seed,
                                  foreign_per_host=foreign_per_host)
        results = {}
        configs = [(p, SimConfig(hosts=hosts, policy=p)) for p in POLICIES]
        configs.insert(1, (BARE, SimConfig(hosts=hosts, standby=False)))
        if args.runner_max_timeout_s is not None:
            configs = [(p, dataclasses.replace(c, pending_timeouts="cap",
                                               runner_max_timeout_s=float(args.runner_max_timeout_s)))
                       for p, c in configs]
        for policy, config in configs:
            started = time.process_time()
            results[policy] = (Simulator(jobs, config, foreign).run(), time.process_time() - started)
        greedy = float(results["greedy"][0]["makespan_s"])  # type: ignore[arg-type]
        for policy, (result, cpu) in results.items():
            makespan = float(result["makespan_s"])  # type: ignore[arg-type]
            waits = result["wait_max_s"]
            dropped = result["jobs_dropped_by_gpus"]
            assert isinstance(waits, dict) and isinstance(dropped, dict)
            wait_text = "/".join(f"{waits[n]:.0f}" if n in waits else "-" for n in (1, 2, 4, 8))
            drop_text = "/".join(str(dropped.get(n, 0)) for n in (1, 2, 4, 8))
            row = (f"| {hosts}x8{' + foreign' if foreign_per_host else ''} | {policy} | "
                   f"{makespan / float(result['lower_bound_s']):.3f} | {makespan / greedy:.3f} | "  # type: ignore[arg-type]
                   f"{result['gpu_occupancy']} | {result['jobs_never_started']} | {drop_text} | "
                   f"{wait_text} | {cpu:.1f} |")
            lines.append(row)
            print(row, flush=True)
        checks.append(_checks(f"{hosts}x8", results, len(jobs), sum(1 for j in jobs if j.gpus > 1)))
    print("\n".join(checks))
    if not args.no_write and args.runner_max_timeout_s is None:
        write_section("simulate-policies", [*lines, "", *checks])
    return 0


def _checks(name: str, results: dict[str, tuple[dict[str, object], float]], jobs: int, multi: int) -> str:
    """Issue 3's acceptance on this trace, as ratios (tests/test_simulator_acceptance.py
    asserts the same relations)."""
    dynamic, greedy, fifo = (results[p][0] for p in ("dynamic", "greedy", "fifo"))
    makespan = float(dynamic["makespan_s"])  # type: ignore[arg-type]
    wait8 = dynamic["wait_max_s"][8] / greedy["wait_max_s"][8]  # type: ignore[index]
    bare, partition = results[BARE][0]["jobs_dropped"], results["static-partition"][0]["jobs_dropped_by_gpus"]
    return (f"- {name}: dynamic completes {dynamic['jobs_completed']}/{jobs} jobs, GitLab drops "
            f"{sum(dynamic['jobs_dropped'].values())} of them (without the stand-by runner "  # type: ignore[union-attr]
            f"{sum(bare.values())}; static-partition loses {partition.get(8, 0)} 8-GPU jobs); makespan "  # type: ignore[union-attr]
            f"{makespan / float(greedy['makespan_s']):.3f}x greedy's (at most 1.05), "  # type: ignore[arg-type]
            f"{makespan / float(fifo['makespan_s']):.3f}x fifo's (below 1); longest 8-GPU wait "  # type: ignore[arg-type]
            f"{wait8:.3f}x greedy's (at most 1/3); static-singles never starts "
            f"{results['static-singles'][0]['jobs_never_started']} jobs ({multi} ask for several GPUs).")


BARE = "dynamic without stand-by"


if __name__ == "__main__":
    raise SystemExit(main())
