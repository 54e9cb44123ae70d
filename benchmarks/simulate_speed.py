"""How fast `runnerctl simulate` is: 10,000 jobs on 32 x 8 GPUs and 100,000 on 128 x 8.

    python benchmarks/simulate_speed.py [--seed 7] [--repeat 3] [--small-only] [--before 489c4a7]

For each size, writes a saturated synthetic trace (mixed 1/2/4/8-GPU jobs, bursts, two
foreign processes per host) as JOBS.csv and FOREIGN.csv, then runs `runnerctl simulate`
on it in a fresh process per run (CSV parsing included), measuring that process's CPU
time and peak resident memory: the `greedy` reference (no runners, no planner) is the
baseline measured in the same run, and `dynamic` (the real planner) is reported as
seconds and as a ratio to it, with the number of host plans it computed; on the small
size also the simulator as it was at `--before` (a git revision, exported to a
temporary folder), in the same run. The small size is the best of `--repeat` runs of
each (a shared machine's noise), the large one a single run. Prints both against the
acceptance targets and writes the table into benchmarks/RESULTS.md between the
simulate-speed markers.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (jobs, hosts) -> (CPU seconds target, MiB target)
CASES = {(10_000, 32): (3.0, 500.0), (100_000, 128): (60.0, 500.0)}

_ONE = """
import contextlib, io, json, resource, sys, time
sys.path.insert(0, {root!r})
from runnerctl.cli import main as cli
from runnerctl.sim import simulator
plans = []
real_run = simulator.Simulator.run
def run(self):
    try:
        return real_run(self)
    finally:
        plans.append(self.plans)
simulator.Simulator.run = run
out = io.StringIO()
started = time.process_time()
with contextlib.redirect_stdout(out):
    code = cli({argv!r})
spent = time.process_time() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"code": code, "cpu_s": spent, "peak_mib": peak, "plans": sum(plans),
                  "result": json.loads(out.getvalue()) if code == 0 else None}}))
"""


def measure(trace: Path, uses: Path, hosts: int, policy: str, root: Path = ROOT) -> dict[str, object]:
    """One `runnerctl simulate` (of the tree at `root`) in a fresh process: its CPU time,
    peak RSS, plans, result."""
    argv = ["simulate", "--trace", str(trace), "--foreign", str(uses), "--hosts", str(hosts),
            "--policy", policy, "--json"]
    done = subprocess.run([sys.executable, "-c", _ONE.format(root=str(root), argv=argv)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"runnerctl simulate --policy {policy} failed: {done.stderr.strip()[-500:]}")
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if found["code"] != 0:
        raise SystemExit(f"runnerctl simulate --policy {policy} exited {found['code']}")
    return found


def write_trace(folder: Path, jobs: int, hosts: int, seed: int) -> tuple[Path, Path]:
    from runnerctl.sim.hosts import host_name
    from runnerctl.sim.trace import synthetic

    made, foreign = synthetic(jobs, hosts=hosts, seed=seed, foreign_per_host=2)
    trace, uses = folder / f"jobs-{jobs}.csv", folder / f"foreign-{jobs}.csv"
    with trace.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "submit_time", "gpus", "duration"])
        writer.writerows((j.job_id, j.submit, j.gpus, j.duration) for j in made)
    with uses.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["start", "duration", "host", "gpu"])
        writer.writerows((u.start, u.duration, host_name(u.host), u.gpu) for u in foreign)
    return trace, uses


def main() -> int:
    from results_md import write_section

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small-only", action="store_true", help="only 10,000 jobs on 32 x 8")
    parser.add_argument("--before", default="489c4a7", help="git revision of the simulator to compare with")
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only
    cases = list(CASES)[:1] if args.small_only else list(CASES)
    lines = ["## Simulator speed", "",
             f"`python benchmarks/simulate_speed.py` (seed {args.seed}, 2 foreign processes per host; "
             "each run a fresh process: its CPU seconds and peak resident memory, `runnerctl simulate` "
             f"including reading the CSV files; 10,000 jobs best of {args.repeat}, 100,000 jobs one run). "
             f"`dynamic before` is the simulator at {args.before}, measured in the same run.", "",
             "| jobs | hosts x 8 GPUs | policy | CPU time (s) | ratio to greedy | peak memory (MiB) "
             "| plans | makespan / lower bound | jobs completed | target |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        for jobs, hosts in cases:
            trace, uses = write_trace(Path(tmp), jobs, hosts, args.seed)
            best: dict[str, dict[str, object]] = {}
            runs = [("greedy", ROOT), ("dynamic", ROOT)]
            if jobs <= 10_000:
                runs.append(("dynamic before", before))
            for name, root in runs:
                for _ in range(args.repeat if jobs <= 10_000 else 1):
                    found = measure(trace, uses, hosts, name.split()[0], root)
                    if name not in best or float(found["cpu_s"]) < float(best[name]["cpu_s"]):
                        best[name] = found
            target_s, target_mib = CASES[(jobs, hosts)]
            for policy, _ in runs:
                found = best[policy]
                result = found["result"]
                assert isinstance(result, dict)
                cpu, peak = float(found["cpu_s"]), float(found["peak_mib"])
                ratio = cpu / float(best["greedy"]["cpu_s"])
                makespan = float(result["makespan_s"]) / float(result["lower_bound_s"])
                target = f"under {target_s:g} s, {target_mib:g} MiB" if policy == "dynamic" else ""
                lines.append(f"| {jobs} | {hosts} | {policy} | {cpu:.2f} | {ratio:.1f} | {peak:.0f} | "
                             f"{found['plans'] if policy != 'greedy' else '-'} | {makespan:.3f} | "
                             f"{result['jobs_completed']} | {target} |")
            dynamic = best["dynamic"]
            cpu, peak = float(dynamic["cpu_s"]), float(dynamic["peak_mib"])
            old = best.get("dynamic before")
            speedup = (f", {float(old['cpu_s']) / cpu:.1f}x faster than before ({float(old['cpu_s']):.2f} s, "
                       f"{old['plans']} plans)" if old else "")
            verdicts.append(f"- {jobs} jobs on {hosts} x 8: dynamic {cpu:.2f} s CPU "
                            f"({'meets' if cpu < target_s else 'MISSES'} under {target_s:g} s), "
                            f"{peak:.0f} MiB peak "
                            f"({'meets' if peak < target_mib else 'MISSES'} under {target_mib:g} MiB)"
                            f"{speedup}; double allocations {dynamic['result']['double_allocations']}, "
                            f"foreign collisions {dynamic['result']['foreign_collisions']}")
    lines += ["", *verdicts]
    print("\n".join(lines[4:]))
    write_section("simulate-speed", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
