"""A chat session between turns (session/chat.py): warmed up before its first line, and each next turn's opening
computed while the user writes (`warm_up`, `compute_ahead`, what the REPL calls). The default model on its block
weights, where a prompt's entries are the same bits in any pieces: every answer is the one a session that
computes nothing ahead gives, and each turn computes only the user's words and the assistant's header."""

from __future__ import annotations

from dataclasses import replace


def _session(loaded):
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.session.chat import ChatSession, ChatSettings
    from specdec_cli.session.run_settings import DrafterSettings, RunSettings

    settings = ChatSettings(RunSettings(drafter=DrafterSettings("sam"), generation=GenerationConfig()),
                            remember=False)
    session = ChatSession(loaded.model, loaded.tokenizer, settings)
    session.set_generation(replace(session.generation, max_new_tokens=12))
    return session


def test_a_chat_computes_ahead_between_turns_and_answers_the_same(real_target):
    from specdec_cli.texts.prompt_ids import next_turn_ids, with_system

    loaded = real_target("float32", "auto")
    ahead, cold = _session(loaded), _session(loaded)
    assert ahead.warm_up() > 10 and ahead.prompt_cache.held
    for text in ["Name three colours.", "Go on.", "And two more?"]:
        opening = next_turn_ids(ahead.tokenizer, with_system(list(ahead.history), ahead.system))
        turn = ahead.ask(text)
        assert turn.answer == cold.ask(text).answer
        assert turn.generation.cached_tokens == len(opening)  # only the words and the assistant's header computed
        assert turn.prompt_tokens - len(opening) < 12
        assert ahead.compute_ahead(ahead.history, turn.prompt_tokens) > 0
        cold.prompt_cache.clear()  # (the cold session computes every prompt whole)


def test_nothing_is_computed_ahead_for_a_drafter_that_reads_the_prompts_features(real_target):
    """A head reads every prompt's features, so the engine computes its prompts whole: entries computed ahead
    would never be read."""
    from specdec_cli.decoding.draft import Draft, Needs

    class ReadsFeatures:
        name, needs = "reads", Needs(features=True)

        def propose(self, context, budget):
            return Draft.empty("reads")

        def observe(self, event):
            pass

        def reset(self):
            pass

    session = _session(real_target("float32", "auto"))
    session.drafter = ReadsFeatures()
    assert session.warm_up() == 0 and not session.prompt_cache.held
    turn = session.ask("Name three colours.")
    assert session.compute_ahead(session.history, turn.prompt_tokens) == 0
