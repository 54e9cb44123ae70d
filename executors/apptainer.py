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
- `--bind` makes the builds dir (the job's sources and output files) the same path inside.
A node without either command fails the stage with a line saying so (exit 127).
"""

from __future__ import annotations

import shlex
from pathlib import Path

_SCHEMES = ("docker://", "oras://", "library://", "shub://", "docker-archive:", "oci-archive:")


def image_uri(image: str) -> str:
    """What `apptainer exec` is given for a job's `image:`."""
    if image.startswith(_SCHEMES) or image.startswith(("/", "./")) or image.endswith(".sif"):
        return image
    return f"docker://{image}"


def run_line(*, image: str | None, script: Path, bind: Path, guard: str) -> str:
    """Bash that runs the stage script (sourced under `guard`) and leaves its status in $rc."""
    q = shlex.quote
    if image is None:
        return f"{guard}( source {q(str(script))} ); rc=$?\n"
    inner = guard + 'source "$0"'
    return ("runnerctl_ctr=$(command -v apptainer || command -v singularity) || {\n"
            f"  echo {q(f'runnerctl: image: {image} needs apptainer or singularity on this node')}; "
            "rc=127; }\n"
            'if [ -n "$runnerctl_ctr" ]; then\n'
            f'  "$runnerctl_ctr" exec --nv --bind {q(str(bind))} {q(image_uri(image))} '
            f"bash --noprofile --norc -c {q(inner)} {q(str(script))}; rc=$?\nfi\n")
