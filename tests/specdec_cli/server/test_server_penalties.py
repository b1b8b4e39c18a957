"""The penalties as each API names and counts them (server/requests.py `_penalties`, llama_api.py): OpenAI's
presence and frequency penalties and vLLM's `repetition_penalty` on the /v1 routes; llama-server's `repeat_penalty`
over a window of `repeat_last_n` tokens (64 when left out), which then counts presence and frequency too, on
`/completion` and `/infill` always and on the /v1 routes when sent. Pure functions: no model, no server."""

from __future__ import annotations

import pytest

from specdec_cli.decoding.generation_config import GenerationConfig
from specdec_cli.server.api_errors import ApiError
from specdec_cli.server.llama_api import completion_request, infill_request
from specdec_cli.server.requests import chat_request, text_request

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _settings(request) -> tuple:
    config = request.generation(GenerationConfig())
    return (config.presence_penalty, config.frequency_penalty, config.repetition_penalty, config.penalty_last_n)


def test_the_v1_routes_count_as_openai_and_vllm_do():
    for read, body in ((chat_request, CHAT), (text_request, {"prompt": "x"})):
        asked = {**body, "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.3}
        assert _settings(read(asked, None)) == (0.5, -0.25, 1.3, None)
        assert _settings(read(body, None)) == (0.0, 0.0, 1.0, None)


def test_llama_servers_names_bring_its_window():
    assert _settings(chat_request({**CHAT, "repeat_penalty": 1.2}, None)) == (0.0, 0.0, 1.2, 64)
    assert _settings(chat_request({**CHAT, "repeat_last_n": -1, "presence_penalty": 1}, None)) == (1.0, 0.0, 1.0, -1)
    assert _settings(text_request({"prompt": "x", "repeat_penalty": 1.1, "repeat_last_n": 0}, None))[2:] == (1.1, 0)
    assert _settings(completion_request({"prompt": "x"}, None)) == (0.0, 0.0, 1.0, 64)
    asked = {"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": 0.5, "repeat_penalty": 1.5,
             "repeat_last_n": 16}
    assert _settings(completion_request(asked, None)) == (0.5, 0.5, 1.5, 16)
    infill = {"input_prefix": "def f(", "input_suffix": ")", "repeat_penalty": 1.2, "repeat_last_n": -1}
    assert _settings(infill_request(infill, None))[2:] == (1.2, -1)


@pytest.mark.parametrize("read, body, param", [
    (chat_request, {**CHAT, "repetition_penalty": 1.2, "repeat_penalty": 1.2}, "repetition_penalty"),
    (chat_request, {**CHAT, "repetition_penalty": 0}, "repetition_penalty"),
    (text_request, {"prompt": "x", "repeat_penalty": -1}, "repeat_penalty"),
    (text_request, {"prompt": "x", "repetition_penalty": "high"}, "repetition_penalty"),
    (chat_request, {**CHAT, "repeat_last_n": -2}, "repeat_last_n"),
    (chat_request, {**CHAT, "repeat_last_n": 1.5}, "repeat_last_n"),
    (completion_request, {"prompt": "x", "repeat_last_n": -5}, "repeat_last_n"),
    (completion_request, {"prompt": "x", "repetition_penalty": 1.1}, "repetition_penalty"),
    (completion_request, {"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
])
def test_a_bad_penalty_is_a_400_naming_it(read, body, param):
    with pytest.raises(ApiError) as refused:
        request = read(body, None)
        request.generation(GenerationConfig())  # (ranges the engine's settings check: a 400 there too)
    assert refused.value.status == 400 and refused.value.param == param
    assert "\n" not in str(refused.value)


def test_dry_is_read_on_every_route_as_llama_server_names_it():
    from specdec_cli.decoding.dry import DEFAULT_BREAKERS, DryPenalty

    fields = {"dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3, "dry_penalty_last_n": 256,
              "dry_sequence_breakers": ["\n", "###"]}
    for read, body in ((chat_request, CHAT), (text_request, {"prompt": "x"}), (completion_request, {"prompt": "x"})):
        assert read({**body, **fields}, None).generation(GenerationConfig()).dry == \
            DryPenalty(0.8, 2.0, 3, 256, ("\n", "###"))
        assert read({**body, "dry_multiplier": 0.5}, None).dry == DryPenalty(0.5, 1.75, 2, -1, DEFAULT_BREAKERS)
        assert read({**body, "dry_multiplier": 0, "dry_base": 9}, None).dry is None  # (off: nothing else read)


@pytest.mark.parametrize("fields, param", [({"dry_multiplier": -1}, "dry_multiplier"),
                                           ({"dry_multiplier": "x"}, "dry_multiplier"),
                                           ({"dry_multiplier": 1, "dry_base": 0.5}, "dry_base"),
                                           ({"dry_multiplier": 1, "dry_allowed_length": -1}, "dry_allowed_length"),
                                           ({"dry_multiplier": 1, "dry_penalty_last_n": -2}, "dry_penalty_last_n"),
                                           ({"dry_multiplier": 1, "dry_sequence_breakers": "\n"},
                                            "dry_sequence_breakers"),
                                           ({"dry_multiplier": 1, "dry_sequence_breakers": []},
                                            "dry_sequence_breakers")])
def test_a_bad_dry_field_is_a_400_naming_it(fields, param):
    with pytest.raises(ApiError) as refused:
        completion_request({"prompt": "x", **fields}, None).generation(GenerationConfig())
    assert refused.value.status == 400 and refused.value.param == param
