"""`specdec serve --engine vllm` without vLLM: the server's command line, the proposer's settings, and the errors."""

from __future__ import annotations

import json

import pytest

from specdec_cli.errors import SpecdecError
from specdec_cli.vllm.proposer_settings import SETTINGS_ENV
from specdec_cli.vllm.serve import SERVER_MODULE, ServeSettings, serve, serve_settings, server_command


def test_the_server_command_names_the_proposer_and_passes_its_settings():
    argv, env = server_command(serve_settings("sam+pld", draft_max=5, port=8123, min_match=2,
                                             extra_args=("--max-num-seqs", "16")), "/models/m", "m", cpu_build=True)
    assert argv[1:3] == ["-m", SERVER_MODULE] and argv[argv.index("--model") + 1] == "/models/m"
    speculative = json.loads(argv[argv.index("--speculative-config") + 1])
    assert speculative == {"method": "custom_class", "model": "specdec_cli.vllm.proposer.SamProposer",
                           "num_speculative_tokens": 5}
    assert json.loads(env[SETTINGS_ENV]) == {"drafter": "sam+pld", "min_match": 2}
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--gpu-memory-utilization") + 1] == "0.3"
    assert argv[-2:] == ["--max-num-seqs", "16"]
    plain, plain_env = server_command(serve_settings("none"), "/models/m", "m", cpu_build=False)
    assert "--speculative-config" not in plain and not plain_env and "--gpu-memory-utilization" not in plain


def test_serve_resolves_the_target_and_runs_the_server(monkeypatch):
    calls = []
    monkeypatch.setattr("specdec_cli.target_model.load.models.model_location",
                        lambda source, on_status=None: "/converted/dir")
    code = serve(serve_settings("pld"), run=lambda argv, env: calls.append((argv, env)) or 0)
    assert code == 0 and calls[0][0][calls[0][0].index("--model") + 1] == "/converted/dir"


@pytest.mark.parametrize("changes, message", [
    ({"drafter": "aded"}, "verifies chains"),
    ({"drafter": "pld", "index": "x.sam"}, "sam drafter"),
    ({"draft_max": 0}, "draft_max"),
    ({"port": 70000}, "port"),
    ({"dtype": "int4"}, "dtype"),
    ({"max_model_len": 8}, "max_model_len must be >= 16"),
    ({"memory_fraction": 1.5}, "memory fraction must be in"),
])
def test_bad_settings_are_one_error(changes, message):
    with pytest.raises(SpecdecError, match=message):  # (a dtype is refused as the settings are made)
        serve_settings(**changes).check()


def test_without_vllm_serve_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr("specdec_cli.vllm.serve.vllm_installed", lambda: False)
    with pytest.raises(SpecdecError, match="make install-vllm"):
        serve(ServeSettings())


def test_the_api_key_reaches_vllm_through_its_environment_only():
    from specdec_cli.vllm.serve import API_KEY_ENV

    argv, env = server_command(serve_settings("pld", api_key="s3cret"), "/models/m", "m", cpu_build=True)
    assert env[API_KEY_ENV] == "s3cret" and not any("s3cret" in arg for arg in argv)  # never in `ps`
    argv, env = server_command(serve_settings("none", api_key="s3cret"), "/models/m", "m", cpu_build=True)
    assert env == {API_KEY_ENV: "s3cret"}
    with pytest.raises(SpecdecError, match="api_key must not be empty"):
        serve_settings(api_key=" ").check()
    with pytest.raises(SpecdecError, match="specdec's --api-key"):
        serve_settings(extra_args=("--api-key", "k")).check()


@pytest.mark.parametrize("host, key, env_key, warned", [
    ("0.0.0.0", None, None, True),
    ("::", None, None, True),
    ("192.168.1.5", None, None, True),
    ("myhost.example", None, None, True),
    ("0.0.0.0", "k", None, False),
    ("0.0.0.0", None, "k", False),
    ("127.0.0.1", None, None, False),
    ("127.0.1.1", None, None, False),
    ("localhost", None, None, False),
    ("::1", None, None, False),
])
def test_listening_beyond_this_machine_without_a_key_warns_once(monkeypatch, host, key, env_key, warned):
    if env_key is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", env_key)
    monkeypatch.setattr("specdec_cli.target_model.load.models.model_location",
                        lambda source, on_status=None: "/converted/dir")
    said: list[str] = []
    serve(serve_settings("pld", host=host, api_key=key), run=lambda argv, env: 0, on_warning=said.append)
    assert len(said) == (1 if warned else 0)
    if warned:
        assert host in said[0] and "--api-key" in said[0] and "VLLM_API_KEY" in said[0]


def test_the_command_line_warns_in_one_line_and_passes_the_key(monkeypatch):
    """`specdec serve --host 0.0.0.0 [--api-key KEY]` end to end, with the server (vLLM) replaced."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app
    from specdec_cli.target_model.load.target_source import TargetSource

    runs: list[dict] = []
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setattr("specdec_cli.vllm.serve.vllm_installed", lambda: True)
    monkeypatch.setattr("specdec_cli.vllm.serve._cpu_build", lambda: True)
    monkeypatch.setattr("specdec_cli.target_model.load.target_source.resolve_target",
                        lambda target: TargetSource("dir", "/m", "m"))
    monkeypatch.setattr("specdec_cli.target_model.load.models.model_location", lambda source, on_status=None: "/m")
    monkeypatch.setattr("specdec_cli.vllm.serve._run_server", lambda argv, env: runs.append(env) or 0)
    runner = CliRunner()
    open_to_all = runner.invoke(app, ["serve", "--engine", "vllm", "--drafter", "pld", "--host", "0.0.0.0"])
    assert open_to_all.exit_code == 0, open_to_all.output
    warnings = [line for line in open_to_all.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "--api-key" in warnings[0] and "VLLM_API_KEY" in warnings[0]
    keyed = runner.invoke(app, ["serve", "--engine", "vllm", "--drafter", "pld", "--host", "0.0.0.0",
                                "--api-key", "s3cret"])
    assert keyed.exit_code == 0 and "warning:" not in keyed.stderr
    assert "VLLM_API_KEY" not in runs[0] and runs[1]["VLLM_API_KEY"] == "s3cret"
