"""Registry credentials for the docker driver's pull, found as gitlab-runner's docker
executor finds them (gitlab-org/gitlab-runner helpers/docker/auth/auth.go,
`Resolver.ConfigForImage` and `AllConfigs`).

Sources, in this order; a registry path named by an earlier source keeps its
credentials (`RegistryInfos.Append` refuses a second):
1. the job's `DOCKER_AUTH_CONFIG` variable, a Docker config (`{"auths": {...}}`);
2. the Docker config of gitlab-runner's user, whose stage this is (`~/.docker/config.json`,
   else `~/.dockercfg`; read by the Docker SDK): every `auths` key by its path, and the
   credential helper's answer for the image's host;
3. the job payload's `credentials` of type `registry`: GitLab's own container registry
   with `gitlab-ci-token` and the job's token (common/spec/spec.go `Credentials`).

The image's path is normalised (a Docker Hub image gets `docker.io/`, the tag is cut, the
host name lower-cased: `normalizeImageRef`) and matched against the registry paths
(`convertToRegistryPath`: a scheme and what follows the host dropped), the image path
first and then each parent, so the longest match wins.

Unlike gitlab-runner, the credential helpers a job's `DOCKER_AUTH_CONFIG` names
(`credsStore`, `credHelpers`) are not run: that would run a program the job picks on
the host, as gitlab-runner's user. They are named in the job log as unused.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from collections.abc import Callable, Iterable

DOCKER_HUB = "docker.io"
SOURCE_VARIABLE = "$DOCKER_AUTH_CONFIG"
SOURCE_PAYLOAD = "job payload (GitLab Registry)"
SOURCE_HOME = "gitlab-runner's user's Docker config"
_SCHEME = re.compile(r"^https?://", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Credential:
    """A user name and password for one registry path, and where they came from."""

    path: str
    source: str
    username: str
    password: str = dataclasses.field(repr=False)

    def auth_config(self) -> dict[str, str]:
        """As the Docker SDK's `images.pull(auth_config=...)` takes them."""
        return {"username": self.username, "password": self.password}


@dataclasses.dataclass(frozen=True)
class RegistryCredential:
    """One `credentials` entry of the job payload (type, url, username, password)."""

    type: str
    url: str
    username: str
    password: str = dataclasses.field(repr=False)


def _lower_host(path: str) -> str:
    host, sep, rest = path.partition("/")
    return host.lower() + sep + rest


def image_path(image: str) -> str:
    """The image as a registry path: `nginx:1` -> `docker.io/nginx`,
    `index.docker.io/a/b` -> `docker.io/a/b`, `Reg.Example:5000/x/y:z` -> `reg.example:5000/x/y`."""
    head, _, name = image.rpartition("/")
    name = name.partition(":")[0]
    path = f"{head}/{name}" if head else name
    first, _, rest = path.partition("/")
    hub = "/" not in path or ("." not in first and ":" not in first and first.lower() != "localhost")
    if hub:
        path = f"{DOCKER_HUB}/{path}"
    elif first.lower() == f"index.{DOCKER_HUB}":
        path = f"{DOCKER_HUB}/{rest}"
    return _lower_host(path)


def registry_path(server: str) -> str:
    """A config's server key as a registry path: `https://index.docker.io/v1/` ->
    `docker.io`, `Registry.example.com/group/` -> `registry.example.com/group`."""
    if _SCHEME.match(server):
        host = _SCHEME.sub("", server).partition("/")[0].lower()
        return DOCKER_HUB if host == f"index.{DOCKER_HUB}" else host
    path = server.rstrip("/")
    tag, slash = path.rfind(":"), path.rfind("/")
    if slash != -1 and tag > slash:
        path = path[:tag]
    return _lower_host(path)


def _parents(path: str) -> Iterable[str]:
    while path:
        yield path
        path = path.rpartition("/")[0]


def from_docker_config(text: str) -> tuple[list[tuple[str, str, str]], str]:
    """(server, username, password) of each `auths` entry of a Docker config, and a
    problem for the job log ("" when none). Not JSON or not a config: no entries."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        return [], f"it is not JSON ({exc.msg})"
    if not isinstance(config, dict):
        return [], "it is not a JSON object"
    found, problems = [], []
    auths = config.get("auths") or {}
    for server, entry in (auths.items() if isinstance(auths, dict) else ()):
        if not isinstance(entry, dict):
            continue
        username, password = str(entry.get("username") or ""), str(entry.get("password") or "")
        if entry.get("auth"):
            try:
                decoded = base64.b64decode(str(entry["auth"]), validate=True).decode()
                username, _, password = decoded.partition(":")
            except (binascii.Error, UnicodeDecodeError):
                problems.append(f"the auth of {server} is not base64 of user:password")
                continue
        if username:
            found.append((str(server), username, password))
    helpers = [key for key in ("credsStore", "credHelpers") if config.get(key)]
    if helpers:
        problems.append(f"its {' and '.join(helpers)} are not run (a program the job would pick)")
    return found, "; ".join(problems)


def for_image(image: str, *, variable: str, home: Callable[[str], Iterable[tuple[str, str, str]]],
              payload: Iterable[RegistryCredential]) -> tuple[Credential | None, list[str]]:
    """The credentials to pull `image` with (None: pull without), and lines for the job
    log about sources that could not be read. `variable` is DOCKER_AUTH_CONFIG's value;
    `home(host)` gives (server, username, password) of gitlab-runner's user's own Docker
    config, its helper asked for the image's host."""
    known: dict[str, Credential] = {}
    notes = []

    def add(source: str, server: str, username: str, password: str) -> None:
        path = registry_path(server)
        known.setdefault(path, Credential(path, source, username, password))

    if variable.strip():
        entries, problem = from_docker_config(variable)
        if problem:
            notes.append(f"DOCKER_AUTH_CONFIG: {problem}")
        for server, username, password in entries:
            add(SOURCE_VARIABLE, server, username, password)
    wanted = image_path(image)
    for server, username, password in home(wanted.partition("/")[0]):
        add(SOURCE_HOME, server, username, password)
    for entry in payload:
        if entry.type == "registry" and entry.url:
            add(SOURCE_PAYLOAD, entry.url, entry.username, entry.password)
    for path in _parents(wanted):
        if path in known:
            return known[path], notes
    return None, notes
