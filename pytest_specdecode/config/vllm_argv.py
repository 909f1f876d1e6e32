"""vLLM server command lines: recognise one, and derive the candidate's from it.

Three shapes are understood: `vllm serve MODEL …`, `python -m vllm.entrypoints.openai.api_server
…`, and (for systemd units) `docker run`/`podman run` with their own options, then an image whose
entrypoint is vLLM's server, then the server's arguments. Everything else is refused, with a
message that says how to put the server's flags where this tool can edit them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.specconfig import SpecConfig
from ..errors import ConfigError

SPEC_FLAG = "--speculative-config"
# vLLM's own per-request spec-decode metrics (record/requests/request_metrics.py): the option, and
# the level asked for ("detailed" has the per-step arrays; "summary" the histogram only)
REQUEST_METRICS_FLAG = "--per-request-spec-decode-metrics"
REQUEST_METRICS_LEVEL = "detailed"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default for --gpu-memory-utilization
# Images whose entrypoint is vLLM's OpenAI server (`vllm serve`, or the api_server module in older
# tags). Others count only when the user names them: [target] vllm_images.
VLLM_IMAGES = ("vllm/vllm-openai",)
_DOCKER_HUB = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")
IMAGE_NAME = re.compile(
    r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?/)?"  # registry[:port]/
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"  # path
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$"  # :tag
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "busybox"}

# `docker run` / `podman run` options that take a value (the next argument, unless written as
# --opt=value). Options absent from both tables are refused unless written as --opt=value.
_VALUE_OPTIONS = _words(
    """
    add-host annotation arch attach authfile blkio-weight blkio-weight-device cap-add cap-drop
    cgroup-conf cgroup-parent cgroupns cgroups chrootdirs cidfile conmon-pidfile cpu-period
    cpu-quota cpu-rt-period cpu-rt-runtime cpu-shares cpus cpuset-cpus cpuset-mems
    decryption-key detach-keys device device-cgroup-rule device-read-bps device-read-iops
    device-write-bps device-write-iops dns dns-opt dns-option dns-search domainname entrypoint
    env env-file env-merge expose gidmap gpus group-add group-entry health-cmd health-interval
    health-log-destination health-max-log-count health-max-log-size health-on-failure
    health-retries health-start-interval health-start-period health-startup-cmd
    health-startup-interval health-startup-retries health-startup-success
    health-startup-timeout health-timeout hostname hosts-file hostuser image-volume init-path
    ip ip6 ipc isolation kernel-memory label label-file link link-local-ip log-driver log-opt
    mac-address memory memory-reservation memory-swap memory-swappiness mount name network
    net network-alias net-alias oom-score-adj os passwd-entry personality pid pidfile
    pids-limit platform pod pod-id-file preserve-fd publish pull rdt-class requires restart
    retry retry-delay runtime sdnotify seccomp-policy secret security-opt shm-size
    shm-size-systemd stop-signal stop-timeout storage-opt subgidname subuidname sysctl
    systemd timeout tmpfs uidmap ulimit umask unsetenv user userns uts variant volume
    volume-driver volumes-from workdir
    """
)
_FLAG_OPTIONS = _words(
    """
    detach disable-content-trust env-host http-proxy init interactive no-healthcheck no-hosts
    oom-kill-disable privileged publish-all quiet read-only read-only-tmpfs replace rm rmi
    rootfs sig-proxy tls-verify tty use-api-socket
    """
)
_SHORT_VALUE = {"a", "c", "e", "h", "l", "m", "p", "u", "v", "w"}
_SHORT_FLAG = {"d", "i", "P", "q", "t"}
# Options of the engine itself, before `run`.
_ENGINE_VALUE_OPTIONS = _words(
    "host context config log-level root runroot cgroup-manager connection url identity"
)


@dataclass(frozen=True)
class ServerCommand:
    """What runs vLLM's server in a command line, and where the server's own arguments start."""

    kind: str  # "vllm serve", "python -m api_server", "docker run", "podman run"
    server_args: int  # index of the first argument that the server itself receives
    image: str | None = None
    image_at: int | None = None  # where the image is in the command line (a container's)
    container_name: str | None = None
    engine: tuple[str, ...] = ()  # a container's: the engine and its own options, before `run`
    publish: tuple[str, ...] = ()  # a container's -p/--publish values, in order
    network: str | None = None  # a container's --network/--net
    publish_all: bool = False  # -P/--publish-all: every port on a random host port


def parse_server_command(
    argv: Sequence[str], *, where: str, images: Sequence[str] | None = None
) -> ServerCommand:
    """Recognise a vLLM server command. `images` None: a container is refused (local backend)."""
    found = _direct_server(argv)
    if found is not None:
        return found
    if argv and posixpath.basename(argv[0]) in ("docker", "podman"):
        if images is None:
            raise ConfigError(
                f"{where}: `{_shown(argv)}` runs the server in a container; the local backend "
                "runs the server as its own child process. Give [target] command as "
                "`vllm serve MODEL …` or `python -m "
                f"{API_SERVER_MODULE} …`, or use the systemd backend for a container unit"
            )
        return _container(argv, where=where, images=images)
    raise ConfigError(_refusal(argv, where))


def check_vllm_command(
    argv: Sequence[str], *, where: str, images: Sequence[str] | None = None
) -> ServerCommand:
    """Accept what `parse_server_command` recognises, or raise a ConfigError saying why not."""
    return parse_server_command(argv, where=where, images=images)


def with_speculative_config(
    argv: Sequence[str], spec: SpecConfig, *, where: str, images: Sequence[str] | None = None
) -> list[str]:
    """The same command with `--speculative-config JSON` (replacing any that was there), then
    the spec's `extra_args`.

    The A/A candidate is the original's command unchanged; a control arm (--spec-control), the
    original's command plus its `extra_args` (e.g. `--no-async-scheduling`).
    """
    start = parse_server_command(argv, where=where, images=images).server_args
    if spec.is_original:
        return [*argv, *spec.extra_args]
    kept = [a for i, a in enumerate(argv) if i < start or i not in spec_flag_positions(argv, start)]
    return [*kept, SPEC_FLAG, spec.to_json(), *spec.extra_args]


def spec_flag_positions(argv: Sequence[str], start: int) -> set[int]:
    """Indices of an existing `--speculative-config [JSON]` among the server's arguments."""
    out: set[int] = set()
    i = start
    while i < len(argv):
        if argv[i] == SPEC_FLAG:
            out |= {i, i + 1}
            i += 2
            continue
        if argv[i].startswith(SPEC_FLAG + "="):
            out.add(i)
        i += 1
    return {i for i in out if i < len(argv)}


def option_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `--flag V` or `--flag=V` in argv, the last one winning."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def served_model(argv: Sequence[str], server: ServerCommand) -> str | None:
    """The model a vLLM server command loads: `--model X`, `--model=X`, or `vllm serve X`."""
    args = list(argv[server.server_args :])
    named = option_value(args, "--model")
    if named is not None:
        return named
    direct = server.kind in ("vllm serve", "docker run", "podman run")
    if direct and args and not args[0].startswith("-"):
        return args[0]
    return None


def host_address(server: ServerCommand, listen: tuple[str, int], *, where: str) -> tuple[str, int]:
    """Where a server listening at `listen` answers on the host: through a container's -p.

    A server that is not in a container, or shares the host's network, answers where it
    listens. Otherwise the API is wherever a -p/--publish maps its port to, on the host's side.
    """
    if server.image is None or server.network == "host":
        return listen
    port = listen[1]
    for spec in server.publish:
        mapped = _published(spec, port)
        if mapped is not None:
            host, host_port = mapped
            if host_port is None:
                raise ConfigError(
                    f"{where}: `-p {spec}` publishes the server's port {port} on a random host "
                    "port, so where its API answers changes with each start. Publish it on a "
                    f"fixed one (-p HOSTPORT:{port})"
                )
            return host or "0.0.0.0", host_port
    published = ", ".join(f"-p {p}" for p in server.publish) or "no -p at all"
    random = " (-P picks random host ports)" if server.publish_all else ""
    raise ConfigError(
        f"{where}: the server listens on port {port} inside the container {server.image}, and "
        f"the unit publishes no host port for it ({published}{random}); cannot tell where its "
        f"API answers on the host. Publish it (-p HOSTPORT:{port}) or run it with --network=host"
    )


def _published(spec: str, port: int) -> tuple[str, int | None] | None:
    """(host address, host port or None for a random one) if `spec` publishes TCP `port`."""
    spec, _, proto = spec.partition("/")
    if proto not in ("", "tcp"):
        return None
    host = ""
    if spec.startswith("["):  # [IPv6]:HOSTPORT:PORT
        host, _, spec = spec[1:].partition("]")
        spec = spec.removeprefix(":")
        parts = ["", *spec.split(":")] if spec.count(":") == 1 else spec.split(":")
    else:
        parts = spec.split(":")
    if len(parts) == 3:
        host = host or parts[0]
        parts = parts[1:]
    if len(parts) == 1:
        parts = ["", parts[0]]
    if len(parts) != 2:
        return None
    host_part, container_part = parts
    inside = _port_range(container_part)
    if inside is None or not inside[0] <= port <= inside[1]:
        return None
    if not host_part:
        return host, None
    outside = _port_range(host_part)
    if outside is None:
        return None
    offset = port - inside[0] if outside[1] - outside[0] == inside[1] - inside[0] else 0
    return host, outside[0] + offset


def _port_range(text: str) -> tuple[int, int] | None:
    found = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", text)
    if not found:
        return None
    low = int(found.group(1))
    return low, int(found.group(2) or low)


def check_image_names(names: Sequence[str], *, where: str) -> tuple[str, ...]:
    """[target] vllm_images: image names, with or without a tag, nothing a shell could misread."""
    out = []
    for name in names:
        if not isinstance(name, str) or not IMAGE_NAME.match(name) or len(name) > 255:
            raise ConfigError(
                f"{where}: vllm_images entry {name!r} is not an image name such as "
                "'registry.example.com/team/vllm' or 'my-vllm:v1'"
            )
        out.append(name)
    return tuple(out)


def image_is_vllm(image: str, images: Sequence[str]) -> bool:
    """Whether `image` (a reference, perhaps with ${VAR} in its tag) is a known vLLM server."""
    ref = _without_hub(image.split("@", 1)[0])
    repo = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    for known in (*VLLM_IMAGES, *images):
        known = _without_hub(known)
        if ":" in known.rsplit("/", 1)[-1]:  # a name with its tag: only that tag
            if ref == known:
                return True
        elif repo == known:
            return True
    return False


def _without_hub(name: str) -> str:
    for prefix in _DOCKER_HUB:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name.removeprefix("library/")


def _direct_server(argv: Sequence[str]) -> ServerCommand | None:
    if len(argv) >= 3 and posixpath.basename(argv[0]) == "vllm" and argv[1] == "serve":
        return ServerCommand("vllm serve", 2)
    if (
        len(argv) >= 3
        and posixpath.basename(argv[0]).startswith("python")
        and argv[1] == "-m"
        and argv[2] == API_SERVER_MODULE
    ):
        return ServerCommand("python -m api_server", 3)
    return None


def _container(argv: Sequence[str], *, where: str, images: Sequence[str]) -> ServerCommand:
    engine = posixpath.basename(argv[0])
    i = 1
    while i < len(argv) and argv[i].startswith("-"):  # the engine's own options
        name = argv[i].lstrip("-").split("=", 1)[0]
        if "=" in argv[i]:
            i += 1
        elif name in _ENGINE_VALUE_OPTIONS or argv[i] in ("-H", "-c", "-l"):
            i += 2
        else:
            raise ConfigError(
                f"{where}: `{engine} {argv[i]}` before `run` is an option this tool does not "
                f"know; write it as {argv[i]}=VALUE if it takes one"
            )
    if argv[i : i + 2] == ["container", "run"]:
        i += 1
    if i >= len(argv) or argv[i] != "run":
        raise ConfigError(
            f"{where}: `{_shown(argv)}` is not `{engine} run …`: only a container run in the "
            "foreground can be a vLLM unit's ExecStart"
        )
    engine_argv = tuple(argv[:i])
    i += 1
    options: dict[str, list[str]] = {}
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg.startswith("$") and not arg.startswith("${"):  # systemd splits $VAR into words
            raise ConfigError(
                f"{where}: `{arg}` among the `{engine} run` options expands to words this tool "
                "cannot see; write the options out in ExecStart="
            )
        if not arg.startswith("-") or arg == "-":
            break
        i = _container_option(argv, i, options, engine=engine, where=where)
    if i >= len(argv):
        raise ConfigError(f"{where}: `{engine} run` without an image")
    image = argv[i]
    after = list(argv[i + 1 :])
    if "detach" in options and engine == "docker":
        raise ConfigError(
            f"{where}: `docker run -d` returns at once and leaves the container to dockerd, so "
            "the unit cannot stop it or see it die. Run it in the foreground (drop -d/--detach)"
        )
    found = {
        "image": image,
        "image_at": i,
        "container_name": _last(options, "name"),
        "engine": engine_argv,
        "publish": tuple(options.get("publish", ())),
        "network": _last(options, "network") or _last(options, "net"),
        "publish_all": "publish-all" in options,
    }
    entrypoint = _last(options, "entrypoint")
    if entrypoint:  # one executable; the words after the image are its arguments
        if posixpath.basename(entrypoint) in _SHELLS:
            raise ConfigError(_shell_refusal([entrypoint, *after], where))
        direct = _direct_server([entrypoint, *after])
        if direct is None:
            raise ConfigError(
                f"{where}: the container's --entrypoint {entrypoint!r} with `{_shown(after)}` is "
                f"not `vllm serve …` or `python -m {API_SERVER_MODULE} …`"
            )
        start = i + direct.server_args  # argv[i] is the image, in the entrypoint's place
        return ServerCommand(f"{engine} run", start, **found)
    if after and (posixpath.basename(after[0]) in _SHELLS or after[0].endswith(".sh")):
        raise ConfigError(_shell_refusal(argv, where))
    if not image_is_vllm(image, images):
        raise ConfigError(
            f"{where}: cannot tell whether image {image!r} runs vLLM's OpenAI server: known are "
            f"{', '.join((*VLLM_IMAGES, *images))}. If its entrypoint is `vllm serve` (or the "
            f"api_server module), so that the arguments after the image are the server's, name "
            f'it in the config: [target] vllm_images = ["{_repo_of(image)}"]'
        )
    return ServerCommand(f"{engine} run", i + 1, **found)


def _last(options: dict[str, list[str]], name: str) -> str | None:
    values = options.get(name)
    return values[-1] if values else None


def _container_option(
    argv: Sequence[str], i: int, options: dict[str, list[str]], *, engine: str, where: str
) -> int:
    """Read one option at argv[i] into `options` (every value kept); returns the index after."""
    arg = argv[i]
    if arg.startswith("--"):
        name, eq, value = arg[2:].partition("=")
        if eq:
            options.setdefault(name, []).append(value)
            return i + 1
        if name in _FLAG_OPTIONS:
            options.setdefault(name, []).append("true")
            return i + 1
        if name in _VALUE_OPTIONS:
            if i + 1 >= len(argv):
                raise ConfigError(f"{where}: `{engine} run --{name}` lacks its value")
            options.setdefault(name, []).append(argv[i + 1])
            return i + 2
        raise ConfigError(
            f"{where}: `{engine} run --{name}` is an option this tool does not know, so it "
            f"cannot tell whether the next word is its value or the image; write it as "
            f"--{name}=VALUE (or --{name}=true for a flag)"
        )
    letters = arg[1:]
    for k, letter in enumerate(letters):
        long = _SHORT_LONG.get(letter, letter)
        if letter in _SHORT_FLAG:
            options.setdefault(long, []).append("true")
            continue
        if letter in _SHORT_VALUE:
            rest = letters[k + 1 :].removeprefix("=")
            if rest:
                options.setdefault(long, []).append(rest)
                return i + 1
            if i + 1 >= len(argv):
                raise ConfigError(f"{where}: `{engine} run -{letter}` lacks its value")
            options.setdefault(long, []).append(argv[i + 1])
            return i + 2
        raise ConfigError(
            f"{where}: `{engine} run -{letter}` is an option this tool does not know; write it "
            "in its long form as --OPTION=VALUE"
        )
    return i + 1


_SHORT_LONG = {
    "a": "attach",
    "c": "cpu-shares",
    "d": "detach",
    "e": "env",
    "h": "hostname",
    "i": "interactive",
    "l": "label",
    "m": "memory",
    "p": "publish",
    "P": "publish-all",
    "q": "quiet",
    "t": "tty",
    "u": "user",
    "v": "volume",
    "w": "workdir",
}


def _repo_of(image: str) -> str:
    ref = image.split("@", 1)[0]
    return ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref


def _shown(argv: Sequence[str]) -> str:
    return " ".join(argv[:4]) + (" …" if len(argv) > 4 else "")


_HOW_TO_EXPOSE = (
    "Put the server's own command in ExecStart= (`vllm serve MODEL …`, `python -m "
    f"{API_SERVER_MODULE} …`, or `docker run … IMAGE --model …`): keep set-up steps in "
    "ExecStartPre= and variables in Environment=/EnvironmentFile=, so the flags are visible"
)


def _shell_refusal(argv: Sequence[str], where: str) -> str:
    return (
        f"{where}: `{_shown(argv)}` runs a shell, which hides the server's flags from this tool "
        f"(it must add --speculative-config among them). {_HOW_TO_EXPOSE}"
    )


def _refusal(argv: Sequence[str], where: str) -> str:
    head = posixpath.basename(argv[0]) if argv else ""
    if head in _SHELLS:
        return _shell_refusal(argv, where)
    return (
        f"{where}: cannot derive a candidate from `{_shown(argv)}`: expected `vllm serve MODEL "
        f"…`, `python -m {API_SERVER_MODULE} …` or `docker run`/`podman run` with a vLLM image "
        f"(a wrapper script hides the flags this tool must edit). {_HOW_TO_EXPOSE}"
    )
