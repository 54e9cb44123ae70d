"""CPU time of one /metrics scrape of a busy 8-GPU host with 15 runners, against a baseline.

    python benchmarks/exporter_scrape.py [--scrapes 2000]

The host is a real controller on 8 simulated GPUs (8 single, 4 pair, 2 quad and 1
eight-GPU runner = 15 runners) after a workload: CI jobs on most GPUs, a foreign
process, a drained block, pending 4- and 8-GPU jobs, waits observed. A scrape is what
`/metrics` does per request: run every collector over the frozen view and render the
text exposition (`generate_latest`). The baseline, measured in the same run, renders a
registry of plain prometheus_client Gauges holding as many samples, i.e. the library's
own cost for that much output. CPU time is `time.process_time()` over all scrapes.
Writes its figures into benchmarks/RESULTS.md between the exporter-scrape markers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_MS = 10.0


def busy_host(state_dir: Path) -> object:
    from runnerctl.settings import ControllerSettings
    from runnerctl.sim.world import PROJECT, build_world

    world = build_world(state_dir, settings=ControllerSettings(projects=(PROJECT,)))
    for i in range(6):
        world.submit(1, 600.0 + 10 * i)
    world.advance(20)
    world.submit(4, 300.0)
    world.gpus.foreign[6] = (4242, "alice")
    world.submit(8, 300.0)
    world.advance(700)  # the 4-GPU job waits for the singles, then starts: a wait is observed
    world.submit(4, 100.0)
    world.advance(10)
    return world


def cpu_ms_per_scrape(render: object, scrapes: int) -> float:
    assert callable(render)
    render()  # warm up
    start = time.process_time()
    for _ in range(scrapes):
        render()
    return (time.process_time() - start) * 1000.0 / scrapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only

    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from runnerctl.exporter import build_registry

    with tempfile.TemporaryDirectory(prefix="runnerctl-bench-") as tmp:
        world = busy_host(Path(tmp))
        controller = world.controller  # type: ignore[attr-defined]
        runners = len(controller.view.slots)
        gpus = len(controller.view.snapshot.gpus)
        registry = build_registry(lambda: controller.stats.view)
        text = generate_latest(registry).decode()
        samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
        baseline = CollectorRegistry(auto_describe=False)
        gauge = Gauge("baseline_value", "A plain gauge.", ["series"], registry=baseline)
        for i in range(samples):
            gauge.labels(str(i)).set(i)
        ours = cpu_ms_per_scrape(lambda: generate_latest(registry), args.scrapes)
        base = cpu_ms_per_scrape(lambda: generate_latest(baseline), args.scrapes)
        world.close()  # type: ignore[attr-defined]
    ratio = ours / base
    verdict = "meets" if ours < TARGET_MS else "MISSES"
    print(f"host: {gpus} GPUs, {runners} runners; one scrape: {samples} samples, {len(text)} bytes")
    print(f"runnerctl scrape   {ours:.3f} ms CPU")
    print(f"baseline (gauges)  {base:.3f} ms CPU ({samples} samples, plain prometheus_client Gauge)")
    print(f"ratio              {ratio:.2f}x the baseline; {verdict} the {TARGET_MS:.0f} ms target")
    write_results(gpus, runners, samples, len(text), ours, base, args.scrapes)
    return 0 if ours < TARGET_MS else 1


def write_results(gpus: int, runners: int, samples: int, size: int, ours: float, base: float,
                  scrapes: int) -> None:
    lines = ["## Exporter: CPU time per scrape", "",
             f"`python benchmarks/exporter_scrape.py`: mean of {scrapes} "
             "scrapes (`time.process_time`); baseline: a registry of plain prometheus_client Gauges with "
             "as many samples, rendered in the same run. Target: under 10 ms.", "",
             "| host | samples | bytes | runnerctl scrape (ms CPU) | baseline (ms CPU) | ratio |",
             "|---|---|---|---|---|---|",
             f"| {gpus} GPUs, {runners} runners, busy | {samples} | {size} | {ours:.3f} | {base:.3f} | "
             f"{ours / base:.2f}x |"]
    from results_md import write_section

    write_section("exporter-scrape", lines)


if __name__ == "__main__":
    sys.exit(main())
