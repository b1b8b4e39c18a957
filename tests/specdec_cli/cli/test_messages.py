"""Messages that must be true: what Ctrl-C during a model load kept, and errors naming only flags that exist."""

from __future__ import annotations

import pytest
from conftest import invoke


def test_ctrl_c_right_after_a_conversion_says_the_model_was_kept(tmp_path, monkeypatch):
    """The load converts a GGUF into $SPECDEC_HOME/models and is interrupted just after: the message used to say
    "nothing was written"."""
    from specdec_cli.cli import chat_cmd, common
    from specdec_cli.session import chat

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    converted = tmp_path / "models" / "model-q4_1-0123456789ab"

    def convert_then_interrupt(settings, on_status=None):
        converted.mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(chat, "open_session", convert_then_interrupt)
    monkeypatch.setattr(common, "_interrupted_during", [])
    with pytest.raises(KeyboardInterrupt):
        chat_cmd.load_session(chat.ChatSettings())
    message = common.interruption_message()
    assert "nothing was written" not in message and str(converted) in message and "kept" in message

    def interrupt(settings, on_status=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(chat, "open_session", interrupt)
    monkeypatch.setattr(common, "_interrupted_during", [])
    with pytest.raises(KeyboardInterrupt):
        chat_cmd.load_session(chat.ChatSettings())
    assert common.interruption_message() == "interrupted while loading the model; nothing was converted"


def test_memory_export_names_no_flag_that_does_not_exist(tmp_path):
    for where in (tmp_path, tmp_path / "absent" / "out.jsonl"):
        result = invoke("memory", "export", str(where), env_extra={"SPECDEC_HOME": str(tmp_path / "home")})
        assert result.returncode != 0
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("specdec: error:"), result.stderr
        assert "--path" not in lines[0] and str(where) in lines[0]
