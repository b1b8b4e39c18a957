"""Files and settings a careless or hostile user gives (issue 46): FIFOs and devices as outputs refused without being
opened, --force replacing regular files only, no unrelated file replaced without --force, long file names, symbolic
link loops, chat templates that fail or never end, a home that cannot be written, and the small messages."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import assert_one_line_error, char_level_tokenizer, invoke, make_char_tokenizer
from helpers import not_a_file

from specdec_cli.errors import SpecdecError

DEVICE = "/dev/null"  # a character device every Unix has (making one needs root)


@pytest.fixture
def hang_guard():
    """Fail, rather than hang, a test whose code under test opens a FIFO (the open would block forever)."""
    def alarm(number, frame):  # (pytest's Failed, no OSError: `except OSError` in the code under test cannot hide it)
        pytest.fail("blocked: a FIFO was opened")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _no_model(monkeypatch):
    for where in ("specdec_cli.target_model.load.models.load",
                  "specdec_cli.target_model.load.models.load_tokenizer"):
        monkeypatch.setattr(where, lambda *a, **k: pytest.fail("loaded before the output was checked"))


# -- outputs ------------------------------------------------------------------------------------------------------


def test_build_index_into_a_fifo_is_refused_without_reading_it(tmp_path, monkeypatch, hang_guard):
    _no_model(monkeypatch)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n")
    fifo = tmp_path / "index.sam"
    os.mkfifo(fifo)
    for force in ((), ("--force",)):
        result = invoke("build-index", str(corpus), "-o", str(fifo), *force,
                        env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
        assert_one_line_error(result, f"{fifo}: a FIFO, not a regular file; specdec writes only regular files", code=1)
    assert Path(fifo).is_fifo()


@pytest.mark.parametrize("args", [["build-index", "CORPUS", "-o", DEVICE, "--force"],
                                  ["memory", "export", DEVICE, "--force"],
                                  ["bench", "--json-out", DEVICE, "--force"]])
def test_force_never_replaces_a_device(tmp_path, monkeypatch, args, hang_guard):
    _no_model(monkeypatch)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n")
    args = [str(corpus) if arg == "CORPUS" else arg for arg in args]
    result = invoke(*args, env_extra={"SPECDEC_HOME": str(tmp_path / "home"), "SPECDEC_NO_MEMORY": "0"})
    assert_one_line_error(result, f"{DEVICE}: a device, not a regular file", code=1)
    assert Path(DEVICE).is_char_device()


def test_an_atomic_write_never_renames_over_a_fifo(tmp_path, hang_guard):
    from specdec_cli.files import write_atomic

    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with pytest.raises(SpecdecError, match="a FIFO, not a regular file"):
        write_atomic(fifo, "{}")
    assert fifo.is_fifo() and [entry.name for entry in tmp_path.iterdir()] == ["out.json"]  # no temporary left


def test_a_directory_output_never_replaces_a_fifo(tmp_path, hang_guard):
    from specdec_cli.files import atomic_directory

    fifo = tmp_path / "draft"
    os.mkfifo(fifo)
    with pytest.raises(SpecdecError, match="a FIFO, not a regular file"), atomic_directory(fifo) as folder:
        (folder / "config.json").write_text("{}")
    assert fifo.is_fifo()


def test_save_into_a_fifo_is_refused_and_the_repl_goes_on(tmp_path, hang_guard):
    from test_cli_errors import _repl, _Session

    fifo = tmp_path / "chat.json"
    os.mkfifo(fifo)
    said = _repl([f"/save {fifo}", f"/save --force {fifo}", "/exit"], _Session())
    assert said.count("a FIFO, not a regular file") == 2 and fifo.is_fifo()


def test_bench_plot_replaces_only_its_own_charts(tmp_path, monkeypatch):
    """An unrelated speedup.png in the --plot folder is refused before the model loads; --force replaces it."""
    pytest.importorskip("matplotlib")
    from specdec_cli.bench.plots import check_plot_dir, write_plots
    from specdec_cli.files import _checked_outputs

    charts = tmp_path / "charts"
    charts.mkdir()
    (charts / "speedup.png").write_bytes(b"my own picture")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    _no_model(monkeypatch)
    result = invoke("bench", "--plot", str(charts), "--limit", "1", env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
    assert_one_line_error(result, "speedup.png: the file exists and specdec did not write it; choose another name, "
                                  "or add --force to replace it", code=1)
    assert (charts / "speedup.png").read_bytes() == b"my own picture"
    document = {"results": [{"method": "none", "category": "c", "speedup": 1.0}], "environment": {}}
    check_plot_dir(charts, force=True)
    try:
        written = write_plots(document, charts)
        assert (charts / "speedup.png").read_bytes()[:4] == b"\x89PNG" and written
        check_plot_dir(charts)  # specdec's own charts, unchanged: replaced without --force next time
    finally:
        _checked_outputs.clear()
    fresh = tmp_path / "fresh"
    check_plot_dir(fresh)  # a folder made for the charts: they are recorded once written
    try:
        write_plots(document, fresh)
    finally:
        _checked_outputs.clear()
    check_plot_dir(fresh)


# -- inputs -------------------------------------------------------------------------------------------------------


def test_a_symbolic_link_loop_is_named(tmp_path):
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    os.symlink(second, first)
    os.symlink(first, second)
    result = invoke("chat", "--target", str(first), "--prompt", "hi", env_extra={"SPECDEC_HOME": str(tmp_path / "h")})
    assert_one_line_error(result, f"{first}: a loop of symbolic links", code=1)
    dangling = tmp_path / "gone.gguf"
    os.symlink(tmp_path / "nowhere.gguf", dangling)
    result = invoke("chat", "--target", str(dangling), "--prompt", "hi", env_extra={"SPECDEC_HOME": str(tmp_path)})
    assert_one_line_error(result, f"(a symbolic link to {tmp_path / 'nowhere.gguf'}): no such file", code=1)


def test_a_long_file_name_gets_a_cache_folder_name_that_fits(tmp_path, monkeypatch):
    from specdec_cli.home import NAME_BYTES, short_stem
    from specdec_cli.target_model.in_place.gguf_model import cache_folder

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    long = tmp_path / ("é" * 5 + "x" * 235 + ".gguf")  # 245 characters, 250 bytes
    assert short_stem("model") == "model"
    cut = short_stem(long.stem)
    assert len(cut.encode()) <= NAME_BYTES and cut != short_stem(long.stem[:-1] + "y")
    long.write_bytes(b"GGUF")
    folder = cache_folder(long)
    assert len(folder.name.encode()) + 40 < 255  # with a temporary's marks too
    folder.mkdir(parents=True)


def test_a_long_file_name_loads(tmp_path):
    from helpers import GGUF_FAMILIES, family_model, write_family_gguf

    architecture, settings = GGUF_FAMILIES["llama"]
    path = tmp_path / ("m" * 240 + ".gguf")
    write_family_gguf(path, family_model("llama", seed=5, **settings), architecture, "gpt2")
    result = invoke("chat", "--target", str(path), "--raw", "--prompt", "ab", "-n", "2", "--drafter", "none",
                    env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
    assert result.returncode == 0, result.stderr


# -- chat templates -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template, needle", [
    ("{% for m in messages %}{{ m.content.__class__.__mro__ }}{% endfor %}",
     "the chat template failed (SecurityError): access to attribute '__class__' of 'str' object is unsafe"),
    ("{% for m in messages %",
     "the chat template failed (TemplateSyntaxError at line 1): unexpected 'end of template'"),
    ("{{ raise_exception('Conversation roles must alternate user/assistant') }}",
     "the chat template failed (TemplateError): Conversation roles must alternate user/assistant"),
    ("{{ 1 // 0 }}", "the chat template failed (ZeroDivisionError)"),
    ("{% for i in range(100000) %}{% for j in range(1000) %}0123456789{% endfor %}{% endfor %}",
     "the chat template renders more than 1,048,576 characters for this prompt; stopped there"),
])
def test_a_template_that_fails_is_a_template_error_with_its_own_message(template, needle):
    from specdec_cli.texts.prompt_ids import format_prompt

    tokenizer = make_char_tokenizer()
    tokenizer.chat_template = template
    with pytest.raises(SpecdecError) as caught:
        format_prompt(tokenizer, [{"role": "user", "content": "hi"}])
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_a_template_renders_as_transformers_renders_it():
    from specdec_cli.texts.chat_template import render_template
    from specdec_cli.texts.prompt_ids import format_prompt

    template = ("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}<a>{% endif %}")
    tokenizer = char_level_tokenizer(["<pad>", "<s>", "<unk>", "</s>"], list("abcdefghij <>/|\n"), template,
                                     eos_token="</s>")
    messages = [{"role": "system", "content": "be"}, {"role": "user", "content": "hi <b>"}]
    want = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert render_template(tokenizer, messages) == want
    assert format_prompt(tokenizer, messages) == list(tokenizer(want, add_special_tokens=False)["input_ids"])


# -- a home that cannot be written ----------------------------------------------------------------------------------


def test_a_home_that_cannot_keep_the_cost_curve_still_answers(tmp_path, monkeypatch):
    """The curve is measured, used, and not saved: one warning line says so (a read-only or full home; here its
    `costs` is a file, which no process can write into, root included)."""
    from specdec_cli.decoding import curve_store

    home = tmp_path / "home"
    home.mkdir()
    (home / "costs").write_text("not a folder")
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    monkeypatch.setattr(curve_store, "measure_cost_curve", lambda timer: "the curve")
    with pytest.warns(UserWarning, match=r"the verify-cost curve was not saved \(.*costs: cannot write"):
        assert curve_store.load_or_measure(home / "costs" / "key.json", lambda: None) == "the curve"


# -- small ------------------------------------------------------------------------------------------------------------


def test_an_empty_drafters_list_names_the_flag_once(tmp_path):
    result = invoke("bench", "--drafters", ",", env_extra={"SPECDEC_HOME": str(tmp_path)})
    line = assert_one_line_error(result, "--drafters: give at least one name", code=1)
    assert "----" not in line


def test_stats_after_an_answer_cut_short_say_what_was_kept():
    from test_cli_errors import _repl, _Session

    session = _Session()
    session.cut_short = [588]
    said = _repl(["/stats"], session)
    assert "No finished answers yet; 1 answer cut short (Ctrl-C) kept 588 tokens" in said
    assert "No answers yet" not in said


def test_distill_train_refuses_another_target_s_data_before_loading_it(tmp_path, monkeypatch, tiny_model_dir):
    import json

    monkeypatch.setattr("specdec_cli.cli.distill_cmd.load_target",
                        lambda *a, **k: pytest.fail("the target loaded (a GGUF would be repacked) before the check"))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt_ids": [1, 2], "answer_ids": [3], "fingerprint": "sha256:0000000000000000",
                                 "target": "other-model"}) + "\n")
    result = invoke("distill", "train", "-o", str(tmp_path / "draft"), "--data", str(other), "--target",
                    str(tiny_model_dir), env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
    assert_one_line_error(result, "generated by target 'other-model'", code=1)



def test_a_read_only_home_with_a_healthy_cache_still_answers(tmp_path):
    """The cache made once, the home then made read-only (and its `costs` a file, so that this holds for root too):
    a drafter that plans with the verify-cost curve answers, with one warning line that the curve was not saved."""
    import stat

    from helpers import GGUF_FAMILIES, family_model, write_family_gguf

    architecture, settings = GGUF_FAMILIES["llama"]
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, family_model("llama", seed=5, **settings), architecture, "gpt2")
    home = tmp_path / "home"
    args = ("chat", "--target", str(path), "--raw", "--prompt", "abab abab", "-n", "4", "--drafter", "pld")
    assert invoke(*args, "--drafter", "none", env_extra={"SPECDEC_HOME": str(home)}).returncode == 0
    shutil.rmtree(home / "costs", ignore_errors=True)
    (home / "costs").write_text("")
    folders = [home, *(entry for entry in home.rglob("*") if entry.is_dir())]
    for folder in folders:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        result = invoke(*args, env_extra={"SPECDEC_HOME": str(home)})
    finally:
        for folder in folders:
            folder.chmod(stat.S_IRWXU)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if line.startswith("specdec: warning:")]
    assert len(warned) == 1 and "the verify-cost curve was not saved" in warned[0], result.stderr
    assert "error" not in result.stderr


# -- JSON files specdec keeps: never a FIFO read, a device read without end, or a huge file ---------------------------


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_json_file_that_is_not_a_regular_file_is_refused_unread(tmp_path, kind, hang_guard):
    from specdec_cli.files import read_json, read_json_bounded

    path = tmp_path / "record.json"
    not_a_file(path, kind)
    with pytest.raises(ValueError, match=f"{'a FIFO' if kind == 'fifo' else 'a device'}, not a regular file"):
        read_json_bounded(path)
    assert read_json(path) == {}


def test_a_json_file_too_large_or_too_deep_is_refused_and_a_missing_one_is_missing(tmp_path):
    from specdec_cli.files import read_json, read_json_bounded

    path = tmp_path / "record.json"
    path.write_text('{"a": [1, 2, 3]}')
    assert read_json_bounded(path) == {"a": [1, 2, 3]}
    with pytest.raises(ValueError, match="16 bytes, over the 8 a JSON file"):
        read_json_bounded(path, limit_bytes=8)
    path.write_text("[" * 200_000 + "]" * 200_000)  # (json's parser recurses: RecursionError, not a ValueError)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_json_bounded(path)
    assert read_json(path) == {}
    with pytest.raises(FileNotFoundError):
        read_json_bounded(tmp_path / "missing.json")


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("reader", ["dtype verdict", "stored config", "tokenizer config", "conversion marker",
                                    "answer memory"])
def test_every_json_file_of_the_home_and_caches_that_is_not_a_file_is_a_damaged_one(tmp_path, monkeypatch, kind,
                                                                                       reader, hang_guard):
    """Each reader treats it as it treats a corrupt file (missing, made again, skipped): no hang, no MemoryError."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    if reader == "dtype verdict":
        from specdec_cli.target_model.load import dtype_choice

        path = dtype_choice._path("key")
        path.parent.mkdir(parents=True)
        not_a_file(path, kind)
        assert dtype_choice._read("key", ("float32",)) is None
    elif reader == "stored config":
        from specdec_cli.target_model.in_place import stored

        not_a_file(tmp_path / stored.STORED_FILE, kind)
        assert stored.read_document(tmp_path) is None
    elif reader == "tokenizer config":
        from specdec_cli.target_model.in_place.native_tokenizer import load_native_tokenizer

        not_a_file(tmp_path / "tokenizer_config.json", kind)
        assert load_native_tokenizer(tmp_path) is None
    elif reader == "conversion marker":
        from specdec_cli.target_model.load.converted import CONVERTED_MARKER, converted_damage

        not_a_file(tmp_path / CONVERTED_MARKER, kind)
        assert converted_damage(tmp_path) is not None
    else:
        from specdec_cli.texts.memory import Memory

        memory = Memory(tmp_path / "memory", "sha256:0123")
        memory.append([1, 2, 3])
        not_a_file(memory.directory / "1-1-3.json", kind)
        recalled = memory.recall()
        assert recalled.answers == [[1, 2, 3]]
        assert recalled.skipped == [f"1-1-3.json: {'a FIFO' if kind == 'fifo' else 'a device'}, not a regular file"]
