"""`specdec distill prompts`: the target writes user turns of its own (distill/self_prompts.py). The opening of a
user turn from the model's own template; what is kept (ended turns, of a sane length, new, never a built-in
prompt); resuming after the last attempt with the seeds a run would have used; a foreign file refused untouched
before the model loads; and the command on a tiny model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from specdec_cli.errors import SpecdecError


def test_a_user_turn_opens_as_the_template_opens_it():
    from conftest import make_char_tokenizer

    from specdec_cli.distill.self_prompts import user_turn_prefix

    tokenizer = make_char_tokenizer()
    assert user_turn_prefix(tokenizer) == tokenizer("<|im_start|>user\n", add_special_tokens=False)["input_ids"]
    tokenizer.chat_template = None
    with pytest.raises(SpecdecError, match="no chat template"):
        user_turn_prefix(tokenizer)


@dataclass
class Written:
    tokens: list
    finish_reason: str


class ScriptedEngine:
    """An engine whose turns are given: each generate() returns the next (text, finish reason), and records the
    seed it was asked for."""

    def __init__(self, tokenizer, turns):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, eos_token_id=tokenizer.eos_token_id)
        torch.manual_seed(0)
        self.model = LlamaForCausalLM(config).eval()  # what drafters read of a target (never run here)
        self.tokenizer, self.turns, self.seeds, self.given = tokenizer, list(turns), [], []
        self.forward = None  # no forward over several sequences: turns one at a time

    def generate(self, prompt_ids, drafter, config):
        self.seeds.append(config.seed)
        self.given.append(list(prompt_ids))
        text, finish = self.turns.pop(0)
        return Written(self.tokenizer(text, add_special_tokens=False)["input_ids"], finish)


def test_kept_turns_are_ended_sane_new_and_never_builtin_and_a_rerun_resumes(tmp_path):
    from conftest import make_char_tokenizer

    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.distill.self_prompts import write_prompts
    from specdec_cli.texts.prompts import load_builtin, load_prompts

    tokenizer = make_char_tokenizer()
    builtin = load_builtin()[0].turns[0]
    turns = [("How do I sort a list in Python?", "eos"),
             ("how do I  sort a list in python?", "eos"),  # the same prompt
             ("Too short", "eos"),
             ("A turn the length limit cut off before its end", "length"),
             (builtin, "eos"),  # the built-in suite stays held out
             ("Explain the difference between TCP and UDP.", "eos")]
    engine = ScriptedEngine(tokenizer, turns)
    out = tmp_path / "prompts.jsonl"
    config = GenerationConfig(max_new_tokens=64, temperature=1.0, seed=100)
    result = write_prompts(engine, tokenizer, "tiny", str(out), count=2, config=config)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["How do I sort a list in Python?",
                                               "Explain the difference between TCP and UDP."]
    assert [row["attempt"] for row in rows] == [0, 5] and result.kept == 2 and result.attempts == 6
    assert engine.seeds == [100, 101, 102, 103, 104, 105]  # attempt i samples with seed + i
    engine.turns = [("explain the difference between TCP  and UDP.", "eos"), ("Write a haiku about rain.", "eos")]
    engine.seeds = []
    write_prompts(engine, tokenizer, "tiny", str(out), count=3, config=config)
    assert engine.seeds == [106, 107]  # resumed after the last attempt recorded, not from the start
    assert [prompt.turns[0] for prompt in load_prompts(str(out), None, first_turns=True)][-1] == \
        "Write a haiku about rain."


def test_openers_begin_the_turns_in_turn_and_stay_in_the_prompts(tmp_path):
    from conftest import make_char_tokenizer

    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.distill.self_prompts import user_turn_prefix, write_prompts

    tokenizer = make_char_tokenizer()
    engine = ScriptedEngine(tokenizer, [(" this sentence into French: good morning.", "eos"),
                                        (" how a hash map grows when it is full.", "eos"),
                                        (" this line into German: see you soon.", "eos")])
    out = tmp_path / "prompts.jsonl"
    result = write_prompts(engine, tokenizer, "tiny", str(out), count=3, openers=("Translate", "Explain"),
                           config=GenerationConfig(max_new_tokens=64, temperature=1.0, seed=0))
    prefix = user_turn_prefix(tokenizer)

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    assert engine.given == [prefix + ids("Translate"), prefix + ids("Explain"), prefix + ids("Translate")]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["Translate this sentence into French: good morning.",
                                               "Explain how a hash map grows when it is full.",
                                               "Translate this line into German: see you soon."]
    assert [row["opener"] for row in rows] == ["Translate", "Explain", "Translate"] and result.kept == 3


def test_a_run_stops_after_its_attempts(tmp_path):
    from conftest import make_char_tokenizer

    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.distill.self_prompts import write_prompts

    tokenizer = make_char_tokenizer()
    engine = ScriptedEngine(tokenizer, [("never ends its turn, this one", "length")] * 5)
    result = write_prompts(engine, tokenizer, "tiny", str(tmp_path / "p.jsonl"), count=3,
                           config=GenerationConfig(temperature=1.0, seed=0), max_attempts=5)
    assert result.kept == 0 and result.attempts == 5


def test_a_foreign_file_is_refused_untouched_before_the_model_loads(tmp_path, monkeypatch):
    from conftest import assert_one_line_error, invoke

    from specdec_cli.target_model.load import models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load", never)
    foreign = tmp_path / "notes.jsonl"
    foreign.write_text('{"prompt": "mine", "category": "chat"}\n')
    before = foreign.read_bytes()
    assert_one_line_error(invoke("distill", "prompts", "-o", str(foreign)), "not a prompts file")
    assert foreign.read_bytes() == before
    for args, needle in ((["--count", "0"], "--count"), (["--temperature", "0"], "--temperature"),
                         (["--top-p", "0"], "--top-p"), (["--opener", " "], "--opener"),
                         (["--opener", "x" * 201], "--opener")):
        assert_one_line_error(invoke("distill", "prompts", "-o", str(tmp_path / "new.jsonl"), *args), needle)
    assert_one_line_error(invoke("distill", "-o", str(tmp_path / "head"), "--opener", "Explain"), "--self-prompts")


def test_the_command_writes_prompts_a_distill_run_reads(tiny_model_dir, tmp_path):
    from conftest import invoke

    from specdec_cli.texts.prompts import load_prompts

    out = tmp_path / "self.jsonl"
    result = invoke("distill", "prompts", "-m", tiny_model_dir, "-o", str(out), "--count", "1", "-n", "24",
                    "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert f"{out}:" in result.stderr and "Traceback" not in result.stderr
    rows = load_prompts(str(out), None, first_turns=True) if out.exists() and out.read_text().strip() else []
    assert len(rows) <= 1 and all(row.category == "self" for row in rows)


def test_on_block_weights_a_round_of_turns_is_sampled_together_each_with_its_seed(tmp_path, monkeypatch):
    """The native decoder samples ROUND turns per forward; each is what plain sampling with seed + attempt writes."""
    import torch
    from conftest import fixed_engine, make_char_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_cli import kernels
    from specdec_cli.decoding import plain_many
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.distill import self_prompts
    from specdec_cli.drafters.none import NoDrafter
    from specdec_cli.target_model.load import converted_blocks
    from specdec_cli.target_model.native import quant

    if not kernels.available():
        pytest.skip("specdec's CPU kernels are not compiled")
    tokenizer = make_char_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(1)
    model = LlamaForCausalLM(config).eval()
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "int4", None))
    engine = fixed_engine(model)
    rounds = []
    many = plain_many.plain_many

    def recorded(forward, prompts, settings, **options):
        answers = many(forward, prompts, settings, **options)
        rounds.append((options["seeds"], answers))
        return answers

    monkeypatch.setattr(plain_many, "plain_many", recorded)
    settings = GenerationConfig(max_new_tokens=10, temperature=1.0, seed=7)
    result = self_prompts.write_prompts(engine, tokenizer, "tiny", str(tmp_path / "p.jsonl"), count=3,
                                        config=settings, max_attempts=self_prompts.ROUND + 2)
    assert result.attempts == self_prompts.ROUND + 2
    assert [seeds for seeds, _ in rounds] == [list(range(7, 7 + self_prompts.ROUND)),
                                              [7 + self_prompts.ROUND, 8 + self_prompts.ROUND]]
    prefix = self_prompts.user_turn_prefix(tokenizer)
    eos = (tokenizer.eos_token_id,)
    for seeds, answers in rounds:
        for answer in answers[:3]:
            plain = engine.generate(prefix, NoDrafter(), GenerationConfig(
                max_new_tokens=10, temperature=1.0, seed=seeds[answer.index], eos_token_ids=eos))
            assert answer.tokens == plain.tokens


def test_the_pipeline_writes_its_own_prompts_first_and_answers_them_too(tiny_model_dir, tmp_path):
    import re

    from conftest import invoke

    from specdec_cli.texts.prompts import load_prompts

    out = tmp_path / "head"
    result = invoke("distill", "--kind", "eagle", "-m", tiny_model_dir, "-o", str(out), "--self-prompts", "1",
                    "--max-prompts", "3", "-n", "8", "--steps", "2", "--eval-max-prompts", "1",
                    "--eval-max-new-tokens", "8")
    assert result.returncode == 0, result.stderr
    own = tmp_path / "head.prompts.jsonl"
    assert "0/3 Writing 1 prompts" in result.stderr and own.exists()
    kept = len(load_prompts(str(own), None, first_turns=True)) if own.read_text().strip() else 0
    answered = re.search(r"1/3 Answering (\d+) prompts", result.stderr)
    assert answered and int(answered.group(1)) == 3 + kept
    # a head starts random: the pipeline scores the trained one alone (`distill evaluate` can score its start)
    assert "3/3 Evaluating trained on 1 prompts" in result.stderr, result.stderr
    evaluation = json.loads((out / "distill_report.json").read_text())["evaluation"]
    assert "before" not in evaluation and {"after", "after_chain"} <= set(evaluation)


def test_bad_self_prompt_settings_are_refused_before_loading(tmp_path):
    from conftest import invoke

    for flags, message in ((["--self-prompts", "-1"], "--self-prompts must be in"),
                           (["--self-prompts", "2", "--engine", "vllm"], "use --engine specdec")):
        result = invoke("distill", "-m", str(tmp_path / "no-model"), "-o", str(tmp_path / "out"), *flags)
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr
