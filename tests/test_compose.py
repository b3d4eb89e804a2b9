"""docker-compose.yml and the Dockerfile, checked without Docker (which cannot run on these machines).

The file is parsed as Compose parses it (YAML with merge keys, then `${VAR:-default}` interpolation), and the
commands it runs are parsed by the very argument parsers and settings that will receive them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.cli import _parser
from engine.server.cli import serve_options
from voiceagent.config import Settings

REPO = Path(__file__).resolve().parents[1]
TARGET_70B = "neuralmagic/Meta-Llama-3-70B-Instruct-FP8"
DRAFT_8B = "neuralmagic/Meta-Llama-3-8B-Instruct-FP8"
VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}` / `${VAR:-default}` substitution (an unset or empty VAR takes the default)."""
    if isinstance(value, str):
        return VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    return value


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return interpolate(raw, env or {})


def services(env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    return compose(env)["services"]


def flags(command: list[str]) -> dict[str, str]:
    """`--flag value` pairs of a command line."""
    pairs = {}
    for flag, value in zip(command, command[1:], strict=False):
        if flag.startswith("--"):
            pairs[flag] = value
    return pairs


def test_every_service_has_a_profile() -> None:
    by_profile: dict[str, set[str]] = {}
    for name, service in services().items():
        assert service.get("profiles"), f"{name} would start on a bare `docker compose up`"
        for profile in service["profiles"]:
            by_profile.setdefault(profile, set()).add(name)
    assert by_profile == {"cpu": {"voiceagent"}, "engine": {"engine"}, "gpu": {"vllm", "gateway"}}


def test_cpu_profile_is_one_container_with_everything_in_process() -> None:
    service = services()["voiceagent"]
    assert service["build"] == "." and service["ports"] == ["8000:8000"]
    assert service["environment"]["VOICEAGENT_LLM"] == "local"
    assert Settings(llm=service["environment"]["VOICEAGENT_LLM"]).llm_is_local
    assert service["command"][1:4] == ["-m", "voiceagent", "serve"]


def test_gpu_profile_runs_vllm_as_the_seed_launches_it() -> None:
    vllm = services()["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:v0.7.")  # the seed's flag spelling (see the file)
    assert vllm["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert flags(vllm["command"]) == {
        "--model": TARGET_70B,
        "--speculative-model": DRAFT_8B,
        "--num-speculative-tokens": "5",
        "--tensor-parallel-size": "4",
        "--gpu-memory-utilization": "0.92",
        "--host": "0.0.0.0",
        "--port": "8000",
    }
    assert vllm["ports"] == ["8000:8000"] and vllm["ipc"] == "host"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "http://127.0.0.1:8000/health" in " ".join(vllm["healthcheck"]["test"])


def test_tensor_parallel_size_and_ports_come_from_the_environment() -> None:
    env = {"TENSOR_PARALLEL_SIZE": "8", "GATEWAY_PORT": "9090", "ENGINE_PORT": "9001", "HF_TOKEN": "hf_x"}
    configured = services(env)
    assert flags(configured["vllm"]["command"])["--tensor-parallel-size"] == "8"
    assert configured["vllm"]["environment"]["HF_TOKEN"] == "hf_x"
    assert configured["gateway"]["ports"] == ["9090:8000"]
    assert configured["engine"]["ports"] == ["9001:8000"]


def test_gpu_gateway_is_pointed_at_vllm() -> None:
    everything = services()
    gateway, vllm = everything["gateway"], everything["vllm"]
    settings = Settings(
        llm=gateway["environment"]["VOICEAGENT_LLM"], llm_model=gateway["environment"]["VOICEAGENT_LLM_MODEL"]
    )
    assert (
        settings.llm == f"http://vllm:{flags(vllm['command'])['--port']}/v1"
    )  # the service name is its host
    assert settings.llm_model == flags(vllm["command"])["--model"]
    assert gateway["depends_on"] == {"vllm": {"condition": "service_healthy"}}
    assert gateway["ports"] == ["8080:8000"] and gateway["build"] == "."


def test_engine_profile_command_is_accepted_by_the_engine_cli() -> None:
    engine = services()["engine"]
    command = engine["command"]
    assert command[:3] == [".venv/bin/python", "-m", "engine"]
    args = _parser().parse_args(command[3:])
    options = serve_options(args)
    assert (options.target, options.draft, options.gamma) == (
        "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", 4,
    )  # fmt: skip
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    assert engine["ports"] == ["8001:8000"]
    assert engine["environment"]["VLLM_API_KEY"] == ""  # empty: no key (the CLI reads it as none)


def test_every_variable_is_documented_in_the_header() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    header = text[: text.index("x-voiceagent")]
    for name in {match.group(1) for match in VARIABLE.finditer(text)}:
        assert name in header, f"${{{name}}} is used but not described at the top of the file"


def test_dockerfile_builds_what_compose_runs() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for folder in ("engine", "voiceagent", "requirements", "scripts"):
        assert f"COPY {folder} {folder}" in dockerfile
    assert "RUN make venv debian models" in dockerfile and "EXPOSE 8000" in dockerfile
    command = json.loads(dockerfile.split("\nCMD ", 1)[1].splitlines()[0])
    assert command[:3] == [".venv/bin/python", "-m", "engine"]
    args = _parser().parse_args(command[3:])
    assert (args.host, args.port) == ("0.0.0.0", 8000)


@pytest.mark.parametrize("value", ["vllm:8000", "ftp://host/v1", "localhost"])
def test_settings_refuse_a_bad_llm_url(value: str) -> None:
    with pytest.raises(ValueError, match="VOICEAGENT_LLM must be 'local' or an http"):
        Settings(llm=value)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("VOICEAGENT_"):
            monkeypatch.delenv(name)
    assert Settings().llm_is_local and Settings().gamma == "auto" and Settings().backend == "native"
    monkeypatch.setenv("VOICEAGENT_GAMMA", "4")
    assert Settings().gamma == 4
    monkeypatch.setenv("VOICEAGENT_GAMMA", "auto")
    monkeypatch.setenv("VOICEAGENT_DRAFT", "none")
    monkeypatch.setenv("VOICEAGENT_LLM_API_KEY", "secret")
    settings = Settings()
    assert settings.gamma == "auto" and settings.draft_model is None
    assert "secret" not in repr(settings)  # keys stay out of logs
    monkeypatch.setenv("VOICEAGENT_GAMMA", "-1")
    with pytest.raises(ValueError, match="VOICEAGENT_GAMMA must be >= 0"):
        Settings()
