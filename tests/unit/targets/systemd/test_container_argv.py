"""`docker run` / `podman run` units: where the server's arguments start, and what is refused."""

from dataclasses import replace

import pytest

from pytest_specdecode.config.specconfig import parse_spec_config
from pytest_specdecode.config.vllm_argv import (
    check_image_names,
    image_is_vllm,
    parse_server_command,
    with_speculative_config,
)
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.systemd.inspection import port_held_by_unit
from pytest_specdecode.targets.systemd.unitfile import quote_arg, render_dropin, split_exec

NGRAM = parse_spec_config('{"method":"ngram","num_speculative_tokens":5}', {})
SERVER = ["--model", "/models/kimi", "--tensor-parallel-size", "8"]


def parse(argv, images=()):
    return parse_server_command(argv, where="unit u.service", images=images)


@pytest.mark.parametrize(
    "options",
    [
        ["--rm", "--name", "vllm", "--gpus", "all", "--ipc", "host", "-p", "8000:8000"],
        ["--rm", "--name=vllm", "--gpus=all", "--ipc=host", "--publish=8000:8000"],
        ["-e", "HF_HOME=/cache", "-v", "/srv/models:/models:ro", "--env=A=1", "--volume=/a:/b"],
        ["-it", "-eHF_HOME=/cache", "-p8000:8000", "--shm-size", "16g", "--runtime", "nvidia"],
        [
            "--sig-proxy=false",
            "--network",
            "host",
            "--",
        ],
    ],
)
def test_docker_run_options_are_skipped_up_to_the_image(options):
    argv = ["/usr/bin/docker", "run", *options, "vllm/vllm-openai:v0.11.0", *SERVER]
    found = parse(argv)
    assert found.kind == "docker run"
    assert found.image == "vllm/vllm-openai:v0.11.0"
    assert argv[found.server_args :] == SERVER


def test_the_config_goes_among_the_servers_arguments_after_the_image():
    argv = ["docker", "run", "--rm", "--name", "vllm", "vllm/vllm-openai:latest", *SERVER]
    out = with_speculative_config(argv, NGRAM, where="u", images=())
    assert out == [*argv, "--speculative-config", NGRAM.to_json()]
    # An existing config among the server's arguments is replaced; the options are not touched.
    old = [*argv, "--speculative-config", '{"method":"ngram","num_speculative_tokens":9}']
    assert with_speculative_config(old, NGRAM, where="u", images=()) == out


def test_podman_and_its_engine_options_and_systemd_specifiers():
    unit = (
        "[Service]\nExecStart=/usr/bin/podman --log-level=info run --cidfile=%t/%n.ctr-id "
        "--cgroups=no-conmon --rm --sdnotify=conmon -d --replace --name vllm-%i "
        "docker.io/vllm/vllm-openai:v0.11.0 --model /models/%i --served-model-name %i\n"
    )
    text = render_dropin("vllm@smol.service", unit, NGRAM, run_id="r")
    raw = [t.raw for t in split_exec(text.splitlines()[-1].split("=", 1)[1])]
    assert raw[-2:] == ["--speculative-config", quote_arg(NGRAM.to_json())]
    assert "--cidfile=%t/%n.ctr-id" in raw and "vllm-%i" in raw  # the unit's own specifiers
    assert raw.index("docker.io/vllm/vllm-openai:v0.11.0") < raw.index("--speculative-config")


def test_an_entrypoint_naming_the_server_is_followed():
    argv = ["docker", "run", "--entrypoint", "vllm", "my/image:1", "serve", "/m", "--port", "8000"]
    found = parse(argv)
    assert argv[found.server_args :] == ["/m", "--port", "8000"]
    module = ["docker", "run", "--entrypoint=python3", "my/image", "-m"]
    module += ["vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert module[parse(module).server_args :] == ["--model", "/m"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["docker", "run", "my/vllm:1", *SERVER], r'vllm_images = \["my/vllm"\]'),
        (["docker", "run", "-d", "vllm/vllm-openai", *SERVER], "drop -d/--detach"),
        (["docker", "run", "--frobnicate", "x", "vllm/vllm-openai"], "--frobnicate=VALUE"),
        (["docker", "run", "-Z", "vllm/vllm-openai"], "-Z` is an option this tool does not know"),
        (["docker", "run", "$DOCKER_OPTS", "vllm/vllm-openai"], "cannot see"),
        (["docker", "run", "--entrypoint", "/bin/bash", "vllm/vllm-openai", "-c", "x"], "shell"),
        (["docker", "run", "ubuntu", "bash", "-c", "vllm serve m"], "runs a shell"),
        (["docker", "run", "--entrypoint", "/start.sh", "vllm/vllm-openai"], "--entrypoint"),
        (["docker", "build", "."], "is not `docker run"),
        (["docker", "run", "--rm"], "without an image"),
    ],
)
def test_containers_it_cannot_see_into_are_refused(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse(argv)


def test_an_image_named_in_the_config_counts_as_vllms():
    argv = ["podman", "run", "registry.example.com:5000/team/my-vllm:2024-05", *SERVER]
    with pytest.raises(ConfigError, match="cannot tell whether image"):
        parse(argv)
    assert parse(argv, images=["registry.example.com:5000/team/my-vllm"]).server_args == 3
    # A name with a tag admits only that tag.
    assert image_is_vllm("my-vllm:1", ["my-vllm:1"]) and not image_is_vllm(
        "my-vllm:2", ["my-vllm:1"]
    )
    assert image_is_vllm("docker.io/vllm/vllm-openai@sha256:" + "a" * 64, [])
    assert image_is_vllm("vllm/vllm-openai:${VLLM_TAG}", [])


def test_the_local_backend_refuses_containers():
    with pytest.raises(ConfigError, match="local backend runs the server as its own child"):
        with_speculative_config(["docker", "run", "vllm/vllm-openai", *SERVER], NGRAM, where="t")


@pytest.mark.parametrize("name", ["my vllm", "$(id)", "Registry/X", "a;b", ""])
def test_configured_image_names_are_validated(name):
    with pytest.raises(ConfigError, match="is not an image name"):
        check_image_names([name], where="[target]")


def test_a_containers_proxy_may_hold_the_port_only_for_a_container_unit():
    unit = "vllm.service"
    own = "812 python3 0::/system.slice/vllm.service"
    proxy = "900 docker-proxy 0::/system.slice/docker.service"
    other = "77 nginx 0::/system.slice/nginx.service"
    assert port_held_by_unit(own, unit, container=False)
    assert not port_held_by_unit(proxy, unit, container=False)
    assert port_held_by_unit(f"{own}\n{proxy}", unit, container=True)
    assert not port_held_by_unit(other, unit, container=True)


def test_vllm_images_in_the_config(tmp_path):
    from pytest_specdecode.config.settings import load_settings

    config = tmp_path / "exp.toml"
    text = """
[target]
api_base = "http://127.0.0.1:8011"
model = "m"
command = "vllm serve m --port 8011"
vllm_images = {images}
[workloads.coding]
prompt = "Write a binary search tree."
"""
    config.write_text(text.format(images='["registry.example.com/team/vllm"]'))
    assert load_settings(config).target.vllm_images == ("registry.example.com/team/vllm",)
    config.write_text(text.format(images='"registry.example.com/team/vllm"'))
    with pytest.raises(ConfigError, match="vllm_images must be a list of image names"):
        load_settings(config)
    config.write_text(text.format(images='["x; rm -rf /"]'))
    with pytest.raises(ConfigError, match="is not an image name"):
        load_settings(config)


def test_the_measurement_arguments_follow_the_speculative_config():
    spec = replace(NGRAM, extra_args=("--per-request-spec-decode-metrics", "detailed"))
    argv = ["/usr/bin/podman", "run", "--rm", "vllm/vllm-openai:v0.32.0", *SERVER]
    assert with_speculative_config(argv, spec, where="u", images=())[-4:] == [
        "--speculative-config",
        NGRAM.to_json(),
        "--per-request-spec-decode-metrics",
        "detailed",
    ]
