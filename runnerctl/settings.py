"""runnerctl's own settings file (TOML), as nested frozen dataclasses.

Looked up at `--config`, else `$RUNNERCTL_CONFIG`, else /etc/runnerctl/runnerctl.toml
(root) or ~/.config/runnerctl/runnerctl.toml. A missing file means all defaults, but
the command line's `--config` must name a file that exists (click checks it: a misspelt
path would silently mean the defaults' state directory). An unknown key, a wrong type
or a value out of range is an error that names the key; the reader (`_build`) makes
every check, and the dataclasses none (code that builds them directly is trusted).
Secrets (GitLab token) are not kept here: they come from `$RUNNERCTL_GITLAB_TOKEN` or
`--token-file`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import socket
import tomllib
import types
import typing
import urllib.parse
from pathlib import Path
from typing import Any

from runnerctl.errors import ConfigError, redact
from runnerctl.tags import PRIORITIES, host_name_problem


def _default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/runnerctl"
    return str(Path.home() / ".local" / "state" / "runnerctl")


MIN_RUNNER_TIMEOUT_S = 600
"""GitLab refuses a runner maximum timeout under 10 minutes (app/models/ci/runner.rb)."""
MAX_RUNNER_TIMEOUT_S = 2**31 - 1
"""The largest GitLab can store (`ci_runners.maximum_timeout`, a 4-byte integer)."""

@dataclasses.dataclass(frozen=True)
class HostSettings:
    name: str = dataclasses.field(default_factory=socket.gethostname)
    """Host name used in runner names and the `host:` tag."""
    gpu_source: str = "nvml"
    """`nvml` for real GPUs, `sim:N` or `sim:PATH` for a simulated host."""


@dataclasses.dataclass(frozen=True)
class PathSettings:
    state_dir: str = dataclasses.field(default_factory=_default_state_dir)
    """Leases, the SQLite store and runtime files live here."""
    runner_config: str = ""
    """gitlab-runner's config.toml; empty means gitlab-runner's own default location."""
    builds_dir: str = ""
    """Custom executor builds dir; empty means <state_dir>/builds."""
    cache_dir: str = ""
    """Custom executor cache dir; empty means <state_dir>/cache."""


DRIVERS = ("shell", "docker", "slurm", "sge", "pbs", "pjm")
"""The drivers behind the custom executor (executors/), `[executor] driver`."""
BATCH_DRIVERS = frozenset({"slurm", "sge", "pbs", "pjm"})
"""Drivers whose jobs run on a batch system's nodes, not on this host's GPUs."""
PREPARE_EXEC_TIMEOUT_S = 900
"""The `prepare_exec_timeout` `runnerctl init` writes into config.toml (executors/contract.py
re-exports it with the other stage timeouts): gitlab-runner ends prepare then."""
GATE_WAIT_MAX_S = 600.0
"""The longest `gate_wait_s` that works: gitlab-runner ends prepare at its
`prepare_exec_timeout` (PREPARE_EXEC_TIMEOUT_S), which also holds the driver's own
prepare (an image pull) after the wait; past it, the gate's message naming the GPU, pid
and user in the way is lost in a plain timeout. Longer is loaded (an older runnerctl
took it) and named by `doubtful`."""
PULL_POLICIES = ("if-not-present", "always")
"""`[executor] docker_pull_policy` (gitlab-runner's names)."""


@dataclasses.dataclass(frozen=True)
class ExecutorSettings:
    driver: str = "docker"
    """Driver behind the custom executor: docker (isolates GPUs), shell, or batch jobs:
    slurm, sge, pbs, pjm (docs/hpc.md)."""
    gate_wait_s: float = 600.0
    """How long prepare waits for foreign processes to leave its GPUs before failing."""
    docker_image: str = "ubuntu:24.04"
    """Image for jobs that name none (docker executor and driver)."""
    docker_pull_policy: str = "if-not-present"
    """When the docker driver pulls a job's image: if-not-present (an image on the host is
    used as it is) or always (asks the registry each job: a new `:latest` is seen, and a
    private image is pulled with this job's own credentials, not reused from another's)."""
    docker_shm_mib: int = 8192
    """The docker driver's /dev/shm size per job container (MiB; memory only as used):
    Docker's own 64 MiB fails a PyTorch DataLoader with worker processes."""
    sge_gpu_resource: str = "gpu"
    """The Grid Engine consumable the sge driver asks for a job's GPUs by (`qsub -l
    <name>=N`; `qconf -sc` lists a site's); empty: none, for sites whose node types carry
    the GPUs (the job asks for one in SCHEDULER_PARAMETERS, e.g. `-l f_node=1`)."""
    # -- who jobs run as (shell driver) --
    run_as_user: str = ""
    """The shell driver runs jobs as this unprivileged user (needs gitlab-runner to run as
    root); empty: as gitlab-runner's own user."""
    allow_root: bool = False
    """Let the shell driver run jobs as root (refused by default: a job could then read
    every secret on the host)."""


POSTGRES_START_WAIT_S = 900
"""How long `runnerctl postgres start` waits for the server to accept connections: crash
recovery after a power loss replays the WAL first (install's unit gives the start longer)."""
POSTGRES_STOP_WAIT_S = 120
"""How long `runnerctl postgres stop` waits for a fast shutdown (install's unit gives the
stop longer, so systemd never kills the server in the middle of it)."""
SERVE_LISTEN = "127.0.0.1:8080"
"""Where `runnerctl serve` (and the units install writes) listen unless told: loopback
only, as the page's sign-in is off by default."""


@dataclasses.dataclass(frozen=True)
class PostgresSettings:
    dir: str = ""
    """Server files (data/, secrets/, server.log); empty means <state_dir>/postgres."""
    listen: str = "127.0.0.1"
    """listen_addresses: loopback by default; a LAN address for workers on other hosts."""
    port: int = 5432
    """TCP port of the shared server."""
    url: str = ""
    """An external PostgreSQL (admin URL); when set, runnerctl starts no server of its own."""


@dataclasses.dataclass(frozen=True)
class PlanPolicy:
    """Tunables of the planner (`controller.plan`), `[controller.planner]` in
    runnerctl.toml; the defaults are what the benchmarks measure, and `runnerctl simulate
    --planner KEY=VALUE` tries other values on a trace first.

    The size credits below apply to jobs whose timeout is unknown (`Demand.timeout_s`
    None: in the real controller, unless its runners have a maximum job timeout,
    docs/controller.md "Where the timeouts come from") and whose recent runs were all
    short (`credit_estimate_max_s`). A job with a known timeout gets none: it
    waits in age order, as in EASY backfilling, because the credits let multi-GPU jobs
    that came later take GPUs ahead of older smaller ones for hours (on the lab traces of
    `benchmarks/simulate_lab.py`, where every job has a timeout, 1-GPU and 4-GPU p95
    waits of 2-4x easy-oracle's; docs/controller.md "Size credits")."""

    max_draining: int = 1
    """Blocks that may drain (idle GPUs waiting for others) at once; more starts big
    jobs sooner but idles more GPUs."""
    idle_credit_s: float = 7200.0
    """For GPUs idle now, a job counts as this many seconds older per GPU beyond the
    first: big jobs are hard to place, so they take an idle block when one appears,
    unless a smaller job has waited that much longer (1-GPU jobs do not starve)."""
    drain_credit_s: float = 1200.0
    """The same, in choosing which job drains a block: the oldest one, where a big job
    counts this much older per extra GPU (so 8-GPU jobs do not wait behind a long queue
    of small ones; a small credit, as whole-host drains idle the most GPUs)."""
    credit_estimate_max_s: float = 1800.0
    """Where no timeout is known, size credits go only to jobs none of whose recent runs
    took longer than this (`Demand.estimate_s`; no history: credits as before). Letting a
    big job go first delays the older jobs it passes by its run time: little for a job of
    minutes (`benchmarks/simulate_policies.py`'s, whose 8-GPU jobs the credits keep from
    waiting hours), hours for a lab's long trainings (`benchmarks/simulate_lab.py`, where
    the credits doubled small jobs' p95 waits; docs/controller.md "Size credits"). 15
    minutes to an hour measured alike there."""
    backfill_max_s: float = 7200.0
    """Backfill (`controller.backfill`) only jobs whose timeout is at most this: the most
    a backfilled job can delay the drained job, whatever the estimates. 0: none at all."""
    drain_after_s: float = 1200.0
    """A multi-GPU job whose timeout is unknown drains a block only once it has waited
    this long (`Demand.pending_since`, by `Observed.now`): a drain idles GPUs that
    nothing can backfill, while jobs that end soon may free a block by themselves. Until
    then no new drain starts: the first job in drain order that may take a block here
    stops new drains while it is younger than this (a later one never drains ahead of
    it); drains under way go on. A job with a known timeout (backfill keeps its drain's
    idle GPUs busy) or that came alone (protected: L1) never waits for its own age. 0:
    drain at once. Measured in docs/controller.md "When a drain starts"."""
    backfill_blocks_max_s: float = 10800.0
    """The same for smaller blocks in a drained block (`backfill_max_s` 0 turns these off
    too): 3 h lets the lab traces' 2.7 h 2- and 4-GPU jobs use drained hosts; 3 h for
    singles would let long 1-GPU jobs keep 4-GPU ones out (docs/controller.md)."""
    backfill_estimated: bool = False
    """Backfill also jobs whose timeout is unknown, by their run-time estimate
    (`Demand.estimate_s`, the longest of their project and job name's recent runs): the
    runner opened for them gets a maximum job timeout that ends at the drain's expected
    end (`controller.caps`), so GitLab kills a job that runs longer than that, and the
    drained job waits no longer than it would without backfill. Off (the default): only
    jobs with a known timeout backfill, and no job is ever killed for a drain
    (docs/controller.md "Backfill by estimate")."""


CLAIM_TICKS = 3
"""A claim lasts at least this many reconcile intervals: renewed each tick, it survives
two late ones; shorter, it lapses between ticks and another host drains for its job."""
DEFAULT_CLAIM_TTL_S = 120.0
"""The claim's life where `claim_ttl_s` is unset and the interval short."""


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    interval_s: float = 5.0
    """Reconcile interval (s): a drained block opens within about two of these (L1)."""
    api_budget_per_min: int = 12
    """GitLab requests per minute at steady state, per host (demand polls and runner
    refreshes; pauses and resumes come on top only when something changes)."""
    projects: tuple[int, ...] = ()
    """GitLab project ids whose pending jobs are demand. Optional: empty (the default)
    polls the projects this host's runners serve, read from GitLab (a group runner's
    group and subgroups, a project runner's projects; controller/demand.py). Set it to
    override that, e.g. for instance runners, which serve every project."""
    project_priorities: dict[str, str] = dataclasses.field(default_factory=dict)
    """Project id -> high|normal|low; a job's `priority:` tag overrides it."""
    active_window_s: float = 3600.0
    """A project that had a job event or a pending job this recently (s) is polled more
    often than quiet ones (every project is polled, within the API budget)."""
    webhook_fresh_s: float = 300.0
    """While a project's job events arrived this recently (s), polling it is only a slow
    safety net (each project by its own events)."""
    foreign_memory_mib: int = 1024
    """A GPU with no visible owner and more memory in use than this (MiB) is closed: its
    user may be in another PID namespace. Idle drivers hold a few hundred MiB."""
    foreign_utilization: float = 0.10
    """Same for utilization (ratio 0-1 over NVML's sample period)."""
    reopen_ratio: float = 0.5
    """Hysteresis: a GPU closed for memory/utilization counts as clean again only below
    this fraction of the thresholds, so a value near the threshold does not flap runners."""
    cooldown_s: float = 60.0
    """A GPU reopens only after this long (s) without foreign use: a flickering process
    (a notebook between cells) does not flap runners."""
    claim_ttl_s: float | None = None
    """A host's claim on a pending job (before draining for it) expires after this (s)
    unless renewed each tick, so a dead host does not hold a job forever; it also outlives
    the job by this long, so a host whose last poll is older than this may drain for a
    job already running elsewhere (keep it above the time demand polls take). Unset:
    `DEFAULT_CLAIM_TTL_S`, or `CLAIM_TICKS` intervals where those are longer (`claim_ttl`);
    set, it must be at least `CLAIM_TICKS` intervals."""
    backoff_max_s: float = 300.0
    """Upper bound (s) of the back-off after repeated GitLab failures."""

    def claim_ttl(self) -> float:
        """`claim_ttl_s` as set, else 120 s or `CLAIM_TICKS` intervals, the longer: a host
        whose settings file raised `interval_s` keeps working across an upgrade that
        began checking the claim against the interval."""
        if self.claim_ttl_s is not None:
            return self.claim_ttl_s
        return max(DEFAULT_CLAIM_TTL_S, CLAIM_TICKS * self.interval_s)

    lease_check_s: float = 60.0
    """At most one look per this long (s) at whether a leased job still runs in GitLab
    (one request, within the API budget; see controller/orphans.py)."""
    orphan_after_s: float = 420.0
    """A leased job that GitLab has not listed as running for this long (s) is over, and
    its cleanup was killed: the controller reaps it and frees its GPUs. Longer than
    gitlab-runner lets the cleanup stage run (the 300 s cleanup_exec_timeout runnerctl
    writes, plus 30 s to SIGKILL and 30 s to force-kill)."""
    store_url: str = ""
    """PostgreSQL URL shared by the hosts (claims, toggles); empty: SQLite in state_dir."""
    history_retention_days: float = 400.0
    """Job history older than this (days, by the job's end) is deleted, at most once an
    hour. Over a year, so that "GPU-hours this month vs the same month last year" still
    answers; a row is a few hundred bytes, so even 100,000 jobs a year stay small."""
    events_retention_days: float = 90.0
    """Events (the activity log: pauses, resumes, drains, gate changes) older than this
    (days) are deleted, at most once an hour. A log grows with every tick's decision; three
    months covers an incident's post-mortem, and the history keeps the per-job record."""
    unused_utilization: float = 0.02
    """A job's GPUs below this mean utilization (ratio 0-1) count as idle: its idle
    GPU-hours in `runnerctl report`, and "requested but unused" once it lasts."""
    unused_after_s: float = 1800.0
    """A job whose GPUs stay idle this long (s) while it holds them is flagged "requested
    but unused" (an event once per job, a badge on the page, a line in the report). Long
    enough that data loading or compiling at a job's start is not flagged."""

    fair_weight_h: float = 0.0
    """Fair share (docs/fairshare.md): the most hours a pending job counts younger for its
    user's and project's recent GPU use (0: off). Priority still comes first. 24 kept
    the others' p95 wait within 1.5x under one user's flood in 18 of 20 seeds of
    benchmarks/simulate_fair.py (12: 12 of 20), at about 2 % more makespan (worst 4 %)."""
    fair_half_life_h: float = 168.0
    """Fair share: GPU use this many hours ago counts half (from the job history)."""
    fair_queue_step_min: float = 5.0
    """Fair share's queue share: minutes a pending job counts younger per GPU that its
    user (and project) hold in running jobs and ask for in older pending jobs, within
    `fair_weight_h` (so a flood's later jobs wait behind others' new ones; 0: usage
    only). 5: in benchmarks/simulate_fair.py (weight 12 h) steps of 2 to 10 keep the
    others' p95 wait within 1.1x of theirs without a flood, 1 gives 1.75x, and Jain's
    index moves between 0.70 and 0.76 with no trend; 5 is within that range and counts a
    user's 12 waiting GPUs as an hour. It acts only when fair_weight_h is above 0."""
    user_shares: dict[str, float] = dataclasses.field(default_factory=dict)
    """Fair share: GitLab user login -> shares (others have 1: equal by default)."""
    project_shares: dict[str, float] = dataclasses.field(default_factory=dict)
    """Fair share: project path (group/project) -> shares (others have 1)."""
    runner_max_timeout_s: dict[str, int] = dataclasses.field(default_factory=dict)
    """GPUs per slot ("1", "2", "4", "8") -> the maximum job timeout (s, at least 600)
    `runnerctl init` sets on those runners in GitLab, which cuts every job they take at
    it. The planner then knows how long a pending job can run: age order instead of
    size credits, and backfill of short jobs into blocks drained behind long ones; a
    trade-off that pays where jobs run for hours, not for minutes-long jobs (measured in
    docs/controller.md "Where the timeouts come from"). List every size the host has:
    the controller uses the bounds only when all sizes have one (`init` says so when
    one is missing). A size not listed: its runners are left as they are."""
    planner: PlanPolicy = dataclasses.field(default_factory=PlanPolicy)
    """`[controller.planner]`: when blocks drain, size credits, backfill bounds (the
    fields of `PlanPolicy`, measured in docs/controller.md)."""


@dataclasses.dataclass(frozen=True)
class MonitoringSettings:
    dcgm_job_mapping_dir: str = ""
    """dcgm-exporter's `--hpc-job-mapping-dir`: when set, one file per GPU (named by its
    index) lists the CI jobs on it after every tick, so dcgm-exporter's metrics get an
    `hpc_job` label. Empty: no files are written."""
    exporter_listen: str = "127.0.0.1:9835"
    """HOST:PORT of the standalone `runnerctl exporter` (`serve` has /metrics on --listen)."""


@dataclasses.dataclass(frozen=True)
class WebSettings:
    public_read: bool = True
    """Anyone who reaches the page may read it; False: only signed-in users."""
    https_only_cookies: bool = False
    """Mark the session cookie Secure; set it when a TLS proxy fronts `serve`."""
    session_max_age_s: int = 8 * 3600
    """A sign-in lasts this long (s) before the user signs in again."""
    signin_attempts: int = 5
    """Failed sign-ins per user name and client address per minute before 429."""
    gitlab_oauth_client_id: str = ""
    """Application id of a GitLab OAuth application (scope read_api); empty: no GitLab sign-in."""
    gitlab_oauth_group: str = ""
    """Full path of the group whose Maintainers (access level >= 40) may toggle."""
    # -- limits and trust (runnerctl.web.auth, runnerctl.controller.app) --
    trusted_proxies: tuple[str, ...] = ()
    """Addresses (or CIDR ranges) of reverse proxies whose X-Forwarded-For/-Proto are
    believed; empty: the headers are ignored and the peer address is the client."""
    public_url: str = ""
    """The address users open the page at through a reverse proxy
    (`https://lab.example/gpus/`): GitLab sign-in's redirect_uri is built from it (GitLab
    wants the one registered, exactly), its path is where the page lives (the proxy strips
    it), and a loopback `serve` answers under its name. Empty: the request's own address."""
    max_concurrent_signins: int = 2
    """Password checks at once (Argon2id takes 64 MiB each); more get 503 at once."""
    max_body_bytes: int = 1024 * 1024
    """Largest request body (bytes) any route takes; larger ones get 413 unread."""
    gitlab_role_check_s: float = 300.0
    """A "Sign in with GitLab" session's role is read again from GitLab this often (s)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    host: HostSettings = dataclasses.field(default_factory=HostSettings)
    paths: PathSettings = dataclasses.field(default_factory=PathSettings)
    executor: ExecutorSettings = dataclasses.field(default_factory=ExecutorSettings)
    postgres: PostgresSettings = dataclasses.field(default_factory=PostgresSettings)
    controller: ControllerSettings = dataclasses.field(default_factory=ControllerSettings)
    monitoring: MonitoringSettings = dataclasses.field(default_factory=MonitoringSettings)
    web: WebSettings = dataclasses.field(default_factory=WebSettings)
    source: str = ""
    """The file these settings came from ('' for defaults only)."""

    @property
    def state_dir(self) -> Path:
        return Path(self.paths.state_dir)

    @property
    def builds_dir(self) -> str:
        return self.paths.builds_dir or str(self.state_dir / "builds")

    @property
    def cache_dir(self) -> str:
        return self.paths.cache_dir or str(self.state_dir / "cache")


LARGEST = 1e10
"""No number in the settings is larger (over 300 years in seconds): a bigger one is a
slip, and infinity-like values would reach JSON answers and timers."""
@dataclasses.dataclass(frozen=True)
class Bound:
    """A number setting's range beyond "finite, not negative, at most LARGEST"."""
    low: float
    high: float = LARGEST
    unit: str = ""
    above: bool = False
    """`low` itself is refused ("more than 0")."""

    def problem(self, key: str, value: float) -> str:
        """Why `value` is out of range, or "" when it is in."""
        if (value > self.low if self.above else value >= self.low) and value <= self.high:
            return ""
        unit = f" ({self.unit})" if self.unit else ""
        if self.above:
            return f"{key} must be more than {self.low:g}{unit}, not {value!r}"
        if self.high == LARGEST:
            return f"{key} must be at least {self.low:g}{unit}, not {value!r}"
        return f"{key} must be from {self.low:g} to {self.high:g}{unit}, not {value!r}"


_ABSOLUTE = (("paths", "runner_config"), ("paths", "builds_dir"), ("paths", "cache_dir"), ("postgres", "dir"),
             ("monitoring", "dcgm_job_mapping_dir"))
"""Path settings meant absolute where set (`doubtful`; `state_dir` must be, at load)."""
_RATIO = Bound(0.0, 1.0, "a ratio")
_MORE_THAN_0 = Bound(0.0, above=True)
_RANGES: dict[tuple[type, str], Bound] = {
    (PlanPolicy, "max_draining"): Bound(1, unit="blocks: else no multi-GPU job ever drains one"),
    (ControllerSettings, "interval_s"): Bound(0.05, 3600.0, "seconds, as serve --interval"),
    (ControllerSettings, "api_budget_per_min"): Bound(1, 100_000, "requests a minute"),
    (ControllerSettings, "foreign_utilization"): _RATIO,
    (ControllerSettings, "reopen_ratio"): _RATIO,
    (ControllerSettings, "unused_utilization"): _RATIO,
    (ControllerSettings, "fair_half_life_h"): _MORE_THAN_0,
    (ControllerSettings, "history_retention_days"): _MORE_THAN_0,
    (ControllerSettings, "events_retention_days"): _MORE_THAN_0,
    (ControllerSettings, "unused_after_s"): _MORE_THAN_0,
    (PostgresSettings, "port"): Bound(1, 65535, "a TCP port"),
    (ExecutorSettings, "docker_shm_mib"): Bound(1, 1 << 24, "MiB"),
    (WebSettings, "session_max_age_s"): Bound(60, unit="seconds"),
    (WebSettings, "signin_attempts"): Bound(1, 1_000_000, "attempts a minute"),
    (WebSettings, "max_concurrent_signins"): Bound(1, 1000, "sign-ins at once"),
    (WebSettings, "max_body_bytes"): Bound(1024, 2**31, "bytes"),
    (WebSettings, "gitlab_role_check_s"): Bound(1, unit="seconds"),
}
"""Settings with a narrower range than "finite, not negative" (`_build` checks them)."""


def parse_listen(listen: str, *, what: str = "--listen") -> tuple[str, int]:
    """(host, port) of HOST:PORT (port 0: any free one); an IPv6 address in brackets
    (`[::1]:8080`) comes back without them, as sockets take it. ConfigError naming `what`."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isascii() or not port.isdigit():
        raise ConfigError(f"{what} {listen!r} is not HOST:PORT")
    if int(port) > 65535:
        raise ConfigError(f"{what} {listen!r}: port {int(port)} is not from 0 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _check_more(cls: type[Any], values: dict[str, Any]) -> str:
    """What a range cannot say (names from a list, addresses, absolute paths, tables of
    numbers): why the values cannot be, or "". Normalizes `runner_max_timeout_s`'s keys."""
    if cls is HostSettings and "name" in values and (problem := host_name_problem(values["name"])):
        return problem
    if cls is ExecutorSettings and values.get("driver", "docker") not in DRIVERS:
        return f"driver must be one of {', '.join(DRIVERS)}, not {values['driver']!r}"
    if cls is ExecutorSettings and values.get("docker_pull_policy", PULL_POLICIES[0]) not in PULL_POLICIES:
        return (f"docker_pull_policy must be one of {', '.join(PULL_POLICIES)}, "
                f"not {values['docker_pull_policy']!r}")
    if cls is ExecutorSettings and not re.fullmatch(r"([A-Za-z_][A-Za-z0-9_.-]*)?",
                                                    str(values.get("sge_gpu_resource", ""))):
        return (f"sge_gpu_resource must be a Grid Engine resource name or empty, "
                f"not {values['sge_gpu_resource']!r}")
    if cls is PathSettings and "state_dir" in values and not Path(values["state_dir"]).is_absolute():
        return f"state_dir must be an absolute path, not {values['state_dir']!r}"
    if cls is WebSettings:
        if values.get("public_url") and (problem := public_url_problem(values["public_url"])):
            return problem
        for proxy in values.get("trusted_proxies", ()):
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                return f"trusted_proxies: {proxy!r} is no address or CIDR range"
    if cls is MonitoringSettings and "exporter_listen" in values:
        try:
            port = parse_listen(str(values["exporter_listen"]), what="exporter_listen")[1]
        except ConfigError as exc:
            return exc.message
        if port == 0:
            return "exporter_listen needs a port from 1 to 65535: Prometheus scrapes it there, not at port 0"
    if cls is ControllerSettings:
        return _check_controller(values)
    return ""




def relative_paths(settings: Settings) -> dict[str, str]:
    """`[section] key` -> value of each path setting meant absolute (`_ABSOLUTE`) that is
    set and is not: `doubtful` names them, `runnerctl install` refuses those its units name."""
    found = {}
    for section, key in _ABSOLUTE:
        value = getattr(getattr(settings, section), key)
        if value and not Path(value).is_absolute():
            found[f"[{section}] {key}"] = value
    return found


def doubtful(settings: Settings) -> list[str]:
    """Settings that load (an older runnerctl took them, and refusing them now would stop
    every job's stages after an upgrade) but do not work as meant: `runnerctl doctor` names
    them and `serve` shows them on /healthz (found by a review as a lab admin)."""
    found = [f"{key} {value!r} is not an absolute path: a service runs in /, so it names another "
             "place than meant (and `~` is not expanded)" for key, value in relative_paths(settings).items()]
    if settings.executor.gate_wait_s > GATE_WAIT_MAX_S:
        found.append(f"[executor] gate_wait_s {settings.executor.gate_wait_s:g} is over "
                     f"{GATE_WAIT_MAX_S:g} s: gitlab-runner ends prepare at {PREPARE_EXEC_TIMEOUT_S} s, with "
                     "the image pull after the wait, and the gate's message naming the GPU's user is lost")
    for project in settings.controller.project_priorities:
        if not (project.isascii() and project.isdigit() and str(int(project)) == project != "0"):
            found.append(f"[controller] project_priorities: {project!r} is no GitLab project id, so it "
                         "matches no job (its keys are ids, \"42\" = \"high\"; project_shares takes paths)")
    return found


def public_url_problem(url: str) -> str:
    """Why `[web] public_url` is no address a browser opens the page at, or ""."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return f"public_url must be an http(s) address such as https://lab.example/gpus/, not {url!r}"
    return ""


def public_path(url: str) -> str:
    """The path part of a `public_url`, without its trailing slash ("" at the root): the
    ASGI root_path the page's own addresses are built under."""
    return urllib.parse.urlsplit(url).path.rstrip("/") if url else ""


def claim_ttl_problem(claim_ttl_s: float, interval_s: float) -> str:
    """Why `claim_ttl_s` is too short for `interval_s`, or ""."""
    if claim_ttl_s >= CLAIM_TICKS * interval_s:
        return ""
    return (f"claim_ttl_s must be at least {CLAIM_TICKS} reconcile intervals ({CLAIM_TICKS} x "
            f"{interval_s:g} s = {CLAIM_TICKS * interval_s:g} s), not {claim_ttl_s:g}: a claim would lapse "
            "between ticks and another host drain for the same job")


def _check_controller(values: dict[str, Any]) -> str:
    defaults = ControllerSettings()
    if "claim_ttl_s" in values:  # unset, it follows the interval (ControllerSettings.claim_ttl)
        problem = claim_ttl_problem(values["claim_ttl_s"], values.get("interval_s", defaults.interval_s))
        if problem:
            return problem
    for project, priority in values.get("project_priorities", {}).items():
        if priority not in PRIORITIES:
            return f"project_priorities: {project} must be one of {', '.join(PRIORITIES)}, not {priority!r}"
    if any(isinstance(p, bool) or p < 1 for p in values.get("projects", ())):
        return f"projects must be GitLab project ids (whole numbers from 1), not {list(values['projects'])!r}"
    for table in ("user_shares", "project_shares"):
        for key, share in values.get(table, {}).items():
            if not (math.isfinite(share) and share > 0):
                return f"{table}: {key} must be a share more than 0, not {share!r}"
    caps = {}
    for size, seconds in values.get("runner_max_timeout_s", {}).items():
        if not (size.isascii() and size.isdigit()) or int(size) < 1:
            return f"runner_max_timeout_s: {size!r} is no number of GPUs (use \"1\", \"2\", \"4\" or \"8\")"
        if not MIN_RUNNER_TIMEOUT_S <= seconds <= MAX_RUNNER_TIMEOUT_S:
            return (f"runner_max_timeout_s: {size} GPUs must be whole seconds from {MIN_RUNNER_TIMEOUT_S} "
                    f"(GitLab's minimum) to {MAX_RUNNER_TIMEOUT_S}, not {seconds!r}")
        caps[str(int(size))] = seconds  # "01" and "1" are one size
    if "runner_max_timeout_s" in values:
        values["runner_max_timeout_s"] = caps
    return ""


def default_settings_path() -> Path:
    env = os.environ.get("RUNNERCTL_CONFIG")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/etc/runnerctl/runnerctl.toml")
    return Path.home() / ".config" / "runnerctl" / "runnerctl.toml"


def load_settings(path: Path | None = None) -> Settings:
    path = path or default_settings_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8").removeprefix("\ufeff"))  # an editor's BOM
    except FileNotFoundError:
        return dataclasses.replace(Settings(), source=str(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}), as TOML must be") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    settings: Settings = _build(Settings, data, where=str(path))
    return dataclasses.replace(settings, source=str(path))


_BOOLS = {"true": True, "false": False}


def parse_planner(text: str) -> PlanPolicy:
    """`simulate --planner`: "KEY=VALUE,..." over the defaults, KEY a `[controller.planner]`
    setting ("drain_after_s=600,max_draining=2,backfill_estimated=true"). ConfigError: one
    line saying why."""
    data: dict[str, int | float | bool] = {}
    for part in (p.strip() for p in text.split(",")) if text.strip() else ():
        key, sep, value = (piece.strip() for piece in part.partition("="))
        number: int | float | bool | None = _BOOLS.get(value.lower())
        try:
            if number is None:
                number = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            pass
        if not sep or not key or number is None or number != number:  # NaN is no number
            raise ConfigError(f"--planner {part!r}: give KEY=NUMBER (or KEY=true/false), comma-separated "
                              "(drain_after_s=600,max_draining=2)")
        if key in data:
            raise ConfigError(f"--planner: {key} is given twice")
        data[key] = number
    policy: PlanPolicy = _build(PlanPolicy, data, where="--planner")
    return policy


def _build(cls: type[Any], data: dict[str, Any], *, where: str) -> Any:
    """A settings table from TOML data, every check made here (the dataclasses check
    nothing: code that builds them directly is trusted). ConfigError: one line, `where`."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown setting {key!r}", hint=f"known: {', '.join(fields)}")
        kind = hints[key]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: [{key}] must be a table")
            inner = f"{where[:-1]}.{key}]" if where.endswith("]") else f"{where} [{key}]"
            values[key] = _build(kind, value, where=inner)
            continue
        origin = typing.get_origin(kind)
        if origin in (tuple, dict):
            values[key] = _container(kind, value, where=f"{where}: {key}")
            continue
        values[key] = value = _scalar(kind, key, value, where)
        if isinstance(value, int | float) and not isinstance(value, bool) and (cls, key) in _RANGES:
            if problem := _RANGES[cls, key].problem(key, value):
                raise ConfigError(f"{where}: {problem}")
    if problem := _check_more(cls, values):
        raise ConfigError(f"{where}: {problem}")
    return cls(**values)


def _scalar(kind: Any, key: str, value: Any, where: str) -> Any:
    """A TOML value of the field's type (an int where a float is asked for becomes one); a
    number finite, not negative and at most LARGEST (TOML has nan and inf)."""
    expected = tuple(typing.get_args(kind)) if isinstance(kind, types.UnionType) else (kind,)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    # before float(): an int like 10**400 has none
    if number and (isinstance(value, int) or math.isfinite(value)) and abs(value) > LARGEST:
        raise ConfigError(f"{where}: {key} is too large: {value!r}")
    if float in expected and number and isinstance(value, int):
        value = float(value)
    if not isinstance(value, expected) or isinstance(value, bool) and bool not in expected:
        name = " or ".join(t.__name__ for t in expected if t is not type(None))
        raise ConfigError(f"{where}: {key} must be {name}, not {redact(repr(value))}")  # a URL's password
    if number and not (math.isfinite(value) and value >= 0):  # no setting is negative
        raise ConfigError(f"{where}: {key} must be a finite number, not negative: {value!r}")
    return value


def _container(kind: Any, value: Any, *, where: str) -> Any:
    """`tuple[T, ...]` from a TOML array, `dict[str, T]` from a TOML table."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, list) or not all(isinstance(v, args[0]) for v in value):
            raise ConfigError(f"{where} must be a list of {args[0].__name__}, not {redact(repr(value))}")
        return tuple(value)
    accepted = (int, float) if args[1] is float else args[1]  # TOML writes 2 for 2.0
    if not isinstance(value, dict) or not all(isinstance(v, accepted) and not isinstance(v, bool)
                                              for v in value.values()):
        raise ConfigError(f"{where} must be a table of {args[1].__name__}, not {redact(repr(value))}")
    return {str(k): float(v) if args[1] is float else v for k, v in value.items()}
