"""When a drain is worth starting: `PlanPolicy.drain_after_s` against draining at once.

    python benchmarks/drain_delay.py [--delays 0,1200,1800] [--no-write]

Two kinds of traces, each dynamic against greedy measured in the same run:

- `simulate_policies.py`'s kind (`runnerctl.sim.trace.synthetic`: 1-10 minute jobs of
  1/2/4/8 GPUs offered at 1.3x in bursts, no timeouts), 600 jobs per host on 1 x 8 GPUs
  and on 4 x 8 GPUs with foreign use, seeds 1-5 and 7: makespan and the longest 8-GPU
  wait as ratios of greedy's;
- `simulate_lab.py`'s lab traces as a real controller without runner maximum timeouts
  sees them (`--pending-timeouts none`: no pending job's timeout known, so the delay
  applies to every multi-GPU job that did not come alone): how many of the 9 runs per
  shape keep every GPU count's p95 wait within 2x easy-oracle's and the makespan within
  1.03x greedy's, and the mean of the worst p95 ratio.

A delay of 0 is runnerctl before it (every drain at once). Writes the `drain-delay`
section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SEEDS = (1, 2, 3, 4, 5, 7)


def main() -> int:
    from results_md import write_section
    from simulate_lab import SHAPES, _d, _row

    from runnerctl.controller.plan import PlanPolicy
    from runnerctl.sim.labtrace import lab_trace
    from runnerctl.sim.simulator import SimConfig, Simulator
    from runnerctl.sim.trace import synthetic

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delays", default=f"0,{PlanPolicy().drain_after_s:g},1800",
                        help="comma-separated drain_after_s values (seconds)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only
    delays = [float(d) for d in args.delays.split(",")]
    lines = ["## When a drain starts (issue 16)", "",
             "`python benchmarks/drain_delay.py`: `PlanPolicy.drain_after_s` (a multi-GPU job whose "
             "timeout is unknown, and that did not come alone, drains a block only once it has waited "
             "this long; 0 drains at once, runnerctl before it). Short jobs: `simulate_policies.py`'s "
             "kind of trace (1-10 minute jobs offered at 1.3x, no timeouts), 600 jobs per host, seeds "
             f"{', '.join(map(str, SEEDS))}, 1 x 8 GPUs and 4 x 8 GPUs with foreign use, as ratios of "
             "greedy's in the same run. Lab: `simulate_lab.py`'s traces (200 jobs per host, seeds 1-3, "
             "1/2/4 hosts) with no pending timeout known (`none`), the runs per shape that keep every "
             "p95 within 2x easy-oracle's and the makespan within 1.03x greedy's.", "",
             "| drain_after_s | short jobs: mean makespan / greedy | mean longest 8-GPU wait / greedy "
             "| worst | runs over 1/3 | " + " | ".join(f"lab {s}: p95 ok, makespan ok, mean worst ratio"
                                                     for s in SHAPES) + " |",
             "|---" * (5 + len(SHAPES)) + "|"]
    short: dict[float, list[tuple[float, float]]] = {d: [] for d in delays}
    for hosts, foreign_per_host in ((1, 0), (4, 2)):
        for seed in SEEDS:
            jobs, foreign = synthetic(600 * hosts, hosts=hosts, seed=seed, foreign_per_host=foreign_per_host)
            base = SimConfig(hosts=hosts)
            greedy = Simulator(jobs, dataclasses.replace(base, policy="greedy"), foreign).run()
            cells = []
            for delay in delays:
                config = dataclasses.replace(base, plan_policy=PlanPolicy(drain_after_s=delay))
                result = Simulator(jobs, config, foreign).run()
                makespan = float(result["makespan_s"]) / float(greedy["makespan_s"])  # type: ignore[arg-type]
                wait8 = _d(result["wait_max_s"]).get(8, 0.0) / _d(greedy["wait_max_s"]).get(8, 1.0)
                short[delay].append((makespan, wait8))
                cells.append(f"{delay:g} s: {makespan:.3f} / {wait8:.2f}")
            print(f"short jobs {hosts}x8 seed {seed}: " + "; ".join(cells), flush=True)
    lab: dict[tuple[str, float], list[int | float]] = {}
    for shape in SHAPES:
        for hosts in (1, 2, 4):
            for seed in (1, 2, 3):
                jobs, foreign = lab_trace(200 * hosts, hosts=hosts, seed=seed, diurnal=shape == "diurnal",
                                          durations="philly" if shape == "philly" else "lognormal")
                base = SimConfig(hosts=hosts)
                refs = {p: Simulator(jobs, dataclasses.replace(base, policy=p), foreign).run()
                        for p in ("greedy", "easy-oracle")}
                for delay in delays:
                    config = dataclasses.replace(base, pending_timeouts="none",
                                                 plan_policy=PlanPolicy(drain_after_s=delay))
                    row, checks = _row(Simulator(jobs, config, foreign).run(), refs)
                    worst = float(row.split("|")[3].split()[0])
                    counts = lab.setdefault((shape, delay), [0, 0, 0.0])
                    counts[0] += checks["p95 wait <= 2x easy-oracle"]
                    counts[1] += checks["makespan <= 1.03x greedy"]
                    counts[2] += worst / 9
        print(f"lab {shape}: " + "; ".join(f"{d:g} s: {lab[(shape, d)][0]}/9 p95 ok" for d in delays),
              flush=True)
    for delay in delays:
        runs = short[delay]
        makespans, waits = [m for m, _ in runs], [w for _, w in runs]
        row = (f"| {delay:g} | {sum(makespans) / len(runs):.4f} | {sum(waits) / len(runs):.3f} | "
               f"{max(waits):.2f} | {sum(w > 1 / 3 for w in waits)}/{len(runs)} | "
               + " | ".join(f"{lab[(s, delay)][0]}/9, {lab[(s, delay)][1]}/9, {lab[(s, delay)][2]:.2f}"
                            for s in SHAPES) + " |")
        lines.append(row)
        print(row, flush=True)
    if not args.no_write:
        write_section("drain-delay", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
