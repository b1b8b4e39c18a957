"""What a conversation's next turn begins with (texts/prompt_ids.py `next_turn_ids`): the template's end of the
answer and start of a user turn, a beginning of every next prompt whatever the user writes."""

from __future__ import annotations

from conftest import make_char_tokenizer

from specdec_cli.texts.prompt_ids import format_prompt, next_turn_ids


def test_a_next_turn_begins_with_the_answer_closed_and_a_user_turn_opened():
    tokenizer = make_char_tokenizer()
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello there"}]
    opening = next_turn_ids(tokenizer, conversation)
    assert tokenizer.decode(opening).endswith("Hello there<|im_end|>\n<|im_start|>user\n")
    for words in ("Go on.", "Hello", "1", "\nA line first"):
        prompt = format_prompt(tokenizer, [*conversation, {"role": "user", "content": words}])
        assert prompt[: len(opening)] == opening and len(prompt) > len(opening)
