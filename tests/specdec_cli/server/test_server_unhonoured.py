"""The server's table of fields it does not carry out (server/unhonoured.py): each refused by name when set to
anything that would change the answer, on every endpoint that reads it; neutral values and fields that change
nothing are read as before. Pure functions: no model, no server."""

from __future__ import annotations

import pytest

from specdec_cli.server.api_errors import ApiError
from specdec_cli.server.llama_api import completion_request
from specdec_cli.server.requests import TOOL_FIELDS, chat_request, text_request
from specdec_cli.server.shaping_fields import PENALTY_FIELDS
from specdec_cli.server.unhonoured import UNHONOURED

ASKING = {"tools": [{"type": "function"}],
          "tool_choice": "required", "functions": [{"name": "f"}], "function_call": "auto", "frequency_penalty": 0.3,
          "presence_penalty": -0.2, "repetition_penalty": 1.1, "repeat_penalty": 1.2, "dry_multiplier": 0.8,
          "typical_p": 0.9, "tfs_z": 0.95, "mirostat": 2, "dynatemp_range": 0.5,
          "xtc_probability": 0.5, "top_n_sigma": 1.5, "echo": True, "suffix": "end",
          "best_of": 3, "audio": {"voice": "x"}, "modalities": ["text", "audio"], "web_search_options": {}}
NEUTRAL = {"response_format": {"type": "text"}, "tools": [],
           "tool_choice": "none", "frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
           "repeat_penalty": 1, "logit_bias": {}, "typical_p": 1.0, "tfs_z": 1, "mirostat": 0, "top_n_sigma": -1,
           "ignore_eos": False, "min_tokens": 0, "echo": False, "suffix": None, "best_of": 1, "modalities": ["text"],
           "user": "me",
           "store": True, "metadata": {"a": "b"}, "service_tier": "auto", "parallel_tool_calls": True,
           "prediction": {"type": "content", "content": "x"}, "n_keep": 4, "unknown_field": [1]}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_every_field_of_the_table_is_tried():
    assert set(ASKING) >= set(UNHONOURED)


@pytest.mark.parametrize("name", sorted(UNHONOURED))
def test_a_field_that_would_change_the_answer_is_refused_by_name_everywhere(name):
    """(everywhere it is not carried out: chat completions take tools, server/tools.py; text completions a suffix,
    test_server_fim.py; both OpenAI routes the presence and frequency penalties, test_logit_bias.py)"""
    for read, body in ((chat_request, CHAT), (text_request, {"prompt": "x"}), (completion_request, {"prompt": "x"})):
        if read is chat_request and name in TOOL_FIELDS or read is text_request and name == "suffix" or \
                read is not completion_request and name in PENALTY_FIELDS:
            continue
        with pytest.raises(ApiError) as refused:
            read({**body, name: ASKING[name]}, None)
        assert refused.value.status == 400 and refused.value.param == name
        assert f"'{name}'" in str(refused.value) and "\n" not in str(refused.value)


def test_neutral_values_and_fields_that_change_nothing_are_accepted():
    assert chat_request({**CHAT, **NEUTRAL}, None).kind == "chat"
    assert text_request({"prompt": "x", **NEUTRAL}, None).prompt == "x"
    assert completion_request({"prompt": "x", **NEUTRAL}, None).prompt == "x"


def test_min_p_is_read_on_every_endpoint():
    assert chat_request({**CHAT, "min_p": 0.1}, None).min_p == 0.1
    assert completion_request({"prompt": "x", "min_p": 0.2}, None).min_p == 0.2
    with pytest.raises(ApiError) as refused:
        text_request({"prompt": "x", "min_p": "high"}, None)
    assert refused.value.param == "min_p"


def test_log_probabilities_are_read_as_each_api_names_them():
    assert chat_request({**CHAT, "logprobs": True, "top_logprobs": 3}, None).logprobs == 3
    assert chat_request({**CHAT, "logprobs": True}, None).logprobs == 0
    assert chat_request({**CHAT, "logprobs": False}, None).logprobs is None
    assert text_request({"prompt": "x", "logprobs": 2}, None).logprobs == 2
    assert completion_request({"prompt": "x", "n_probs": 4}, None).logprobs == 4
    assert completion_request({"prompt": "x", "n_probs": 0}, None).logprobs is None
    for read, body, param in ((chat_request, {**CHAT, "top_logprobs": 2}, "top_logprobs"),
                              (chat_request, {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                              (chat_request, {**CHAT, "logprobs": 1}, "logprobs"),
                              (text_request, {"prompt": "x", "logprobs": True}, "logprobs"),
                              (completion_request, {"prompt": "x", "n_probs": -1}, "n_probs")):
        with pytest.raises(ApiError) as refused:
            read(body, None)
        assert refused.value.param == param
