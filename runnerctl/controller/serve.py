"""`runnerctl serve`: the reconcile loop in a thread, the ASGI app in the foreground.

Production wiring reads runner ids from gitlab-runner's config.toml (runnerctl-owned
`[[runners]]` entries carry the GitLab `id` per slot name), running jobs and CI
processes from the executor's leases in the state dir, and GPUs from NVML (or a
simulated source). The store is SQLite in the state dir unless a PostgreSQL URL is set.
"""

from __future__ import annotations

import dataclasses
import fcntl
import ipaddress
import logging
import math
import os
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from runnerctl import private
from runnerctl.controller.app import create_app
from runnerctl.controller.header_timeout import HEADER_TIMEOUT_S, HeaderTimeoutProtocol
from runnerctl.controller.liveness import Liveness
from runnerctl.controller.loop import Controller, Wiring
from runnerctl.controller.observe import LeaseJobs
from runnerctl.controller.store import Event, Store
from runnerctl.errors import ConfigError
from runnerctl.executors.lease import LeaseTable
from runnerctl.gitlab import PythonGitLab
from runnerctl.gpus import open_gpu_source
from runnerctl.runner_config import RunnerConfigFile
from runnerctl.settings import Settings, WebSettings, doubtful, load_settings, parse_listen, public_path
from runnerctl.standby import load as load_standby

log = logging.getLogger(__name__)


NOTABLE_EVENTS = frozenset({"gate-close", "free", "reopen"})
"""Events an admin should see at the default log level (and any `*-failed` one)."""


def log_event(event: Event) -> None:
    """The activity log's events in serve's own log too (journald): a GPU closed for
    foreign use, a job's GPUs freed, a pause that failed at WARNING, every other decision
    (pause, resume, drain, reserve, gate-open, ...) at INFO (`runnerctl -v serve`). They
    were only in the store (found by a review as an SRE reading the logs)."""
    notable = event.kind in NOTABLE_EVENTS or event.kind.endswith("-failed")
    level = logging.WARNING if notable else logging.INFO
    log.log(level, "%s %s: %s", event.kind, event.subject, event.detail)


def production_controller(settings: Settings, *, gitlab_url: str, token: str, gpu_source: str,
                          runner_config: Path, webhook_secret: str,
                          read: Settings | None = None) -> Controller:
    """`read`: the settings as the file gave them, before the command line's changes
    (`settings` when none), which `InputsWatch` compares the file with."""
    read = settings if read is None else read
    config = RunnerConfigFile(runner_config)
    runner_ids = config.runner_ids()
    if not runner_ids:
        raise ConfigError(f"{runner_config} has no runnerctl runners with an id",
                          hint="register them first with `runnerctl init`")
    jobs = LeaseJobs(settings.state_dir, settings)
    standby = load_standby(runner_config)
    store = Store.open(url=settings.controller.store_url, state_dir=settings.state_dir)
    gpus = open_gpu_source(gpu_source, host=settings.host.name, watch_xid=True)
    wiring = Wiring(host=settings.host.name, gpus=gpus,
                    gitlab=PythonGitLab(gitlab_url, token), runner_ids=runner_ids, store=store, jobs=jobs,
                    clock=time.time, is_ci=jobs.is_ci, webhook_secret=webhook_secret, standby=standby,
                    check_clock=True, check_token=True, monotonic=time.monotonic, on_event=log_event)
    controller = Controller(wiring, settings.controller)
    controller.on_tick.append(InputsWatch(controller.liveness, read, runner_config, runner_ids))
    if doubts := doubtful(read):  # loaded, but not working as meant: on /healthz and in the log
        controller.liveness.notice("settings", "; ".join(doubts))
    if twice := config.repeated_names():
        controller.liveness.notice("runners", f"{runner_config} has two entries named {twice[0]}: "
                                   "gitlab-runner polls both, serve drives only the last; remove one and "
                                   "restart serve")
    if standby is None:  # a host set up before init made one: logged, and on /healthz while it lasts
        controller.liveness.notice("standby", f"no stand-by runner beside {runner_config}: GitLab drops "
                                   "multi-GPU jobs that wait over an hour for a drain; run `runnerctl init` "
                                   "again to create it (it changes nothing else)")
    return controller


INPUTS_CHECK_S = 30.0
"""How often serve looks whether its settings file or config.toml's runners changed."""


class InputsWatch:
    """After a tick, at most every INPUTS_CHECK_S: do runnerctl.toml and config.toml's
    runnerctl runners still say what serve read at its start? Each job's stages read the
    settings again, serve does not: a state_dir changed while serve ran had two jobs lease
    one GPU, and a runner registered again went undriven, with /healthz ok (found by a
    review as a lab admin). A change is a notice on /healthz (healthy stays) and a warning
    in the log, until serve is restarted or the file is put back. Also: can prepare still
    write a lease (`LeaseTable.write_problem`)? If not, /healthz fails once it lasts."""

    def __init__(self, liveness: Liveness, settings: Settings, runner_config: Path,
                 runner_ids: Mapping[str, int], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.liveness, self.settings, self.runner_config = liveness, settings, runner_config
        self.runner_ids = dict(runner_ids)
        self.clock = clock
        self._next = -math.inf

    def __call__(self, view: object) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + INPUTS_CHECK_S
        notes = []
        path = Path(self.settings.source)
        try:  # settings made in memory (tests, the simulator) name no file
            changed = bool(self.settings.source) and load_settings(path) != self.settings
        except ConfigError as exc:
            notes.append(f"{path} no longer loads ({exc.message}); serve goes on with what it read at its "
                         "start, while each job's stages fail on it")
        else:
            if changed:
                notes.append(f"{path} changed since serve started: restart serve (systemctl restart "
                             "runnerctl-serve) to use it; each job's stages read it already")
        try:
            ids = RunnerConfigFile(self.runner_config).runner_ids()
        except ConfigError as exc:
            notes.append(f"{self.runner_config} cannot be read ({exc.message})")
        else:
            if ids != self.runner_ids:
                notes.append(f"the runnerctl runners in {self.runner_config} changed since serve started "
                             "(runnerctl init?): restart serve, which drives only the runners it read then")
        self.liveness.notice("inputs", "; ".join(notes))
        self.liveness.trouble("leases", LeaseTable(self.settings.state_dir).write_problem(),
                              warn="the lease directory")


Metrics = Callable[[], tuple[bytes, str]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class StateDirHold:
    """The lock `hold_state_dir` took (its descriptor) and the file it was taken on."""

    fd: int
    path: Path
    key: tuple[int, int]  # (device, inode) of the lock file

    def lost(self) -> str:
        """Why the state directory is no longer the one serve locked, or "": deleted (`rm -rf`
        of it while serve ran) or replaced. Serve then acted on a store and leases nobody
        else saw, and a second serve could lock the new directory beside it (found by a
        review as a disaster-recovery engineer)."""
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return f"the state directory {self.path.parent} was deleted while serve ran"
        except OSError:
            return ""  # cannot tell (a read error): no reason to stop
        if (found.st_dev, found.st_ino) != self.key:
            return f"the state directory {self.path.parent} was replaced while serve ran"
        return ""


HOLD_CHECK_S = 2.0
"""How often `serve` checks that its state directory is still the one it locked."""


def hold_state_dir(state_dir: Path) -> StateDirHold:
    """Make this the one `serve` of `state_dir`: an exclusive lock on its `serve.lock`,
    held until the process ends (the returned descriptor). A second serve of the same host
    would act beside the first, spend its own API budget and record every event twice;
    it stops here in one line, naming the first one's pid."""
    try:
        private.state_dir(state_dir)
        fd = os.open(state_dir / private.SERVE_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot lock the state directory {state_dir}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise ConfigError(f"another runnerctl serve runs on {state_dir} (pid {other or 'unknown'})",
                          hint="stop it first (systemctl stop runnerctl-serve)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    held = os.fstat(fd)
    return StateDirHold(fd, state_dir / private.SERVE_LOCK, (held.st_dev, held.st_ino))


MAX_CONNECTIONS = 500
"""Open connections (and requests in flight) before uvicorn answers new requests 503 at
once: a page for a lab's team needs far fewer, and each request holds memory and a
thread. A client that holds a connection without finishing a request's headers loses it
after HEADER_TIMEOUT_S (`HeaderTimeoutProtocol`: uvicorn has no such timeout); many
clients that keep opening connections are stopped by a TLS proxy in front
(docs/operations.md)."""
KEEP_ALIVE_S = 5
"""An idle keep-alive connection is closed after this long (uvicorn's default, stated)."""


class LoopbackHosts:
    """ASGI middleware for a page listening on loopback: a request must name the host as
    loopback does (`Host: 127.0.0.1:8080`, `localhost`, `[::1]`), else 400.

    A web page the user opens elsewhere can point a name of its own at 127.0.0.1 (DNS
    rebinding) and then read this page from the user's browser as a page of that name;
    its requests carry that name in `Host`. A reverse proxy listed in `[web]
    trusted_proxies` may send the public name (Caddy passes the client's `Host`); with
    `[web] public_url` set, that name only. It must see the TCP peer: inside uvicorn's
    X-Forwarded-For handling it saw the browser's address, and every request through a
    trusted proxy that passes the public Host got 400 (found by a review as a lab admin
    behind a reverse proxy)."""

    def __init__(self, app: ASGIApp, trusted: Sequence[str], public: str | None = None) -> None:
        self.app = app
        self.trusted = [ipaddress.ip_network(t, strict=False) for t in trusted]
        self.public = public.lower() if public else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = b'{"detail":"this page answers only under a loopback name (127.0.0.1, localhost)"}'
        await send({"type": "http.response.start", "status": 400, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _allowed(self, scope: Scope) -> bool:
        host = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"host"), None)
        if host is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = host[1:host.find("]")] if host.startswith("[") else host.rpartition(":")[0] or host
        if is_loopback(name.lower()):
            return True
        if self.public is not None:
            return bool(name.lower() == self.public)
        client = scope.get("client")
        try:
            peer = ipaddress.ip_address(client[0]) if client else None
        except ValueError:
            return False
        return peer is not None and any(peer in network for network in self.trusted)


def http_config(app: FastAPI, host: str, port: int, web: WebSettings, log_level: str, *,
                header_timeout_s: float = HEADER_TIMEOUT_S) -> uvicorn.Config:
    """uvicorn believes X-Forwarded-For/-Proto only from `[web] trusted_proxies` (its own
    default trusts them from 127.0.0.1, so anyone on the host could pick their address).
    The page lives under `[web] public_url`'s path (root_path; the proxy strips it).
    On a loopback address the page answers only under a loopback name (`LoopbackHosts`).
    A client gets `header_timeout_s` for each request's headers (`HeaderTimeoutProtocol`)."""
    trusted = list(web.trusted_proxies)
    served: ASGIApp = app
    if trusted:  # uvicorn's own, placed by hand (its ASGI types are its own, not starlette's)
        served = cast(ASGIApp, ProxyHeadersMiddleware(cast(Any, app), trusted_hosts=trusted))
    if is_loopback(host):  # outside the proxy headers' middleware: it judges the TCP peer
        served = LoopbackHosts(served, trusted, urllib.parse.urlsplit(web.public_url).hostname)
    return uvicorn.Config(served, host=host, port=port, log_level=log_level, proxy_headers=False,
                          root_path=public_path(web.public_url), server_header=False,
                          limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=KEEP_ALIVE_S,
                          http=HeaderTimeoutProtocol.with_timeout(header_timeout_s))


def refuse_exposed(listen: str, *, sign_in: bool) -> None:
    """A page reachable from other machines needs a way to sign in (a local operator, or
    GitLab OAuth against a real GitLab); ConfigError in one line otherwise."""
    if not is_loopback(parse_listen(listen)[0]) and not sign_in:
        raise ConfigError(f"--listen {listen} is reachable from other machines, but no sign-in is configured",
                          hint="add an operator first (`runnerctl user add NAME --role operator`) "
                               "or listen on 127.0.0.1")


def serve(controller: Controller, listen: str, *,
          loop: Callable[[threading.Event], None] | None = None, metrics: Metrics | None = None,
          extend: Sequence[Callable[[FastAPI], None]] = (), web: WebSettings | None = None,
          sign_in: bool = False, hold: StateDirHold | None = None) -> None:
    """Run until SIGINT/SIGTERM: `loop(stop)` (default: the controller's own) in a thread.
    Refuses a non-loopback `listen` unless someone can sign in (`refuse_exposed`). With
    `hold`, stops when the state directory is no longer the one locked, and raises
    ConfigError saying so (systemd starts serve again, on a new directory)."""
    host, port, server = _server(controller, listen, metrics, extend=extend, web=web, sign_in=sign_in,
                                 log_level="warning")
    socks = listening_sockets(host, port)  # bound here, so that port 0 is announced as the one it got
    terminated: list[int] = []
    previous = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, *IGNORED_SIGNALS)}
    armed = _stop_on_sigterm(server, terminated)
    stop = threading.Event()
    worker = threading.Thread(target=loop or controller.run, args=(stop,), name="reconcile", daemon=True)
    controller.liveness.watch(worker)  # /healthz fails if it ever ends
    worker.start()
    lost: list[str] = []
    if hold is not None:
        threading.Thread(target=_watch_hold, args=(hold, server, stop, lost), name="state-dir",
                         daemon=True).start()
    log.warning("runnerctl serve: http://%s/ (page), /api/state, /metrics, webhooks at /webhooks/gitlab",
                bound_address(host, socks))
    try:
        server.run(sockets=socks)
    finally:
        stop.set()
        worker.join(timeout=10)
        if not worker.is_alive():  # SQLite: the last close moves the write-ahead log into the file
            controller.wiring.store.close()
        if armed:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
    if lost:
        raise ConfigError(f"{lost[0]}: serve stopped", hint="systemd starts it again after 5 s, on a new "
                          "directory; a SQLite store was in it, with its toggles, history and users: an "
                          "exposed --listen needs `runnerctl user add NAME --role operator` again")
    if terminated:
        name = signal.Signals(terminated[0]).name
        log.warning("runnerctl serve: stopped (%s)%s", name, "; it has no reload: start it again to read "
                    "changed settings" if terminated[0] == signal.SIGHUP else "")


def _watch_hold(hold: StateDirHold, server: uvicorn.Server, stop: threading.Event, lost: list[str]) -> None:
    """Every HOLD_CHECK_S until `stop`: a lost state directory ends the server."""
    while not stop.wait(HOLD_CHECK_S):
        why = hold.lost()
        if why:
            log.error("%s: stopping serve (its store and leases are gone; a new serve may have locked "
                      "a new directory there)", why)
            lost.append(why)
            server.should_exit = True
            return


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""End `serve` cleanly, saying so: systemd's stop, and a closed terminal (SIGHUP, whose
default killed the process without a word; serve has no reload)."""
IGNORED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
"""Logged and ignored (their default ended the process without a word)."""


def _stop_on_sigterm(server: uvicorn.Server, terminated: list[int]) -> bool:
    """SIGTERM (systemd's stop) and SIGHUP end `server` and return from its `run`, so that `serve`
    stops its loop and closes the store, and exits 0. uvicorn handles SIGTERM while it
    serves, then restores the handler it found and raises the signal again
    (uvicorn/server.py `capture_signals`): with the default handler the process died
    there, before `serve`'s own clean-up. This handler, found and called again, notes it;
    one that lands before uvicorn starts serving or after it stopped ends the server too.
    False off the main thread, where no handler can be set."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def note(signum: int, frame: object) -> None:
        terminated.append(signum)
        server.should_exit = True

    def ignore(signum: int, frame: object) -> None:
        log.warning("runnerctl serve: %s ignored (SIGTERM stops it)", signal.Signals(signum).name)

    for signum in STOP_SIGNALS:
        signal.signal(signum, note)
    for signum in IGNORED_SIGNALS:
        signal.signal(signum, ignore)
    return True


def _server(controller: Controller, listen: str, metrics: Metrics | None, *,
            extend: Sequence[Callable[[FastAPI], None]], web: WebSettings | None, sign_in: bool,
            log_level: str) -> tuple[str, int, uvicorn.Server]:
    """The page, API and webhook app of `controller` behind uvicorn, for `serve` and the
    demo alike; refuses a non-loopback `listen` unless someone can sign in."""
    refuse_exposed(listen, sign_in=sign_in)
    host, port = parse_listen(listen)
    web = web or WebSettings()
    app = create_app(lambda: controller.view, controller.demand.webhook, metrics, extend=extend,
                     webhook_refusal=controller.demand.refusal,
                     health=controller.liveness.report, max_body_bytes=web.max_body_bytes)
    return host, port, uvicorn.Server(http_config(app, host, port, web, log_level))


def serve_in_background(controller: Controller, listen: str, metrics: Metrics | None = None, *,
                        extend: Sequence[Callable[[FastAPI], None]] = (),
                        web: WebSettings | None = None, sign_in: bool = False) -> uvicorn.Server | None:
    """The app on a daemon thread (the demo); None when the address is taken."""
    host, port, server = _server(controller, listen, metrics, extend=extend, web=web, sign_in=sign_in,
                                 log_level="error")
    try:
        socks = listening_sockets(host, port)
    except ConfigError:
        return None
    thread = threading.Thread(target=server.run, kwargs={"sockets": socks}, name="web", daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        for sock in socks:
            sock.close()
        return None
    return server


def check_listen(listen: str) -> None:
    """ConfigError (one line) unless HOST:PORT can be listened on now (not in use, an
    address of this machine, allowed): checked before `serve` starts anything."""
    for sock in listening_sockets(*parse_listen(listen)):
        sock.close()


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on every address HOST resolves to (`localhost`: ::1 and
    127.0.0.1, as uvicorn's own bind has it), all on one port (port 0: one free port,
    the first picks it), for uvicorn to serve on; ConfigError in one line when one cannot
    be had."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"--listen {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys((f, k, p, "", a) for f, k, p, _, a in found):
            if socks and port == 0:  # the others on the port the first one got
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # IPv6 only: 127.0.0.1 gets its own socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)  # uvicorn's own backlog
    except OSError as exc:
        for sock in socks:
            sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return socks


def bound_address(host: str, socks: list[socket.socket]) -> str:
    """HOST:PORT to type for sockets listening on HOST: its name as given, the port they got
    (an IPv6 address in brackets)."""
    port = socks[0].getsockname()[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
