"""How fast `runnerctl simulate` is: 10,000 jobs on 32 hosts x 8 GPUs, one core.

    python benchmarks/simulate_speed.py [--jobs 10000] [--hosts 32] [--seed 7] [--repeat 3]

Writes a saturated synthetic trace (mixed 1/2/4/8-GPU jobs, bursts, two foreign
processes per host) as JOBS.csv and FOREIGN.csv, then times `runnerctl simulate` on it
in this process (CSV parsing included), CPU time of this process only: the `greedy`
reference (no runners, no planner) is the baseline measured in the same run, and
`dynamic` (the real planner, every reconcile of every host) is reported as seconds and
as a ratio to it. Best of `--repeat` runs of each, to damp a shared machine's noise.
Writes its table into benchmarks/RESULTS.md between the simulate-speed markers.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from results_md import write_section

    from runnerctl.cli import main as cli
    from runnerctl.sim.hosts import host_name
    from runnerctl.sim.trace import synthetic

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    jobs, foreign = synthetic(args.jobs, hosts=args.hosts, seed=args.seed, foreign_per_host=2)
    with tempfile.TemporaryDirectory() as tmp:
        trace, uses = Path(tmp) / "jobs.csv", Path(tmp) / "foreign.csv"
        with trace.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["job_id", "submit_time", "gpus", "duration"])
            writer.writerows((j.job_id, j.submit, j.gpus, j.duration) for j in jobs)
        with uses.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["start", "duration", "host", "gpu"])
            writer.writerows((u.start, u.duration, host_name(u.host), u.gpu) for u in foreign)
        timings: dict[str, float] = {}
        results: dict[str, dict[str, object]] = {}
        for policy in ("greedy", "dynamic"):
            for _ in range(args.repeat):
                out = io.StringIO()
                started = time.process_time()
                with contextlib.redirect_stdout(out):
                    code = cli(["simulate", "--trace", str(trace), "--foreign", str(uses), "--hosts",
                                str(args.hosts), "--policy", policy, "--json"])
                spent = time.process_time() - started
                if code != 0:
                    raise SystemExit(f"runnerctl simulate --policy {policy} exited {code}")
                timings[policy] = min(spent, timings.get(policy, float("inf")))
                results[policy] = json.loads(out.getvalue())
    ratio = timings["dynamic"] / timings["greedy"]
    dynamic = results["dynamic"]
    lines = ["## Simulator speed", "",
             f"`python benchmarks/simulate_speed.py` ({args.jobs} jobs, {args.hosts} hosts x 8 GPUs, "
             f"2 foreign processes per host, seed {args.seed}; CPU seconds of one process, best of "
             f"{args.repeat}; `runnerctl simulate` including reading the CSV files).", "",
             "| policy | CPU time (s) | ratio to greedy | makespan / lower bound | jobs completed |",
             "|---|---|---|---|---|"]
    for policy in ("greedy", "dynamic"):
        result = results[policy]
        makespan = float(result["makespan_s"]) / float(result["lower_bound_s"])  # type: ignore[arg-type]
        lines.append(f"| {policy} | {timings[policy]:.2f} | {timings[policy] / timings['greedy']:.1f} | "
                     f"{makespan:.3f} | {result['jobs_completed']} |")
    print("\n".join(lines[5:]))
    print(f"dynamic: {timings['dynamic']:.2f} s CPU ({ratio:.1f}x greedy's {timings['greedy']:.2f} s); "
          f"target under 30 s; double allocations {dynamic['double_allocations']}, "
          f"foreign collisions {dynamic['foreign_collisions']}")
    write_section("simulate-speed", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
