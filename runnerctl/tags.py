"""Runner and job tags: the one module that writes them and reads them back.

GitLab hands a job to a runner whose tags include all of the job's tags. runnerctl
writes `gpu` (single-GPU runners only), `gpus:N`, `host:NAME` and every `priority:P`
on its runners (layout.py says why), and reads the same tags off pending jobs: how many
GPUs a job asks for, its priority and the host it is pinned to. Keeping both directions
here means a tag is spelled in one place.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

PRIORITIES = ("high", "normal", "low")
"""Most urgent first; a job without a priority tag is `normal` (or its project's)."""
PRIORITY_RANK = {name: rank for rank, name in enumerate(PRIORITIES)}
NORMAL = "normal"

_GPUS, _HOST, _PRIORITY = "gpus:", "host:", "priority:"


def gpus_tag(count: int) -> str:
    return f"{_GPUS}{count}"


def host_tag(host: str) -> str:
    return f"{_HOST}{host}"


_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def host_name_problem(name: str) -> str:
    """Why `name` cannot be a host's name, or "" when it can. It goes into runner names
    (`runnerctl/HOST/KEY`, so no `/`) and the `host:` tag, where GitLab splits a tag list
    on commas (`x,gpus:8` would give a runner a tag of another size): a host name as DNS
    writes one, of letters, digits, `.`, `_` and `-`."""
    if _HOST_NAME.fullmatch(name):
        return ""
    return (f"host name {name!r} must be 1 to 63 letters, digits, '.', '_' or '-', beginning "
            "and ending with a letter or digit (it names the runners and their host: tag)")


def priority_tag(priority: str) -> str:
    return f"{_PRIORITY}{priority}"


def runner_tags(*, gpus: int, host: str) -> list[str]:
    """A slot runner's tags: `gpu` on singles, `gpus:N`, `host:NAME`, every priority."""
    tags = [gpus_tag(gpus), host_tag(host)]
    if gpus == 1:
        tags.insert(0, "gpu")
    return tags + [priority_tag(p) for p in PRIORITIES]


@functools.lru_cache(maxsize=1024)
def runner_tag_set(gpus: int, host: str) -> frozenset[str]:
    """`runner_tags` as a set, made once per size and host: demand asks it of every
    pending job for every host at every tick (`PendingJob.takes`)."""
    return frozenset(runner_tags(gpus=gpus, host=host))


def job_tags(*, gpus: int, priority: str = "", host: str = "") -> list[str]:
    """The tags a job asking for `gpus` GPUs carries (as the templates write them)."""
    tags = ["gpu"] if gpus == 1 else [gpus_tag(gpus)]
    return tags + ([priority_tag(priority)] if priority else []) + ([host_tag(host)] if host else [])


def gpus_of(tags: Iterable[str]) -> int:
    """N of a `gpus:N` tag; 1 for `gpu`; 0 when the job asks for no GPU."""
    listed = list(tags)
    for tag in listed:
        count = tag.removeprefix(_GPUS)
        if count != tag and count.isdigit():
            return int(count)
    return 1 if "gpu" in listed else 0


def priority_of(tags: Iterable[str]) -> str | None:
    """The first known `priority:P` of the tags, None when there is none."""
    return next((p for p in (t.removeprefix(_PRIORITY) for t in tags if t.startswith(_PRIORITY))
                 if p in PRIORITY_RANK), None)


def host_of(tags: Iterable[str]) -> str | None:
    """The host a `host:NAME` tag pins the job to, None when it is not pinned."""
    return next((t.removeprefix(_HOST) for t in tags if t.startswith(_HOST)), None)


def without_priorities(tags: Iterable[str]) -> list[str]:
    return [t for t in tags if not t.startswith(_PRIORITY)]
