"""The embedded default: vLLM as a child process on this machine (each: local_process.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ..config.specconfig import SpecConfig, VllmFacts
from ..config.vllm_argv import parse_server_command, served_model, with_speculative_config
from ..errors import ConfigError, HostError
from .base import Progress, Transports, port_answers
from .beside.placement import (
    GPU_SHARE,
    Placement,
    PlannedServer,
    api_base_on_port,
    cpu_room,
    gpu_placements,
    shown,
    split_cores,
    with_port,
)
from .facts.devices import ServerGpus, memory_after_restore, read_server_gpus
from .facts.gpu import APPS_QUERY, Gpu, GpuOutputError, parse_compute_apps
from .facts.model_config import ModelSite
from .facts.vllm import ask_vllm
from .hosts.base import LocalHost
from .local_process import LocalProcessService, server_env


class LocalProcessTarget:
    """The original server command and the candidates derived from it, all on this machine."""

    host_name = "localhost"
    adopts_running_original = False  # it starts the original itself, and stops it at the end
    typical_start_s = 60.0

    def __init__(
        self,
        *,
        command: Sequence[str],
        api_base: str,
        model: str,
        workdir: Path,
        env: Mapping[str, str],
        log_dir: Path,
        cores: Iterable[int] | None = None,
        gpu_share: float = GPU_SHARE,
    ) -> None:
        self.command = list(command)
        # the cores this process may use: two servers side by side get half each
        self.cores = tuple(sorted(cores if cores is not None else os.sched_getaffinity(0)))
        self.gpu_share = gpu_share
        self.api_base = api_base
        self.model = model
        self.workdir = workdir
        self.env = dict(env)
        self.log_dir = log_dir
        self.host = LocalHost()
        self._original: LocalProcessService | None = None
        self._services: list[LocalProcessService] = []
        self._beside_ports: dict[str, int] = {}

    def preflight(self) -> None:
        """Refuse a port that something else already serves (this backend only runs its own),
        and a command that asks for more GPUs than it sees (`gpu_refusal`)."""
        why = self.gpu_refusal()
        if why:
            raise ConfigError(why)
        if port_answers(self.api_base):
            parts = urlsplit(self.api_base)
            raise ConfigError(
                f"port {parts.port} on {parts.hostname} is already in use, before anything was "
                "started: the local backend only measures a server it starts itself. Stop "
                "whatever listens there, or change --port/api_base in the config"
            )
        if not (self.workdir / self.command[0]).exists() and "/" in self.command[0]:
            raise ConfigError(
                f"the server command {self.command[0]!r} does not exist under {self.workdir}; "
                "run scripts/setup-embedded first"
            )

    def vllm_facts(self, progress: Progress | None = None) -> VllmFacts:
        """Asked of the command's own Python, with the server's environment."""
        argv = list(self.command)
        if "/" in argv[0] and not os.path.isabs(argv[0]):
            argv[0] = str(self.workdir / argv[0])
        host = LocalHost(server_env(self.env))
        return ask_vllm(host, argv, where="the local server command", progress=progress)

    def model_site(self) -> ModelSite:
        """Where the server loads its models: this machine, from its working directory."""
        where = "the local server command"
        server = parse_server_command(self.command, where=where)
        model = served_model(self.command, server)
        host = LocalHost(server_env(self.env))
        return ModelSite(host, f"{where} on {self.host_name}", model, workdir=str(self.workdir))

    def before_swap(self) -> None:
        return None  # the child processes die with this controller (PR_SET_PDEATHSIG)

    def original(self) -> LocalProcessService:
        if self._original is None:
            self._original = self._service("original", self.command)
        return self._original

    def candidate(self, spec: SpecConfig) -> LocalProcessService:
        argv = with_speculative_config(self.command, spec, where="[target] command")
        return self._service(f"candidate-{spec.name}", argv, env=spec.env)

    def server_gpus(self) -> ServerGpus:
        """The GPUs the server command sees (its CUDA_VISIBLE_DEVICES, [target.env]'s or this
        process's) and the GPUs it asks for (tensor x pipeline parallel). Reads only."""
        return read_server_gpus(self.host, self.command, server_env(self.env))

    def gpu_refusal(self) -> str | None:
        """Why the command cannot serve on the GPUs it sees, naming the host; None where it
        can, or on a CPU."""
        why = self.server_gpus().refusal()
        return f"refused on {self.host_name}, nothing was touched: {why}" if why else None

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        """The steps, each server on the GPUs it sees; a ConfigError where it cannot serve."""
        gpus = self.server_gpus()
        why = self.gpu_refusal()
        if why:
            raise ConfigError(why)
        on = f" on {gpus.describe()}" if gpus.used else ""
        steps = [f"start the original{on}: (cd {self.workdir} && {shlex.join(self.command)})"]
        for spec in specs:
            argv = with_speculative_config(self.command, spec, where="[target] command")
            env = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(spec.env.items()))
            steps += [
                "stop the running server",
                f"start candidate {spec.name}: {env}{shlex.join(argv)}",
            ]
        steps.append("stop the last server (the original was not running before)")
        return steps

    def transports(self) -> Transports:
        return Transports()

    # -- two servers side by side (--spec-arms together) -----------------------------------
    def room_beside(self, spec: SpecConfig, *, of: int = 1) -> str | None:
        """None where `of` servers fit beside the original; else why not, with figures."""
        layout = self._layout(of + 1)
        return layout if isinstance(layout, str) else None

    def beside_plan(self, spec: SpecConfig) -> str:
        """For the plan: where each of the two would run, and how. Starts and changes nothing."""
        mine, theirs = self.beside_servers(spec)
        return (
            f"the original on {mine.where} (restarted there: {mine.command}), the candidate on "
            f"{theirs.where} ({theirs.command})"
        )

    def beside_servers(
        self, spec: SpecConfig, *, swap: bool = False, place: int = 1, of: int = 1
    ) -> tuple[PlannedServer, PlannedServer]:
        """For the plan: the original and the candidate as `beside` would place them (the same
        places, port and command), named. Starts and changes nothing."""
        mine, theirs, port = self._places(spec, swap=swap, place=place, of=of)
        taskset = shutil.which("taskset")
        argv = with_speculative_config(self.command, spec, where="[target] command")
        second = with_port(theirs.argv(argv, taskset=taskset), port)
        return (
            PlannedServer(
                "original",
                self._where(mine, self.api_base),
                shown(mine.argv(self.command, taskset=taskset), mine.env()),
                mine.memory_share,
                mine.cores,
            ),
            PlannedServer(
                spec.name,
                self._where(theirs, api_base_on_port(self.api_base, port)),
                shown(second, {**spec.env, **theirs.env()}),
                theirs.memory_share,
                theirs.cores,
            ),
        )

    swaps_places = True  # side by side, the two may take each other's cores or GPUs

    def beside(
        self, spec: SpecConfig, *, swap: bool = False, place: int = 1, of: int = 1
    ) -> LocalProcessService:
        """The candidate's server on a port of its own, with its part of the cores or its GPU
        share: place `place` of `of` servers beside the original; the original is placed on its
        own part for its next start. Not started. `swap`: the places turn by one, so that each
        server sits in another's (the ports stay: the original keeps its own)."""
        mine, theirs, port = self._places(spec, swap=swap, place=place, of=of)
        taskset = shutil.which("taskset")
        original = self.original()
        original.place(
            mine.argv(self.command, taskset=taskset),
            {**self.env, **mine.env()},
            self._where(mine, self.api_base),
        )
        api_base = api_base_on_port(self.api_base, port)
        argv = with_speculative_config(self.command, spec, where="[target] command")
        second = self._service(
            f"beside-{spec.name}",
            with_port(theirs.argv(argv, taskset=taskset), port),
            env={**spec.env, **theirs.env()},
            api_base=api_base,
        )
        second.placement = self._where(theirs, api_base)
        return second

    def _places(
        self, spec: SpecConfig, *, swap: bool, place: int, of: int
    ) -> tuple[Placement, Placement, int]:
        """The original's place, the candidate's and its port: `beside`'s and the plan's."""
        layout = self._layout(of + 1)
        if isinstance(layout, str):
            raise ConfigError(layout)
        turn = 1 if swap else 0
        mine = layout[turn % len(layout)]
        theirs = layout[(place + turn) % len(layout)]
        return mine, theirs, self._beside_port(spec.name)

    @staticmethod
    def _where(placement: Placement, api_base: str) -> str:
        port = urlsplit(api_base).port
        return f"port {port}, {placement.describe()}"

    def _layout(self, servers: int = 2) -> tuple[Placement, ...] | str:
        """Each of `servers` servers' place, the original's first: GPUs where nvidia-smi lists
        any, else cores; or why not."""
        found = self.server_gpus()
        gpus = self._gpus(found)
        if gpus:
            layout = gpu_placements(
                gpus, share=self.gpu_share, tensor_parallel=found.per_server, servers=servers
            )
        else:
            layout = cpu_room(self.cores, servers) or split_cores(self.cores, servers)
        if isinstance(layout, str):
            what = "a second server" if servers == 2 else f"{servers - 1} servers"
            return f"no room for {what} beside the original on {self.host_name}: {layout}"
        return layout

    def _gpus(self, found: ServerGpus) -> list[Gpu]:
        """The GPUs the server would see (`server_gpus`), less what this target's own servers
        hold there; none: a CPU."""
        gpus = list(found.seen)
        own = self._own_gpu_mib()
        return [
            dataclasses.replace(g, memory_used_mib=max(0, g.memory_used_mib - own[g.uuid]))
            if g.memory_used_mib is not None and own.get(g.uuid)
            else g
            for g in gpus
        ]

    def _own_gpu_mib(self) -> dict[str | None, int]:
        """Per GPU, the memory held by servers this target started (their process groups): room
        for the next pair, as the original restarts at its share and a beside server stops."""
        groups = {s.pid for s in self._services if s.pid is not None and s.is_active()}
        if not groups:
            return {}
        try:
            result = self.host.run(["nvidia-smi", *APPS_QUERY], timeout=30, privileged=False)
            apps = parse_compute_apps(result.stdout) if result.ok else []
        except (HostError, GpuOutputError):
            return {}
        held: dict[str | None, int] = {}
        for app in apps:
            with contextlib.suppress(OSError):
                if os.getpgid(app.pid) in groups:
                    held[app.gpu_uuid] = held.get(app.gpu_uuid, 0) + (app.used_mib or 0)
        return held

    def _beside_port(self, name: str) -> int:
        """The first free port above the original's: the plan and the run name the same one."""
        if name not in self._beside_ports:
            parts = urlsplit(self.api_base)
            base = parts.port or 8000
            taken = set(self._beside_ports.values())
            port = next(
                p
                for p in range(base + 1, base + 200)
                if p not in taken and _port_free(parts.hostname or "127.0.0.1", p)
            )
            self._beside_ports[name] = port
        return self._beside_ports[name]

    def hand_over(self, reason: str) -> str | None:
        """The original was not running before the run: stop every server now, from the signal.

        Should this controller then die, PR_SET_PDEATHSIG covers each server it started (both,
        side by side).
        """
        running = [s for s in self._services if s.is_active()]
        for service in running:
            service.terminate()
        if not running:
            return None
        return "SIGTERM at once to " + ", ".join(s.label for s in running)

    def await_host_restore(self, timeout_s: float, progress: Progress) -> None:
        for service in self._services:
            service.stop()  # waits for the SIGTERM, then makes sure the whole group is gone

    def reachable(self) -> bool:
        return True

    def after_restore(self) -> list[str]:
        return []

    def gpus_after_restore(self) -> list[str]:
        """After the restore stopped every server (the original was not running before): each
        GPU the servers could use, its memory used, once none of it is held by a process of
        theirs (a process group this run started); ServiceError where some still is."""
        groups = {s.pid for s in self._services if s.pid is not None}
        if not groups:
            return []
        gpus = self.server_gpus().seen

        def ours(pid: int) -> bool:
            try:
                return os.getpgid(pid) in groups
            except OSError:  # gone, and still listed: its memory is being released
                return True

        return memory_after_restore(self.host, gpus, ours) if gpus else []

    def close(self) -> None:
        return None

    def _service(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        api_base: str | None = None,
    ) -> LocalProcessService:
        service = LocalProcessService(
            name=name,
            argv=argv,
            api_base=api_base or self.api_base,
            model=self.model,
            workdir=self.workdir,
            env={**self.env, **(env or {})},
            log_path=self.log_dir / f"server-{name}.log",
        )
        self._services.append(service)
        return service


def _port_free(host: str, port: int) -> bool:
    """Nothing listens there and this process may bind it."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
