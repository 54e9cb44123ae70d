"""Fair share under a flood, for group and instance runners, fair share on and off.

    python benchmarks/simulate_fair.py [--seed 5] [--jobs 400] [--fair-weight-h 12]
                                       [--queue-step-min 5] [--seeds 20] [--weights-h 0,12,24]
                                       [--no-write]

A lab background on 2 hosts x 8 GPUs (`runnerctl.sim.labtrace`: its users but the
sweeper, each their own project, heavy-tailed durations with timeouts, foreign use,
offered load 0.8), plus a flood: a quarter into the trace one user submits 200 1-GPU
jobs at once while three others submit 3 jobs each in the next half hour. Reports the
three others' p95 wait with the flood as a ratio of their p95 wait on the same trace
without the flood (issue 16: within 1.5x), and Jain's index over all users' mean
bounded slowdowns (at least 0.8), with and without the flood, for GitLab
group runners (GitLab hands out the oldest job) and instance runners (fair by project),
runnerctl's fair share off and on. One seed's figures swing with small changes (a
drain's host decides whether the others wait), so a second table runs seeds 1 to
`--seeds` for each fair-share weight in `--weights-h` (instance runners, queue share
on): in how many the others' ratio holds, its median and worst, Jain's index, and the
makespan against fair share off. Writes the `simulate-fair` section of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from runnerctl.sim.simulator import SimConfig

HOUR = 3600.0
OTHERS = ("other1", "other2", "other3")


def main() -> int:
    from results_md import write_section

    from runnerctl.controller.fairshare import QUEUE_STEP_S, FairPolicy
    from runnerctl.sim.simulator import SimConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=400, help="background jobs (lab trace)")
    parser.add_argument("--fair-weight-h", type=float, default=12.0)
    parser.add_argument("--queue-step-min", type=float, default=QUEUE_STEP_S / 60,
                        help="fair share's queue step: minutes younger per GPU held or asked for ahead")
    parser.add_argument("--seeds", type=int, default=20, help="seeds 1..N of the second table (0: none)")
    parser.add_argument("--weights-h", default="0,12,24",
                        help="fair-share weights (h) of the second table, comma-separated; 0: off")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only
    try:
        weights = [float(w) for w in args.weights_h.split(",")]
    except ValueError:
        parser.error("--weights-h takes hours, comma-separated (0,12,24)")
    if args.seeds < 0 or any(not 0 <= w <= 10_000 for w in weights):
        parser.error("--seeds is 0 or more, --weights-h from 0 to 10000")
    background, foreign, flood, others = _trace(args.seed, args.jobs)
    hours = max(j.submit for j in background) / HOUR
    lines = ["## Fair share under a flood (issue 16)", "",
             f"`python benchmarks/simulate_fair.py` (seed {args.seed}, {hours:.0f} h of lab background "
             f"on 2x8 GPUs with foreign use: {len(background)} jobs of `runnerctl.sim.labtrace`'s users "
             f"but the sweeper, each their own project, offered load 0.8; a quarter in, "
             f"one user submits {len(flood)} 1-GPU jobs at once, three others {len(others)} jobs in "
             f"all; fair share: weight {args.fair_weight_h:g} h, half-life 7 days, queue step "
             f"{args.queue_step_min:g} min per GPU). `others p95` is the "
             "three others' p95 wait; the ratio divides it by the same configuration's figure "
             "without the flood (acceptance: at most 1.5). Jain's index is over every user's mean "
             "bounded slowdown (acceptance: at least 0.8). Fair share `usage only` is the same "
             "weight without the queue share (`--queue-step-min 0`, fair share before it).", "",
             "| runners | fair share | others p95 wait, no flood (s) | with flood (s) | ratio | "
             "Jain, no flood | Jain, flood | flood user's p50 wait (h) | makespan (h) | sim time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    checks = []
    for runner_type in ("group", "instance"):
        for label, weight_h, step_min in (("off", 0.0, 0.0), ("usage only", args.fair_weight_h, 0.0),
                                          ("on", args.fair_weight_h, args.queue_step_min)):
            config = SimConfig(hosts=2, runner_type=runner_type,
                               fair=FairPolicy(weight_s=weight_h * HOUR, queue_step_s=step_min * 60))
            started = time.process_time()
            calm, loud, ratio = _with_and_without(config, (background, foreign, flood, others))
            cpu = time.process_time() - started
            calm_p95, loud_p95 = _p95(calm, others), _p95(loud, others)
            users = loud["users"]
            assert isinstance(users, dict)
            jain = float(loud["jain_slowdown"])  # type: ignore[arg-type]
            calm_jain = float(calm["jain_slowdown"])  # type: ignore[arg-type]
            row = (f"| {runner_type} | {label} | {calm_p95:.0f} | {loud_p95:.0f} | "
                   f"{ratio:.2f} | {calm_jain:.3f} | {jain:.3f} | "
                   f"{users['flood']['wait_p50_s'] / HOUR:.1f} | "
                   f"{float(loud['makespan_s']) / HOUR:.1f} | {cpu:.1f} |")  # type: ignore[arg-type]
            lines.append(row)
            print(row, flush=True)
            checks.append(f"- {runner_type} runners, fair share {label}: others' p95 "
                          f"ratio {ratio:.2f} ({'holds' if ratio <= 1.5 else 'fails'} <= 1.5), "
                          f"Jain with the flood "
                          f"{jain:.3f} ({'holds' if jain >= 0.8 else 'fails'} >= 0.8), without it "
                          f"{calm_jain:.3f}.")
    for policy in ("greedy", "easy-oracle"):  # no runners, no fair share: the references
        config = SimConfig(hosts=2, policy=policy)
        started = time.process_time()
        calm, loud, ratio = _with_and_without(config, (background, foreign, flood, others))
        cpu = time.process_time() - started
        calm_p95, loud_p95 = _p95(calm, others), _p95(loud, others)
        users = loud["users"]
        assert isinstance(users, dict)
        row = (f"| {policy} (reference) | - | {calm_p95:.0f} | {loud_p95:.0f} | "
               f"{ratio:.2f} | {float(calm['jain_slowdown']):.3f} | "  # type: ignore[arg-type]
               f"{float(loud['jain_slowdown']):.3f} | {users['flood']['wait_p50_s'] / HOUR:.1f} | "  # type: ignore[arg-type]
               f"{float(loud['makespan_s']) / HOUR:.1f} | {cpu:.1f} |")  # type: ignore[arg-type]
        lines.append(row)
        print(row, flush=True)
    print("\n".join(checks))
    seeds = _over_seeds(args.seeds, args.jobs, weights, args.queue_step_min) if args.seeds else []
    for line in seeds:
        print(line, flush=True)
    if not args.no_write:
        write_section("simulate-fair", [*lines, "", *checks, "", NOTE, *([""] + seeds if seeds else [])])
    return 0


def _over_seeds(count: int, jobs: int, weights: list[float], step_min: float) -> list[str]:
    """Seeds 1..count, instance runners, queue share on, per fair-share weight: the
    others' p95 ratio and Jain's index with the flood, and the makespan against fair
    share off on the same seed."""
    import statistics

    from runnerctl.controller.fairshare import FairPolicy
    from runnerctl.sim.simulator import SimConfig

    found: dict[float, list[tuple[float, float, float]]] = {w: [] for w in sorted(weights)}
    for seed in range(1, count + 1):
        trace = _trace(seed, jobs)
        makespan_off = 0.0
        for weight_h in sorted(set(weights) | {0.0}):  # off first, the makespans' base (a row if asked)
            config = SimConfig(hosts=2, runner_type="instance",
                               fair=FairPolicy(weight_s=weight_h * HOUR, queue_step_s=step_min * 60))
            _, loud, ratio = _with_and_without(config, trace)
            makespan = float(loud["makespan_s"])  # type: ignore[arg-type]
            if weight_h == 0:
                makespan_off = makespan
            if weight_h in found:
                found[weight_h].append((ratio, float(loud["jain_slowdown"]),  # type: ignore[arg-type]
                                        makespan / makespan_off))
    lines = [f"Over seeds 1-{count} (instance runners, queue step {step_min:g} min; each seed its own "
             "lab background and flood), per fair-share weight:", "",
             "| fair_weight_h | others' ratio <= 1.5 | ratio median / worst | Jain >= 0.8 | "
             "Jain mean | makespan / fair share off, mean / max |", "|---|---|---|---|---|---|"]
    for weight_h, rows in found.items():
        ratios, jains, makespans = zip(*rows, strict=True)
        lines.append(f"| {weight_h:g}{' (off)' if not weight_h else ''} | "
                     f"{sum(r <= 1.5 for r in ratios)}/{count} | "
                     f"{statistics.median(ratios):.2f} / {max(ratios):.2f} | "
                     f"{sum(j >= 0.8 for j in jains)}/{count} | {statistics.fmean(jains):.3f} | "
                     f"{statistics.fmean(makespans):.3f} / {max(makespans):.3f} |")
    return lines


NOTE = ("The reference rows are policies without runners or fair share (`greedy`: any job "
        "that fits, oldest first; `easy-oracle`: EASY backfilling knowing every duration). "
        "Every job here has a timeout, so `dynamic` orders by age with no size credit "
        "(docs/controller.md, \"Size credits\"), and the others' 2-GPU jobs, submitted "
        "just after the flood, wait behind its 200 older jobs unless fair share counts them "
        "younger. Usage alone (`usage only`) counts the flood only as its jobs run, so with "
        "instance runners the others' p95 stays at about 1.6x; the queue share counts the "
        "flood's pending jobs from the moment they are submitted (its k-th job about k steps "
        "younger), and the others' p95 comes to about 1.1x their figure without the flood. "
        "Jain's index with the flood falls as fair share protects the others (0.83 off, 0.74 "
        "usage only, 0.72 with the queue share, instance runners): it is over users' mean "
        "bounded slowdowns, and the flood's slowdown, the largest, grows when its jobs wait "
        "behind everyone else's (its many short jobs wait hours), while the others' shrink. "
        "So no configuration here holds both bounds. With group runners GitLab hands every "
        "1-GPU runner the oldest pending job, so the others' 1-GPU jobs queue behind the "
        "flood whatever runnerctl does (their no-flood p95 with fair share on is short, "
        "hence the large ratio). Instance runners get GitLab's fair scheduling by project "
        "(fewest running jobs first) for 1-GPU jobs (docs/fairshare.md). Other seeds "
        "(1-4, 6: `--seed N --seeds 0 --no-write`, not part of this run) move the instance "
        "runners' ratio with the queue share to 1.27-4.48 (usage only: 1.27-4.93); "
        "in seed 2 (4.48) the others' 2-GPU jobs were first in the planner's "
        "order, but the host that claimed them drained behind jobs running for hours while "
        "the other host ran 1-GPU jobs: the drain's choice of host, not the order.")


def _numbered(jobs: list) -> list:  # type: ignore[type-arg]
    """Job ids in submission order, as GitLab numbers jobs (its queues order by id)."""
    import dataclasses

    ordered = sorted(jobs, key=lambda j: (j.submit, j.job_id))
    return [dataclasses.replace(j, job_id=n) for n, j in enumerate(ordered, 1)]


def _with_and_without(config: SimConfig, trace: tuple[list, list, list, list]  # type: ignore[type-arg]
                      ) -> tuple[dict[str, object], dict[str, object], float]:
    """One configuration on the background and the others' jobs, without the flood and
    with it, and the others' p95 wait with it as a ratio of without (a 1-minute floor:
    polls, not queueing)."""
    from runnerctl.sim.simulator import Simulator

    background, foreign, flood, others = trace
    calm = Simulator(_numbered([*background, *others]), config, foreign).run()
    loud = Simulator(_numbered([*background, *flood, *others]), config, foreign).run()
    return calm, loud, _p95(loud, others) / max(_p95(calm, others), 60.0)


def _p95(result: dict[str, object], jobs: list[object]) -> float:
    """p95 wait over the three others' jobs together (from the per-user figures: the max
    of their p95s, an upper bound of the pooled p95 with so few jobs)."""
    users = result["users"]
    assert isinstance(users, dict)
    return max(float(users[u]["wait_p95_s"]) for u in OTHERS if u in users)


def _trace(seed: int, jobs: int) -> tuple[list, list, list, list]:  # type: ignore[type-arg]
    """The lab background (`runnerctl.sim.labtrace`, its users but the sweeper, each their
    own project, with foreign use), the flood a quarter into it, the three others."""
    from runnerctl.sim.inputs import TraceJob
    from runnerctl.sim.labtrace import USERS, lab_trace

    background, foreign = lab_trace(jobs, hosts=2, load=0.8, seed=seed, foreign_per_host=2,
                                    users=tuple(u for u in USERS if u.name != "sweeper"))
    rng = random.Random(seed)
    t0 = round(max(j.submit for j in background) / 4)
    median, timeout = 1200.0, 4 * HOUR

    def duration() -> float:
        return round(min(max(60.0, rng.lognormvariate(math.log(median), 1.5)), timeout), 3)

    flood = [TraceJob(100_000 + i, t0, 1, duration(), project="flood", user="flood", timeout=timeout)
             for i in range(200)]
    others = [TraceJob(200_000 + 10 * k + i, t0 + 60.0 + 600.0 * i, rng.choice((1, 1, 2)), duration(),
                       project=name, user=name, timeout=timeout)
              for k, name in enumerate(OTHERS) for i in range(3)]
    return background, foreign, flood, others


if __name__ == "__main__":
    raise SystemExit(main())
