"""The simulator's reference policies: no runners, no polling, no drain latency.

`greedy` starts the oldest queued job that fits somewhere, again and again (it never
holds GPUs back, so big jobs can starve); `fifo` stops at the first job that does not
fit. `easy-oracle` is EASY backfilling (Lifka, "The ANL/IBM SP scheduling system",
1995; Mu'alem and Feitelson, IEEE TPDS 12(6), 2001) that knows every job's exact
duration and when each foreign process ends: the oldest job that does not fit gets a
reservation at the earliest time some host has room for it (the shadow time), and a
later job may jump ahead only if it ends by then, runs on another host, or uses GPUs
the reservation leaves over. No real controller knows durations, so it is a limit to
measure `dynamic` against, not a policy to deploy. A job goes to the first host with
room; GPUs are taken in index order (references ignore block alignment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runnerctl.sim.simulator import Simulator

REFERENCE = ("greedy", "fifo", "easy-oracle")


def schedule(sim: Simulator, now: float) -> None:
    if sim.config.policy == "easy-oracle":
        _easy(sim, now)
        return
    free = sim.free_counts
    while sim.queue:
        most = max(free)
        job_id = sim.queue.oldest_fitting(most if sim.config.policy == "greedy" else 10**9)
        if job_id is None or sim.jobs[job_id].gpus > most:
            return
        need = sim.jobs[job_id].gpus
        host_no = next(h for h, room in enumerate(free) if room >= need)
        sim.start_reference(now, host_no, job_id)


def _easy(sim: Simulator, now: float) -> None:
    free = sim.free_counts
    if not sim.queue or not max(free):
        return
    per_host = sim.config.gpus_per_host
    shadow: tuple[int, float] | None = None  # (host, time) reserved for the oldest blocked job
    extra = 0  # GPUs of the shadow host still free at the shadow time, beyond the reservation
    for job_id in sim.queue.arrival_order():
        if not max(free):
            return
        job = sim.jobs[job_id]
        need = job.gpus
        if need > per_host:
            continue  # fits no host, ever: it reserves nothing
        fits = [h for h, room in enumerate(free) if room >= need]
        if shadow is None:
            if fits:
                sim.start_reference(now, fits[0], job_id)
                continue
            shadow, extra = _shadow(sim, now, need)
            continue
        for host_no in fits:
            if host_no != shadow[0] or now + sim.run_time(job_id) <= shadow[1]:
                sim.start_reference(now, host_no, job_id)
                break
            if need <= extra:
                extra -= need
                sim.start_reference(now, host_no, job_id)
                break


def _shadow(sim: Simulator, now: float, need: int) -> tuple[tuple[int, float], int]:
    """The host and time at which `need` GPUs are free soonest, and how many more GPUs
    that host has free then (knowing every running job's end and foreign use's end)."""
    best: tuple[float, int, int] | None = None
    for host_no, host in enumerate(sim.hosts):
        times = []
        for gpu, owner in enumerate(host.owner):
            at = now
            if owner is not None:
                at = sim.started[owner] + sim.run_time(owner)
            if host.gated(gpu, at):
                at = max(at, sim.foreign_free_at(host_no, gpu, now))
            times.append(at)
        times.sort()
        when = times[need - 1]
        spare = sum(1 for t in times if t <= when) - need
        if best is None or when < best[0]:
            best = (when, host_no, spare)
    assert best is not None
    return (best[1], best[0]), best[2]
