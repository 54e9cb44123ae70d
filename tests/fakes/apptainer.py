"""Apptainer stand-in at the command edge (tests/fakes/bin/apptainer/apptainer).

Apptainer does not install here (Debian 12 has no package). Rules modelled, from the
Apptainer user guide (apptainer.org/docs/user: "exec", "GPU Support", "Bind Paths and
Mounts", "Environment and Metadata"):
- `apptainer exec [--nv] [--cleanenv] [--bind SRC[:DST]] IMAGE COMMAND ARGS...`;
- IMAGE is a SIF path that must exist, or a `docker://`, `oras://`, `library://` URI;
  anything else is fatal (`FATAL: could not open image ...`, exit 255);
- the host environment passes into the container unless --cleanenv, but a variable the
  image sets is not overridden by the host's ("Environment from the host"); an
  `APPTAINERENV_X` (`SINGULARITYENV_X`) sets X over both ("Environment Variable
  Precedence"). The image's own variables come from $RUNNERCTL_FAKE_APPTAINER_IMAGE_ENV,
  a JSON file {image: {name: value}}. The container sets APPTAINER_CONTAINER and
  APPTAINER_NAME;
- paths not bound (outside the default binds: $HOME, /tmp, $PWD) are not visible, and a
  `--bind SRC:DST` shows SRC only at DST: this stand-in refuses to run a command whose
  script path is under no bind's destination.
Each call is appended as one JSON line to $RUNNERCTL_FAKE_APPTAINER_LOG.
"""

from __future__ import annotations

import json
import os
import sys

_SCHEMES = ("docker://", "oras://", "library://")


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "exec":
        print(f"Error: unknown command {argv[:1]}", file=sys.stderr)
        return 255
    args, flags, binds = argv[1:], [], []
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag in ("--bind", "-B"):
            bind = args.pop(0)
            binds.append(bind)
        flags.append(flag)
    if len(args) < 2:
        print("FATAL: exec needs an image and a command", file=sys.stderr)
        return 255
    image, command = args[0], args[1:]
    if not (image.startswith(_SCHEMES) or os.path.isfile(image)):
        print(f"FATAL: could not open image {image}: failed to retrieve path for {image}",
              file=sys.stderr)
        return 255
    scripts = [a for a in command if os.path.isabs(a) and os.path.isfile(a)]
    seen = [b.split(":")[1] if ":" in b else b for b in binds]  # the destinations
    if any(not any(s.startswith(b.rstrip("/") + "/") for b in seen) for s in scripts):
        print(f"FATAL: {scripts[0]}: no such file or directory (not bound into the container)",
              file=sys.stderr)
        return 255
    log = os.environ.get("RUNNERCTL_FAKE_APPTAINER_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(json.dumps({"flags": flags, "binds": binds, "image": image,
                                     "command": command}) + "\n")
    host = {} if "--cleanenv" in flags else dict(os.environ)
    prefixes = ("APPTAINERENV_", "SINGULARITYENV_")
    forced = {k.split("ENV_", 1)[1]: v for k, v in os.environ.items() if k.startswith(prefixes)}
    env = {k: v for k, v in host.items() if not k.startswith(prefixes)}
    images = os.environ.get("RUNNERCTL_FAKE_APPTAINER_IMAGE_ENV")
    if images:
        with open(images) as handle:
            env.update(json.load(handle).get(image, {}))
    env.update(forced)
    env.update({"APPTAINER_CONTAINER": image, "APPTAINER_NAME": os.path.basename(image)})
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
