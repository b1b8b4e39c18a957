"""Constrained decoding (decoding/grammar.py through the engine): every answer keeps its grammar (it parses and
validates against its JSON schema), and under a grammar every drafter's greedy answer is constrained plain
decoding's, token for token: drafts are cut at their first forbidden token, each verified row is masked by the
grammar's state before it. Tiny model with a character-level tokenizer; no downloads."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import flat_planner

from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.decoding.grammar import Constraint, GrammarSpec
from specdec_cli.drafters import DrafterOptions, make_drafter, target_info
from specdec_cli.errors import SpecdecError

SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "done": {"type": "boolean"}},
          "required": ["colour", "count", "done"], "additionalProperties": False}
PROMPTS = ["make a list: red green blue, red green", "count to three: one two three", "x"]
DRAFTERS = ["none", "pld", "sam", "recycle", "aded", "sam+aded", "sam+recycle"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from specdec_cli.target_model.load.models import load_target

    return load_target(tiny_model_dir, "cpu", "float32")


def _generate(loaded, drafter_name: str, prompt: str, grammar: GrammarSpec, **changes):
    tokenizer = loaded.tokenizer
    engine = Engine(loaded.model, tokenizer, flat_planner())  # drafts kept anywhere
    drafter = make_drafter(drafter_name, DrafterOptions(), target_info(loaded.model, tokenizer))
    config = GenerationConfig(**{"max_new_tokens": 80, "eos_token_ids": (tokenizer.eos_token_id,), "draft_max": 6,
                                 "grammar": grammar, **changes})
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    generation = engine.generate(ids, drafter, config)
    return generation, tokenizer.decode(generation.tokens, skip_special_tokens=True)


def test_every_drafter_answers_what_constrained_plain_decoding_answers_and_it_validates(loaded):
    grammar = GrammarSpec.json_schema(SCHEMA)
    drafted = 0
    for prompt in PROMPTS:
        plain, text = _generate(loaded, "none", prompt, grammar, draft_max=0)  # constrained plain decoding
        assert plain.finish_reason == "eos", text  # the grammar ended the answer
        jsonschema.validate(json.loads(text), SCHEMA)
        for name in DRAFTERS:
            generation, _ = _generate(loaded, name, prompt, grammar)
            assert generation.tokens == plain.tokens, (name, prompt)
            drafted += generation.stats.drafted_tokens
    assert drafted > 0  # drafts were verified under the grammar


def test_what_the_grammar_forces_is_drafted_where_the_drafter_has_nothing_or_less(loaded):
    """`none` drafts nothing of its own: under a schema the keys and punctuation the grammar forces are its drafts,
    accepted, so the answer takes fewer steps than constrained plain decoding's, and is the same."""
    grammar = GrammarSpec.json_schema(SCHEMA)
    plain, _ = _generate(loaded, "none", PROMPTS[0], grammar, draft_max=0)
    forced, _ = _generate(loaded, "none", PROMPTS[0], grammar, cost_aware=False)
    assert forced.tokens == plain.tokens
    sources = [event.draft.source for event in forced.events if event.kind == "step" and len(event.draft)]
    assert sources and set(sources) == {"grammar"}
    assert forced.stats.accepted_tokens > 0 and forced.stats.steps < plain.stats.steps


def test_sampled_answers_keep_the_grammar(loaded):
    grammar = GrammarSpec("lark", 'start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]{1,3}/')
    for seed in range(4):
        _, text = _generate(loaded, "sam", "answer:", grammar, temperature=1.0, seed=seed)
        assert text in ("yes", "no") or (text.startswith("maybe ") and text[6:].isdigit()), text


def test_a_draft_the_grammar_forbids_is_cut_before_verification(loaded):
    constraint = Constraint(GrammarSpec("lark", 'start: "abc"'), loaded.tokenizer, (loaded.tokenizer.eos_token_id,))
    ids = loaded.tokenizer.encode("abx", add_special_tokens=False)
    assert constraint.allowed(ids) == 2
    vocab = len(loaded.tokenizer)
    masks = constraint.masks(ids[:2], vocab + 5)  # (a model's vocabulary may be wider than its tokenizer's)
    assert masks.shape == (3, vocab + 5) and [int(row.sum()) for row in masks] == [1, 1, 1]
    assert [int(row.nonzero()) for row in masks] == loaded.tokenizer.encode("abc", add_special_tokens=False)
    assert constraint.allowed(ids) == 2  # the state is as it was


def test_bad_grammars_are_one_line_naming_the_grammar():
    for spec in (GrammarSpec("json_schema", '{"type": "nonsense"}'), GrammarSpec("lark", "start: (")):
        with pytest.raises(SpecdecError) as refused:
            spec.compiled()
        assert refused.value.setting == "grammar" and "\n" not in str(refused.value)
    assert GrammarSpec("gbnf", 'root ::= "a" | "b"').compiled()  # llama.cpp's GBNF reads


def test_greedy_choices_are_the_masked_argmax_of_every_row(loaded):
    """The shortcut (a row's best token checked alone) gives what masking the whole row gives, on random rows."""
    import torch

    tokenizer = loaded.tokenizer
    vocab = len(tokenizer)
    constraint = Constraint(GrammarSpec.json_schema(SCHEMA), tokenizer, (tokenizer.eos_token_id,))
    draft = tokenizer.encode('{"colour":"re', add_special_tokens=False)
    assert constraint.allowed(draft) == len(draft)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(len(draft) + 1, vocab, generator=generator)
        logits[:, draft[0]] += torch.rand(1, generator=generator).item() * 8  # now and then an allowed best
        masked = logits.masked_fill(~constraint.masks(draft, vocab), float("-inf")).argmax(-1).tolist()
        assert constraint.greedy_choices(logits, draft, logits.argmax(-1).tolist()) == masked
    assert constraint.allowed(draft) == len(draft)  # the state is as it was
