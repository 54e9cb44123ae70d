"""GPU metrics: identity, utilization, memory, occupancy state and GPU-seconds per state.

Labels line up with dcgm-exporter's (`gpu` = NVML index, `UUID`, `Hostname`, and on
the info metric `device` = nvidiaN) so a query can join runnerctl's occupancy with
dcgm-exporter's measurements, e.g. `DCGM_FI_DEV_GPU_UTIL * on(UUID)
group_left(state) (runnerctl_gpu_occupancy_state == 1)`. dcgm-exporter's `modelName`
is spelt `model_name` here: Prometheus' lint (`promtool check metrics`) rejects
camelCase label names. Values unknown to NVML are left out, never exported as 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from runnerctl.controller.stats import StatsView
from runnerctl.controller.view import OCCUPANCY

GPU_LABELS = ["gpu", "UUID", "Hostname"]


def collect(stats: StatsView) -> Iterator[Metric]:
    view = stats.view
    snapshot = view.snapshot
    gpus = {} if snapshot is None else {g.index: g for g in snapshot.gpus}
    # a GPU's identity stays while NVML cannot be read or no longer lists it (stats.py keeps
    # every GPU once read): its series keep their UUID (with "" they became new series,
    # and the `unknown` seconds were counted twice)
    uuids = {index: gpu.uuid for index, gpu in stats.known_gpus.items()}
    info = InfoMetricFamily("runnerctl_gpu", "GPU identity, labelled like dcgm-exporter's metrics.",
                            labels=[*GPU_LABELS, "device", "model_name", "pci_bus_id"])
    utilization = GaugeMetricFamily("runnerctl_gpu_utilization_ratio",
                                    "GPU utilization over NVML's last sample period (0-1).",
                                    labels=GPU_LABELS)
    used = GaugeMetricFamily("runnerctl_gpu_memory_used_bytes", "GPU memory in use.", labels=GPU_LABELS)
    total = GaugeMetricFamily("runnerctl_gpu_memory_total_bytes", "GPU memory in all.", labels=GPU_LABELS)
    foreign = GaugeMetricFamily("runnerctl_gpu_foreign_processes",
                                "Processes on the GPU that no CI job's lease covers.", labels=GPU_LABELS)
    for index, known in sorted(stats.known_gpus.items()):
        info.add_metric([str(index), known.uuid, view.host], {
            "device": f"nvidia{index}", "model_name": known.name, "pci_bus_id": known.pci_bus_id or ""})
    for index, gpu in sorted(gpus.items()):
        labels = [str(index), gpu.uuid, view.host]
        if gpu.utilization is not None:
            utilization.add_metric(labels, gpu.utilization)
        if gpu.memory_used_bytes is not None:
            used.add_metric(labels, gpu.memory_used_bytes)
        if gpu.memory_total_bytes is not None:
            total.add_metric(labels, gpu.memory_total_bytes)
        if index in stats.foreign_processes:  # absent: NVML cannot list its processes (unknown, not 0)
            foreign.add_metric(labels, stats.foreign_processes[index])
    yield from (info, utilization, used, total, foreign)
    yield _states(stats, uuids)
    yield _seconds(stats, uuids)


def _states(stats: StatsView, uuids: dict[int, str]) -> Metric:
    family = GaugeMetricFamily(
        "runnerctl_gpu_occupancy_state",
        "Who holds the GPU now, as a state set (1 for the current state): idle, ci (a CI job), "
        "foreign (use outside CI, cool-down included), draining (kept free for a multi-GPU job), "
        "paused (no runner open over it), unhealthy, unknown (GPUs could not be read).",
        labels=[*GPU_LABELS, "state"])
    for index, current in sorted(stats.occupancy.items()):
        for state in OCCUPANCY:
            family.add_metric([str(index), uuids.get(index, ""), stats.view.host, state],
                              1.0 if state == current else 0.0)
    return family


def _seconds(stats: StatsView, uuids: dict[int, str]) -> Metric:
    family = CounterMetricFamily(
        "runnerctl_gpu_occupancy_seconds",
        "GPU-seconds spent in each occupancy state since the controller started; summed over "
        "states, each GPU's counters equal the seconds since runnerctl_occupancy_since_timestamp_seconds.",
        labels=[*GPU_LABELS, "state"])
    indexes = sorted({gpu for gpu, _ in stats.gpu_seconds} | set(stats.occupancy))
    for index in indexes:
        for state in OCCUPANCY:
            family.add_metric([str(index), uuids.get(index, ""), stats.view.host, state],
                              stats.gpu_seconds.get((index, state), 0.0))
    return family
