"""dcgm-exporter's HPC job mapping: one file per GPU naming the CI jobs on it.

Contract (dcgm-exporter README "HPC job mapping" and its `hpcMapper`, run with
`--hpc-job-mapping-dir DIR` or `DCGM_HPC_JOB_MAPPING_DIR`): every regular file in DIR
whose name parses as an integer is a GPU index; each line of it is one job id, and
dcgm-exporter copies that GPU's metrics once per line with an `hpc_job` label. Files
whose names are not integers are skipped, and an EMPTY file drops the GPU's metrics
altogether, so a GPU without a CI job gets no file (an old one is removed) rather than
an empty one.

Written after every tick, atomically (a `.N.<pid>.tmp` temp file, which dcgm-exporter
skips, renamed over `N`: `serve` and `exporter` on one host never share a temp file),
and only when the content changes. Files are 0644 whatever the umask (the units' is
0077), so a dcgm-exporter that is not root reads them too. A write that fails is logged
once and retried next tick; it never stops the controller.
"""

from __future__ import annotations

import logging
from pathlib import Path

from runnerctl.controller.view import ControllerView
from runnerctl.private import write_atomic

log = logging.getLogger(__name__)


def jobs_by_gpu(view: ControllerView) -> dict[int, list[int]]:
    """GPU index -> ids of the CI jobs running on a runner over it (sorted)."""
    found: dict[int, set[int]] = {}
    for slot in view.slots:
        for gpu in slot.gpus:
            found.setdefault(gpu, set()).update(j for j in slot.running_jobs if j >= 0)
    return {gpu: sorted(jobs) for gpu, jobs in found.items() if jobs}


class JobMappingWriter:
    """`writer(view)` after each tick keeps DIR/<gpu> in line with the CI jobs of `view`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._written: dict[int, str] = {}
        self._failing = False

    def __call__(self, view: ControllerView) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._sync(view)
        except OSError as exc:
            if not self._failing:
                log.warning("cannot write dcgm-exporter job mapping in %s: %s; retrying every tick",
                            self.directory, exc)
            self._failing = True
            self._written.clear()  # unsure what is on disk now: rewrite everything next time
            return
        if self._failing:
            log.warning("dcgm-exporter job mapping in %s written again", self.directory)
        self._failing = False

    def _sync(self, view: ControllerView) -> None:
        wanted = {gpu: "".join(f"{job}\n" for job in jobs) for gpu, jobs in jobs_by_gpu(view).items()}
        known = set() if view.snapshot is None else {g.index for g in view.snapshot.gpus}
        for gpu in sorted(known | set(self._written) | set(wanted)):
            content = wanted.get(gpu)
            if content is None:
                (self.directory / str(gpu)).unlink(missing_ok=True)
                self._written.pop(gpu, None)
            elif self._written.get(gpu) != content:
                # a new temp file, never what is at a name: in a directory other users can
                # write, a link planted there had root's file truncated and rewritten; 0644
                # whatever the umask (the units' is 0077)
                write_atomic(self.directory / str(gpu), content, mode=0o644)
                self._written[gpu] = content
