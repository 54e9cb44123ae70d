"""A job's `image:` on HPC: the batch drivers run the user's script in Apptainer/Singularity.

HPC sites run containers without a daemon or root: Apptainer (formerly Singularity).
When a job names an `image:`, the batch wrapper runs the stage script with
`apptainer exec --nv --bind <builds dir> <image> bash ...` on the node (`singularity`
where the node has that name instead; same command line), per Apptainer's user guide:
- `--nv` binds the host's NVIDIA driver libraries and devices into the container
  (docs "GPU Support"); the GPU variables the driver and scheduler set pass through,
  since Apptainer passes the host environment into the container unless `--cleanenv`
  ("Environment and Metadata");
- an image is a SIF file path, or a URI: `docker://`, `oras://`, `library://`; a bare
  registry name such as `pytorch/pytorch:2.3` means `docker://pytorch/pytorch:2.3`;
- `--bind` makes the builds dir (the job's sources and output files) the same path inside,
  and where that path goes through a link, also the path the job was given: a container
  sees only a bind's destination ("Bind Paths and Mounts");
- a variable set in the image is not overridden by the host's ("Environment from the
  host"), but `APPTAINERENV_<name>` (`SINGULARITYENV_` for singularity) is: the node's
  CUDA_VISIBLE_DEVICES is passed that way, so an image that sets it cannot widen the job;
- a relative SIF path is the job's project dir's (the batch job starts in the builds dir).
A container that never started (no apptainer on the node: 127; an image that cannot be
pulled or opened: Apptainer's FATAL, 255) leaves no mark of the script having begun;
the wrapper says so and the driver fails the stage as a system failure, not the job's.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

_SCHEMES = ("docker://", "oras://", "library://", "shub://", "docker-archive:", "oci-archive:")


def image_uri(image: str, base: Path | None = None) -> str:
    """What `apptainer exec` is given for a job's `image:`; a relative file is `base`'s."""
    if image.startswith(_SCHEMES):
        return image
    if image.startswith(("/", "./", "../")) or image.endswith(".sif"):
        return image if base is None or image.startswith("/") else str(base / image)
    return f"docker://{image}"


def binds(resolved: Path, given: Path) -> tuple[str, ...]:
    """The builds dir at its own path, and at the path the job was given if a link differs."""
    return (str(resolved),) if resolved == given else (str(resolved), f"{resolved}:{given}")


def run_line(*, image: str | None, script: Path, binds: Sequence[str], guard: str,
             started: Path, base: Path | None = None) -> str:
    """Bash that runs the stage script (sourced under `guard`) and leaves its status in $rc;
    with an image, `runnerctl_nostart` is set when the container never ran the script."""
    q = shlex.quote
    if image is None:
        return f"{guard}( source {q(str(script))} ); rc=$?\n"
    inner = f": > {q(str(started))}; {guard}source \"$0\""
    bound = " ".join(f"--bind {q(b)}" for b in binds)
    return (f"rm -f {q(str(started))}\n"
            "runnerctl_ctr=$(command -v apptainer || command -v singularity) || {\n"
            f"  echo {q(f'runnerctl: image: {image} needs apptainer or singularity on this node')}; "
            "rc=127; }\n"
            'if [ -n "$runnerctl_ctr" ]; then\n'
            '  case ${runnerctl_ctr##*/} in singularity) runnerctl_envp=SINGULARITYENV_ ;; '
            "*) runnerctl_envp=APPTAINERENV_ ;; esac\n"
            '  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then '
            'export "${runnerctl_envp}CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; fi\n'
            f'  "$runnerctl_ctr" exec --nv {bound} {q(image_uri(image, base))} '
            f"bash --noprofile --norc -c {q(inner)} {q(str(script))}; rc=$?\nfi\n"
            f'if [ "$rc" -ne 0 ] && [ ! -e {q(str(started))} ]; then runnerctl_nostart=1; fi\n')
