#!/usr/bin/python3
# STAND-IN for `docker`, installed on the systemd test host by pytest-specdecode's tests
# (tests/test_production_units.py) and removed after them. The test host has no container engine.
# It behaves like `docker run` for the options pytest-specdecode parses, with a deliberately
# small engine: the "image" vllm/vllm-openai runs vLLM's OpenAI server, exec'd in place, with
# the arguments after the image; -e sets its environment; -v only accepts a path bound at the
# same path; -p only the same port; --gpus, --ipc, --shm-size and the like are accepted and
# ignored (no GPU here). Every other use exits 125, as docker does for a bad invocation.
"""Stand-in `docker`: `docker run [OPTIONS] IMAGE [ARG...]` for the vLLM image only."""

import json
import os
import sys

SERVER = ["@SERVER_PYTHON@", "-m", "vllm.entrypoints.openai.api_server"]  # filled in by the test
IMAGES = {"vllm/vllm-openai", "docker.io/vllm/vllm-openai"}
VALUE = {
    "--name",
    "-e",
    "--env",
    "-v",
    "--volume",
    "-p",
    "--publish",
    "--gpus",
    "--ipc",
    "--shm-size",
    "--runtime",
    "--network",
    "--net",
    "-u",
    "--user",
    "-w",
    "--workdir",
    "--entrypoint",
    "--ulimit",
    "--env-file",
    "--mount",
    "--label",
    "-l",
    "--restart",
}
FLAGS = {"--rm", "-i", "-t", "-it", "--init", "--privileged", "--interactive", "--tty"}


def fail(message: str) -> None:
    print(f"stand-in docker: {message}", file=sys.stderr, flush=True)
    sys.exit(125)


def main(argv: list[str]) -> None:
    if argv[:1] == ["rm"] or argv[:1] == ["stop"]:  # ExecStartPre=-docker rm -f NAME etc.
        return
    if argv[:1] != ["run"]:
        fail(f"only `run` is stood in for, not {argv[:1]}")
    env = dict(os.environ)
    options: dict[str, str] = {}
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if eq and name.startswith("--"):
            i += 1
        elif arg in FLAGS:
            name, value, i = arg, "true", i + 1
        elif arg in VALUE:
            name, value, i = arg, argv[i + 1], i + 2
        elif arg[:2] in ("-e", "-v", "-p") and len(arg) > 2:
            name, value, i = arg[:2], arg[2:], i + 1
        else:
            fail(f"unknown option {arg}")
        if name in ("-e", "--env"):
            key, _, val = value.partition("=")
            env[key] = val if _ else os.environ.get(key, "")
        elif name in ("-v", "--volume"):
            src, dst = value.split(":")[:2]
            if os.path.realpath(src) != os.path.realpath(dst):
                fail(f"volume {value}: only a path bound at the same path is stood in for")
        elif name in ("-p", "--publish"):
            host_port, _, container_port = value.rpartition(":")
            if host_port.split(":")[-1] != container_port:
                fail(f"publish {value}: only the same port is stood in for")
        options[name] = value
    if i >= len(argv):
        fail("no image")
    image, args = argv[i], argv[i + 1 :]
    if image.rsplit(":", 1)[0] not in IMAGES:
        fail(f"image {image}: only vllm/vllm-openai is stood in for")
    print(
        f"stand-in docker: run name={options.get('--name', '')} image={image} "
        f"args={json.dumps(args)}",
        file=sys.stderr,
        flush=True,
    )
    os.execve(SERVER[0], [*SERVER, *args], env)


if __name__ == "__main__":
    main(sys.argv[1:])
