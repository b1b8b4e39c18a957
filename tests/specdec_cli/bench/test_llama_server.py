"""`specdec bench --reference llama-server` (llama.cpp's own server binary) and `--reference http://HOST:PORT`.

Without the binary: a fake server (tests/specdec_cli/bench/fake_llama_server.py) in llama.cpp's response shapes, on
a thread of this process (the URL path) or started as a program through --llama-server (the binary path). With
`llama-server` on PATH, one test runs the real binary on the default model.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import TINY_EOS, assert_one_line_error, hf_greedy, invoke, run_cli
from fake_llama_server import PROMPT_MS, TOKEN_MS, FakeServer
from helpers import char_tokenizer

from specdec_cli.bench import OVERALL, bench_settings, resolve_methods, run_bench
from specdec_cli.bench import llama_server as ls
from specdec_cli.bench import llama_server_names as names
from specdec_cli.errors import SpecdecError

FAKE = Path(__file__).with_name("fake_llama_server.py")
PROMPTS = [{"prompt": "count: 1 2 3 1 2 3 1 2", "category": "copy"},
           {"turns": ["spell abc abc abc", "and again"], "category": "chat"}]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test of this module on one torch thread (conftest.py's one_torch_thread)."""


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="module")
def conversations():
    from specdec_cli.texts.prompts import parse_prompt_lines

    return parse_prompt_lines([json.dumps(row) for row in PROMPTS], "rows")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS), encoding="utf-8")
    return path


@pytest.fixture
def fake_binary(tmp_path):
    """An executable that runs the fake server with this Python, as --llama-server takes it."""
    path = tmp_path / "llama-server"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def _greedy_answer(model, tokenizer):
    """The fake answers what the tiny model's plain greedy decoding writes (as llama.cpp would)."""
    def answer(prompt, n_predict):
        tokens = hf_greedy(model, prompt, n_predict)
        return tokens, tokenizer.decode(tokens, skip_special_tokens=True)
    return answer


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


# ------------------------------------------------------------------------------------------------ names


def test_method_names():
    methods = resolve_methods(["none"], ["llama-server", "llama-server:ngram-mod", "http://127.0.0.1:8080/"])
    assert [(m.name, m.kind, m.url) for m in methods[1:]] == [
        ("llama-server", "llama-server", ""), ("llama-server:ngram-mod", "llama-server", ""),
        ("llama-server@127.0.0.1:8080", "llama-server", "http://127.0.0.1:8080")]
    assert [m.name for m in resolve_methods([], ["llama-server:ngram-simple", "llama-server:ngram-map-k"])][1:] == [
        "llama-server:ngram-simple", "llama-server:ngram-map-k"]
    with pytest.raises(SpecdecError, match="unknown llama-server mode 'llama-server:warp'.*ngram-mod"):
        resolve_methods([], ["llama-server:warp"])
    for bad in ("http://127.0.0.1:8080/v1", "http://:80", "http://host:port"):
        with pytest.raises(SpecdecError, match="http://HOST:PORT"):
            resolve_methods([], [bad])
    assert names.parse_url("http://localhost") == ("http://localhost:80", "llama-server@localhost:80")


def test_binary_lookup(tmp_path, monkeypatch, fake_binary):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path, reason = names.find_binary(None)
    assert path is None and "make install-llama-server" in reason and "--llama-server PATH" in reason
    assert names.find_binary(str(fake_binary)) == (str(fake_binary), None)
    with pytest.raises(SpecdecError, match="no such file"):
        names.find_binary(str(tmp_path / "absent"))
    plain = tmp_path / "not-executable"
    plain.write_text("")
    with pytest.raises(SpecdecError, match="not executable"):
        names.find_binary(str(plain))
    rows = ls.plan(resolve_methods([], ["llama-server"]), None, "model.gguf")
    assert not rows.servers and "make install-llama-server" in rows.skipped["llama-server"]
    rows = ls.plan(resolve_methods([], ["llama-server:ngram-mod"]), str(fake_binary), None)
    assert "not a .gguf file" in rows.skipped["llama-server:ngram-mod"]


def test_context_length_of_a_gguf_is_the_servers_bound(tmp_path):
    assert ls.context_tokens(str(tmp_path / "absent.gguf")) == ls.CONTEXT_TOKENS
    from gguf import GGUFWriter

    path = tmp_path / "short.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert ls.context_tokens(str(path)) == 2048  # a model's own context, where shorter than the bound


# ------------------------------------------------------------------------------------------------ library runs


def test_server_at_a_url_is_timed_by_its_own_timings(tiny_llama, tokenizer, conversations):
    with FakeServer(_greedy_answer(tiny_llama, tokenizer)) as fake:
        settings = bench_settings(resolve_methods(["none"], [fake.url]), max_new_tokens=10, warmup=False)
        report = run_bench(tiny_llama, tokenizer, conversations, settings)
    name = "llama-server@" + fake.url.removeprefix("http://")
    document = json.loads(json.dumps(report.as_json()))
    assert document["settings"]["methods"] == ["none", name]
    assert document["settings"]["llama_server_plain"] == name
    info = document["settings"]["llama_servers"][name]
    assert info["started_here"] is False and info["speculative_types"] == "none"
    assert info["tokens_from"] == "server token ids" and info["prompt_tokens_reused"] == 0
    # the very prompt ids specdec decoded, greedy, cache off, token ids asked for
    none_prompts = [run.prompt_tokens for run in report.runs if run.method == "none"]
    assert [len(body["prompt"]) for body in fake.requests] == none_prompts
    assert all(body["temperature"] == 0.0 and body["top_k"] == 1 and body["n_predict"] == 10 and
               body["cache_prompt"] is False and body["return_tokens"] is True for body in fake.requests)
    runs = [run for run in report.runs if run.method == name]
    for run in runs:  # llama.cpp's timings, not the wall time around the request
        assert run.seconds == pytest.approx((PROMPT_MS * run.prompt_tokens + TOKEN_MS * len(run.tokens)) / 1000)
        assert run.ttft_seconds == pytest.approx(PROMPT_MS * run.prompt_tokens / 1000)
    overall = {row["method"]: row for row in document["results"] if row["category"] == OVERALL}
    assert overall[name]["identical"] == overall[name]["compared"] == 3  # the fake answers the greedy tokens
    assert overall[name]["decode_tokens_per_second"] == pytest.approx(1000 / TOKEN_MS)
    assert overall[name]["speedup_vs_llama_server"] == 1.0
    assert overall["none"]["speedup_vs_llama_server"] == pytest.approx(
        overall["none"]["tokens_per_second"] / overall[name]["tokens_per_second"], rel=1e-4)
    assert overall["none"]["decode_tokens_per_second"] > 0
    assert overall[name]["acceptance_rate"] is None


def test_server_without_token_ids_is_compared_by_text(tiny_llama, tokenizer, conversations):
    with FakeServer(_greedy_answer(tiny_llama, tokenizer), return_tokens=False) as fake:
        settings = bench_settings(resolve_methods(["none"], [fake.url]), max_new_tokens=10, warmup=False)
        report = run_bench(tiny_llama, tokenizer, conversations[:1], settings)
    name = report.settings["methods"][1]
    assert report.settings["llama_servers"][name]["tokens_from"] == "text"
    row = next(row for row in report.results if row.method == name and row.category == OVERALL)
    none_tokens = next(run.tokens for run in report.runs if run.method == "none")
    assert (row.identical == 1) == (TINY_EOS not in none_tokens[:-1])  # the text round-trips on this tokenizer


def test_spawned_server_rows_and_their_stop(tiny_llama, tokenizer, conversations, fake_binary, tmp_path,
                                            monkeypatch):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("FAKE_LLAMA_PIDFILE", str(pidfile))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the servers' logs go
    tempfile.tempdir = None
    settings = bench_settings(resolve_methods(["none"], ["llama-server", "llama-server:ngram-mod"]),
                              max_new_tokens=6, warmup=True, llama_server=str(fake_binary))
    report = run_bench(tiny_llama, tokenizer, conversations, settings, gguf_path=str(tmp_path / "model.gguf"))
    servers = report.settings["llama_servers"]
    assert set(servers) == {"llama-server", "llama-server:ngram-mod"}
    assert servers["llama-server"]["started_here"] and servers["llama-server"]["threads"] == 1
    assert servers["llama-server:ngram-mod"]["speculative_types"] == "ngram-mod"
    assert report.settings["llama_server_plain"] == "llama-server"
    rows = {row.method: row for row in report.results if row.category == OVERALL}
    assert rows["llama-server"].acceptance_rate is None
    assert rows["llama-server:ngram-mod"].acceptance_rate == pytest.approx(0.5)  # the fake accepts half its drafts
    assert rows["llama-server:ngram-mod"].drafted_tokens == rows["llama-server:ngram-mod"].new_tokens
    assert rows["llama-server"].speedup_vs_llama_server == 1.0
    assert _wait_gone(int(pidfile.read_text()))  # stopped after the run
    assert not list(tmp_path.glob("specdec-llama-server-*"))  # their logs are removed after a clean run
    tempfile.tempdir = None


def test_server_that_fails_to_start_shows_its_log(tiny_llama, tokenizer, conversations, fake_binary, tmp_path,
                                                  monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_FAIL_START", "1")
    settings = bench_settings(resolve_methods(["none"], ["llama-server"]), max_new_tokens=4,
                              llama_server=str(fake_binary))
    with pytest.raises(ls.LlamaServerError) as caught:
        run_bench(tiny_llama, tokenizer, conversations, settings, gguf_path=str(tmp_path / "model.gguf"))
    error = caught.value
    assert "exited during start-up (exit status 3)" in str(error) and "\n" not in str(error)
    assert error.log_tail[-1] == "fake-llama-server: error: failed to load model"
    assert error.log_path and os.path.exists(error.log_path)  # kept for the user
    os.unlink(error.log_path)


def test_server_that_dies_mid_run_is_reported_and_stopped(tiny_llama, tokenizer, conversations, fake_binary,
                                                          tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("FAKE_LLAMA_PIDFILE", str(pidfile))
    monkeypatch.setenv("FAKE_LLAMA_EXIT_AFTER", "1")
    settings = bench_settings(resolve_methods(["none"], ["llama-server"]), max_new_tokens=4, warmup=False,
                              llama_server=str(fake_binary))
    with pytest.raises(ls.LlamaServerError) as caught:
        run_bench(tiny_llama, tokenizer, conversations, settings, gguf_path=str(tmp_path / "model.gguf"))
    assert "llama-server:" in str(caught.value) and "giving up, as told" in "\n".join(caught.value.log_tail)
    assert _wait_gone(int(pidfile.read_text()))
    os.unlink(caught.value.log_path)


def test_ctrl_c_stops_the_server(tiny_llama, tokenizer, conversations, fake_binary, tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("FAKE_LLAMA_PIDFILE", str(pidfile))
    settings = bench_settings(resolve_methods(["none"], ["llama-server"]), max_new_tokens=4, warmup=False,
                              llama_server=str(fake_binary))

    def interrupt(event):
        if event.method == "llama-server":
            assert _alive(int(pidfile.read_text()))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_bench(tiny_llama, tokenizer, conversations, settings, gguf_path=str(tmp_path / "model.gguf"),
                  on_progress=interrupt)
    assert _wait_gone(int(pidfile.read_text()))


def test_without_the_binary_the_rows_are_skipped_with_one_line(tiny_llama, tokenizer, conversations, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    settings = bench_settings(resolve_methods(["none"], ["llama-server", "llama-server:ngram-mod"]),
                              max_new_tokens=4, warmup=False)
    report = run_bench(tiny_llama, tokenizer, conversations[:1], settings, gguf_path="model.gguf")
    assert set(report.settings["references_skipped"]) == {"llama-server", "llama-server:ngram-mod"}
    assert "make install-llama-server" in report.settings["references_skipped"]["llama-server"]
    assert {row.method for row in report.results} == {"none"}


# ------------------------------------------------------------------------------------------------ the command


def test_cli_against_a_running_server(tiny_llama_dir, prompt_file, tiny_llama, tokenizer):
    with FakeServer(_greedy_answer(tiny_llama, tokenizer), spec_type="ngram-mod") as fake:
        result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompt_file), "--drafters", "none",
                        "--reference", f"{fake.url},llama.cpp", "--max-new-tokens", "8", "--no-warmup",
                        env_extra={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    name = "llama-server@" + fake.url.removeprefix("http://")
    assert name in result.stdout
    assert f"{name}: llama.cpp's server at {fake.url} (already running; speculative: ngram-mod)" in result.stdout
    assert "tokens/s without the prompt" in result.stdout and f"{name} {1000 / TOKEN_MS:.1f}" in result.stdout
    assert "llama.cpp: skipped: the target is not a .gguf file" in result.stdout
    assert f"{name}: 3/3 outputs equal none's" in result.stdout


def test_cli_bad_values_are_one_line_before_the_model_loads(tmp_path):
    port = ls.free_port()
    assert_one_line_error(invoke("bench", "--reference", "llama-server:warp"),
                          "unknown llama-server mode 'llama-server:warp'", code=1)
    assert_one_line_error(invoke("bench", "--reference", "llama-server", "--llama-server", str(tmp_path / "nope")),
                          f"--llama-server: no such file: {tmp_path / 'nope'}", code=1)
    assert_one_line_error(invoke("bench", "--reference", f"http://127.0.0.1:{port}"),
                          f"--reference http://127.0.0.1:{port}: no llama.cpp server answers there", code=1)
    assert_one_line_error(invoke("bench", "--reference", "http://127.0.0.1:8080/v1"),
                          "a llama.cpp server's address is http://HOST:PORT", code=1)


def test_cli_skips_a_started_server_for_a_target_that_is_not_a_gguf(tiny_llama_dir, prompt_file, fake_binary):
    result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompt_file), "--drafters", "none",
                    "--reference", "llama-server", "--llama-server", str(fake_binary), "--max-new-tokens", "4",
                    "--limit", "1", "--no-warmup", env_extra={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "llama-server: skipped: the target is not a .gguf file" in result.stdout


def test_cli_shows_the_end_of_a_failed_servers_log(capsys, monkeypatch):
    from specdec_cli.cli.bench_cmd import server_log_on_failure

    monkeypatch.setenv("NO_COLOR", "1")
    with pytest.raises(ls.LlamaServerError):
        with server_log_on_failure():
            raise ls.LlamaServerError("llama-server: exited", ["loading [model]", "error: no"], "/tmp/x.log")
    err = capsys.readouterr().err
    assert "the last lines of /tmp/x.log:" in err and "  loading [model]\n  error: no" in err


# ------------------------------------------------------------------------------------------------ the real binary


@pytest.mark.real_model
@pytest.mark.skipif(shutil.which("llama-server") is None,
                    reason="llama-server is not on PATH (`make install-llama-server` builds it into .venv/bin)")
def test_real_llama_server_on_the_default_model():
    result = run_cli("bench", "--suite", "builtin", "--categories", "qa", "--limit", "1", "-n", "16",
                     "--drafters", "none", "--reference", "llama-server,llama-server:ngram-mod", "--threads", "2",
                     "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    servers = document["settings"]["llama_servers"]
    assert set(servers) == {"llama-server", "llama-server:ngram-mod"}
    assert all(info["tokens_from"] == "server token ids" and info["prompt_tokens_reused"] == 0 and
               info["threads"] == 2 for info in servers.values())
    assert servers["llama-server:ngram-mod"]["speculative_types"] == "ngram-mod"
    overall = {row["method"]: row for row in document["results"] if row["category"] == OVERALL}
    for name in servers:
        row = overall[name]
        assert row["tokens_per_second"] > 0 and row["decode_tokens_per_second"] > row["tokens_per_second"]
        assert row["compared"] == 1 and row["identical"] in (0, 1)  # as measured: llama.cpp rounds its own way
    for prompt in document["per_prompt"]:
        if prompt["method"].startswith("llama-server"):
            assert 0 < prompt["new_tokens"] <= 16
