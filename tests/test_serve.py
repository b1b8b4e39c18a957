"""`specdec serve` without vLLM: the server's command line, the proposer's settings, and the errors."""

from __future__ import annotations

import json

import pytest

from specdec_cli.errors import SpecdecError
from specdec_cli.serve import SERVER_MODULE, ServeSettings, serve, server_command
from specdec_cli.vllm_proposer import SETTINGS_ENV


def test_the_server_command_names_the_proposer_and_passes_its_settings():
    argv, env = server_command(ServeSettings(drafter="sam+pld", draft_max=5, port=8123, min_match=2,
                                             extra_args=("--max-num-seqs", "16")), "/models/m", "m", cpu_build=True)
    assert argv[1:3] == ["-m", SERVER_MODULE] and argv[argv.index("--model") + 1] == "/models/m"
    speculative = json.loads(argv[argv.index("--speculative-config") + 1])
    assert speculative == {"method": "custom_class", "model": "specdec_cli.vllm_proposer.SamProposer",
                           "num_speculative_tokens": 5}
    assert json.loads(env[SETTINGS_ENV]) == {"drafter": "sam+pld", "min_match": 2}
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--gpu-memory-utilization") + 1] == "0.3"
    assert argv[-2:] == ["--max-num-seqs", "16"]
    plain, plain_env = server_command(ServeSettings(drafter="none"), "/models/m", "m", cpu_build=False)
    assert "--speculative-config" not in plain and not plain_env and "--gpu-memory-utilization" not in plain


def test_serve_resolves_the_target_and_runs_the_server(monkeypatch):
    calls = []
    monkeypatch.setattr("specdec_cli.models.model_location", lambda source, on_status=None: "/converted/dir")
    code = serve(ServeSettings(drafter="pld"), run=lambda argv, env: calls.append((argv, env)) or 0)
    assert code == 0 and calls[0][0][calls[0][0].index("--model") + 1] == "/converted/dir"


@pytest.mark.parametrize("settings, message", [
    (ServeSettings(drafter="aded"), "verifies chains"),
    (ServeSettings(drafter="pld", index="x.sam"), "sam drafter"),
    (ServeSettings(draft_max=0), "draft_max"),
    (ServeSettings(port=70000), "port"),
    (ServeSettings(dtype="int4"), "dtype"),
])
def test_bad_settings_are_one_error(settings, message):
    with pytest.raises(SpecdecError, match=message):
        settings.check()


def test_without_vllm_serve_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr("specdec_cli.serve.vllm_installed", lambda: False)
    with pytest.raises(SpecdecError, match="make install-vllm"):
        serve(ServeSettings())
