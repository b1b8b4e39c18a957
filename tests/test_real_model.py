"""The embedded default model (SmolLM2-135M-Instruct): the one-shot command equals transformers' greedy.

The model is loaded once a session (conftest's real_target); the commands run in process on it (`invoke` with
shared_real_model), except where a fresh process is what is tested (a damaged conversion's one warning line)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import invoke, run_cli
from helpers import split_logits

from specdec_cli.drafters import DRAFTERS

pytestmark = pytest.mark.real_model

# Prompts written for this test only (not in any benchmark suite).
PROMPTS = [
    "List three uses of a paperclip, one per line, then repeat the list in reverse order.",
    "Write a Python function `count_vowels(text)` and a short test for it.",
]


@pytest.fixture
def default_target(real_target):
    """The dense float32 model (conftest's real_target, loaded once a session): transformers' float32 generate on
    it is the reference below."""
    return real_target("float32", "dense")


def _reference(target, prompt, max_new_tokens):
    from specdec_cli.texts.prompt_ids import format_prompt

    ids = format_prompt(target.tokenizer, [{"role": "user", "content": prompt}])
    input_ids = torch.tensor([ids])
    with torch.inference_mode():
        out = target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                    max_new_tokens=max_new_tokens)
    return ids, out[0, len(ids):].tolist()


@pytest.mark.parametrize("drafter", ["none", "pld"])
def test_one_shot_json_equals_transformers_greedy(default_target, shared_real_model, drafter):
    prompt = PROMPTS[0] if drafter == "none" else PROMPTS[1]
    ids, reference = _reference(default_target, prompt, 96)
    result = invoke("chat", "--prompt", prompt, "--drafter", drafter, "--max-new-tokens", "96", "--json",
                    "--dtype", "float32", "--weights", "dense")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["output_token_ids"] == reference
    assert payload["prompt_tokens"] == len(ids)
    assert payload["drafter"] == drafter
    assert payload["output"] == default_target.tokenizer.decode(reference, skip_special_tokens=True)
    stats = payload["stats"]
    assert stats["new_tokens"] == len(reference)
    assert set(stats) >= {"new_tokens", "steps", "mean_accepted_tokens", "drafted_tokens", "accepted_tokens",
                          "acceptance_rate", "per_position_acceptance", "tokens_per_second", "wall_seconds",
                          "ttft_seconds"}
    if drafter == "none":
        assert stats["mean_accepted_tokens"] == pytest.approx(1.0)


def _untrained_head(target, folder):
    """An EAGLE head for the real model, untrained (its drafts are mostly wrong: the output must not care)."""
    from specdec_cli.drafters import target_info
    from specdec_cli.drafters.eagle_head import EagleHead, head_config_for, save_head

    info = target_info(target.model, target.tokenizer)
    torch.manual_seed(0)
    save_head(folder, EagleHead(head_config_for(target.model.config)),
              {"fingerprint": info.fingerprint, "vocab_size": info.vocab_size, "head_tokens": None})
    return str(folder)


def test_every_drafter_is_lossless_in_process(default_target, tmp_path):
    """All registered drafters, greedy, against transformers' generate on a repetitive prompt."""
    from specdec_cli.drafters import DRAFTERS
    from specdec_cli.session.chat import ChatSession, ChatSettings
    from specdec_cli.session.run_settings import run_settings

    prompt = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."
    _, reference = _reference(default_target, prompt, 64)
    head = _untrained_head(default_target, tmp_path / "head")
    for name in [*DRAFTERS, "sam+none", "sam+recycle", "sam+eagle"]:
        if name == "model":  # needs a draft directory: see the model drafter's test below
            continue
        settings = ChatSettings(run_settings(name, draft_model=head, max_new_tokens=64))
        session = ChatSession(default_target.model, default_target.tokenizer, settings)
        assert session.ask(prompt).generation.tokens == reference, name


LIST_PROMPT = "Repeat this list twice, then add a fourth item: apples, pears, plums."


def _engine_on(real_target, dtype: str, weights: str, prompt: str):
    """The real target loaded so, what drafters know of it, an engine on a fixed cost curve (drafts verified
    whole) and the prompt's token ids in its chat template."""
    from specdec_cli.decoding.cost_curve import CostCurve
    from specdec_cli.decoding.engine import Engine
    from specdec_cli.decoding.planner import DraftPlanner
    from specdec_cli.drafters import target_info
    from specdec_cli.texts.prompt_ids import format_prompt

    target = real_target(dtype, weights)
    engine = Engine(target.model, target.tokenizer, DraftPlanner(CostCurve.fixed({1: 1.0, 2: 1.02, 16: 1.1})))
    ids = format_prompt(target.tokenizer, [{"role": "user", "content": prompt}])
    return target, target_info(target.model, target.tokenizer), engine, ids


@pytest.fixture(scope="module")
def bfloat16_reference(real_target, tmp_path_factory):
    """The bfloat16 model's engine, a prompt, and that engine's plain bfloat16 decoding of it (the reference every
    drafter is held to); made once a module (once a worker under pytest-xdist)."""
    from specdec_cli.decoding.engine import GenerationConfig
    from specdec_cli.drafters import DrafterOptions, make_drafter

    target, info, engine, ids = _engine_on(real_target, "bfloat16", "dense", "Explain in two short paragraphs why "
                                           "the sky is blue, then summarise it in one sentence.")
    config = GenerationConfig(max_new_tokens=80, eos_token_ids=info.eos_token_ids)
    reference = engine.generate(ids, make_drafter("none", DrafterOptions(), info), config).tokens
    assert engine.forward.outcome.state == "on", engine.forward.outcome.text()
    options = DrafterOptions(draft_model=_untrained_head(target, tmp_path_factory.mktemp("head")))
    return engine, info, ids, config, options, reference


@pytest.mark.xdist_group("bfloat16")  # one worker makes the reference once (make test: --dist loadgroup)
@pytest.mark.parametrize("name", [name for name in [*DRAFTERS, "sam+recycle", "sam+eagle"]
                                  if name not in ("none", "model")])
def test_every_drafter_is_exact_in_bfloat16(bfloat16_reference, name):
    """In bfloat16 a block's rows round differently from one-row forwards unless verification is row-invariant
    (exact.py; before it, pld and sam diverged within ~90 tokens on 3 of 4 prompts): every drafter, chains and
    trees, against the same engine's plain bfloat16 decoding."""
    from specdec_cli.drafters import make_drafter

    engine, info, ids, config, options, reference = bfloat16_reference
    generation = engine.generate(ids, make_drafter(name, options, info), config)
    assert generation.tokens == reference, name
    assert generation.stats.drafted_tokens > 0, name


def test_model_drafter_is_lossless_on_the_real_model(default_target):
    """A draft built like `specdec distill`'s initialisation (the target's first 2 blocks, untrained) drafts
    mostly wrong tokens; the output must still be the target's own greedy answer, with and without the
    engine's cost-aware trimming."""
    from dataclasses import replace

    from specdec_cli.decoding.cost_curve import CostCurve
    from specdec_cli.decoding.engine import Engine, GenerationConfig
    from specdec_cli.decoding.planner import DraftPlanner
    from specdec_cli.distill.student import build_student
    from specdec_cli.drafters import target_info
    from specdec_cli.drafters.model import ModelDrafter

    student = build_student(default_target.model, {"kind": "target", "layers": 2}).eval()
    info = target_info(default_target.model, default_target.tokenizer)
    ids, reference = _reference(default_target, PROMPTS[1], 48)
    config = GenerationConfig(max_new_tokens=48, eos_token_ids=info.eos_token_ids)
    for cost_aware in (False, True):
        drafter = ModelDrafter(student, draft_max=4, eos_token_ids=info.eos_token_ids)
        # a fixed curve on which drafting pays: whether it does on this machine today is not this test's business
        planner = DraftPlanner(CostCurve.fixed({1: 1.0, 2: 1.05, 8: 1.2}))
        engine = Engine(default_target.model, planner=planner)
        generation = engine.generate(ids, drafter, replace(config, cost_aware=cost_aware))
        assert generation.tokens == reference, cost_aware
        assert generation.stats.drafted_tokens > 0


def test_stop_string_cuts_the_output(shared_real_model):
    result = invoke("chat", "--prompt", PROMPTS[1], "--max-new-tokens", "64", "--stop", "def ", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert "def " not in payload["output"]
    assert payload["finish_reason"] == "stop"


def test_every_drafter_is_exact_on_the_ggufs_own_blocks(real_target, tmp_path):
    """The default GGUF at its own precision (Q4_1 and Q8_0 blocks on specdec's kernels, the native decoder):
    every drafter, chains and trees, greedy-identical to plain decoding of the same block weights."""
    from specdec_cli.decoding.engine import GenerationConfig
    from specdec_cli.drafters import DRAFTERS, DrafterOptions, make_drafter
    from specdec_cli.target_model.native.quant import weights_summary
    from specdec_cli.target_model.verify.exact_setup import NativeForward

    target, info, engine, ids = _engine_on(real_target, "float32", "gguf", LIST_PROMPT)
    assert target.weights == "gguf" and weights_summary(target.model) == "210 Q4_1 + 1 Q8_0 block layers, 0 dense"
    assert isinstance(engine.forward, NativeForward)
    config = GenerationConfig(max_new_tokens=80, eos_token_ids=info.eos_token_ids)
    reference = engine.generate(ids, make_drafter("none", DrafterOptions(), info), config).tokens
    assert engine.forward.outcome.state == "on", engine.forward.outcome.text()
    options = DrafterOptions(draft_model=_untrained_head(target, tmp_path / "head"))
    for name in [*DRAFTERS, "sam+recycle", "sam+eagle"]:
        if name in ("none", "model"):
            continue
        generation = engine.generate(ids, make_drafter(name, options, info), config)
        assert generation.tokens == reference, name
        assert generation.stats.drafted_tokens > 0, name


def test_every_drafter_keeps_a_logit_bias_and_penalties_on_the_ggufs_own_blocks(real_target):
    """A token of the free answer banned (`logit_bias` -100) and another favoured, or the presence and frequency
    penalties, the repetition penalty, llama.cpp's window of all three, DRY: every drafter's answer is plain
    decoding's with the same settings, and they changed it."""
    from dataclasses import replace

    from specdec_cli.decoding.dry import DryPenalty
    from specdec_cli.decoding.engine import GenerationConfig
    from specdec_cli.drafters import DRAFTERS, DrafterOptions, make_drafter

    _, info, engine, ids = _engine_on(real_target, "float32", "gguf", LIST_PROMPT)
    free_config = GenerationConfig(max_new_tokens=48, eos_token_ids=info.eos_token_ids)
    free = engine.generate(ids, make_drafter("none", DrafterOptions(), info), free_config).tokens
    for config in (replace(free_config, logit_bias=((free[2], -100.0), (free[0], 1.5))),
                   replace(free_config, presence_penalty=1.0, frequency_penalty=0.5),
                   replace(free_config, repetition_penalty=1.3),  # vLLM's: every token of prompt and answer
                   replace(free_config, repetition_penalty=1.5, presence_penalty=1.0, penalty_last_n=12),  # llama.cpp
                   replace(free_config, dry=DryPenalty(multiplier=1.5))):
        reference = engine.generate(ids, make_drafter("none", DrafterOptions(), info), config).tokens
        assert reference != free and (free[2] not in reference or not config.logit_bias), config
        for name in [*DRAFTERS, "sam+recycle"]:
            if name in ("none", "model", "eagle"):
                continue
            generation = engine.generate(ids, make_drafter(name, DrafterOptions(), info), config)
            assert generation.tokens == reference, (name, config)


def test_chat_on_the_ggufs_blocks_says_so_and_speculates_identically(shared_real_model):
    result = invoke("chat", "--prompt", PROMPTS[1], "--weights", "gguf", "--compare", "--json", "-n", "48")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["identical"] and payload["weights"] == "gguf in place (210 Q4_1 + 1 Q8_0 block layers, 0 dense)"
    assert payload["exact_verification"].startswith("on: specdec's native decoder")


def test_llama_cpp_decodes_the_same_gguf_where_it_is_installed():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional)")
    from types import SimpleNamespace

    from specdec_cli.bench.llama_cpp import LlamaCpp
    from specdec_cli.target_model.load.models import load_tokenizer
    from specdec_cli.target_model.load.target_source import default_gguf_path
    from specdec_cli.texts.prompt_ids import format_prompt

    tokenizer = load_tokenizer()
    ids = format_prompt(tokenizer, [{"role": "user", "content": PROMPTS[0]}])
    config = SimpleNamespace(max_new_tokens=12, eos_token_ids=(tokenizer.eos_token_id,), greedy=True, temperature=0.0,
                             seed=None)
    tokens, seconds, ttft, finish, _ = LlamaCpp(str(default_gguf_path()), 1, pld=False).generate(list(ids), config)
    assert len(tokens) == 12 and finish == "length" and 0 < ttft <= seconds
    assert tokenizer.decode(tokens).strip()  # text, in the model's own vocabulary


def test_distill_with_its_defaults_then_draft_identically(shared_real_model, tmp_path):
    """What a new user runs first: `specdec distill` with its defaults (`--weights auto`: the GGUF's blocks here),
    a few prompts and steps, then chat drafting with the result: the answer is plain decoding's, token for token."""
    draft = tmp_path / "my-draft"
    result = invoke("distill", "-o", str(draft), "--max-prompts", "1", "-n", "8", "--eval-max-prompts", "1",
                    "--eval-max-new-tokens", "16", "--steps", "2")
    assert result.returncode == 0, result.stderr
    assert (draft / "model.safetensors").is_file() and (draft / "distill_report.json").is_file()
    assert "3/3 Evaluating before and after training" in result.stderr  # a student starts from the target's blocks
    assert f"  specdec chat --drafter model --draft-model {draft} --prompt" in result.stdout  # one line, to copy
    chat = invoke("chat", "--drafter", "model", "--draft-model", str(draft), "--prompt", PROMPTS[0], "-n", "16",
                  "--compare", "--json")
    assert chat.returncode == 0, chat.stderr
    payload = json.loads(chat.stdout)
    assert payload["identical"], payload


def test_a_heads_pipeline_trains_on_the_features_its_answering_kept(shared_real_model, real_target, tmp_path,
                                                                   monkeypatch):
    """`specdec distill --kind eagle`: answering keeps the target's features beside the data file, and training reads
    them instead of computing them again (the features pass would call the target once a piece: it never does)."""
    from specdec_cli.distill import eagle_train
    from specdec_cli.distill.answer_features import answers_folder, handed_features
    from specdec_cli.texts.data_rows import read_rows

    def no_forward(target):
        return lambda piece: (_ for _ in ()).throw(AssertionError("computed features the answering had kept"))

    monkeypatch.setattr(eagle_train, "last_states", no_forward)
    head = tmp_path / "head"
    result = invoke("distill", "--kind", "eagle", "-o", str(head), "--max-prompts", "3", "-n", "8",
                    "--eval-max-prompts", "1", "--eval-max-new-tokens", "8", "--steps", "2")
    assert result.returncode == 0, result.stderr
    data = tmp_path / "head.data.jsonl"
    rows = read_rows(str(data))
    assert len(rows) == 3 and (head / "head.safetensors").is_file()
    folder = answers_folder(data)
    assert folder.name == "head.data.features" and (folder / "answers.json").is_file()
    handed = handed_features(data, *eagle_train.computed_by(real_target("float32", "auto").model))
    assert handed is not None
    assert all(handed.locate([*row["prompt_ids"], *row["answer_ids"]]) is not None for row in rows)


def test_a_damaged_conversion_is_converted_again_with_one_warning(tmp_path, monkeypatch):
    """A converted model cut short (`truncate -s 1000000 model.safetensors`) is found on load and converted again,
    with one warning line naming it; transformers' own progress bar never reaches stderr. In a process of its own:
    all that reaches its stderr is checked (transformers' logging included)."""
    import shutil

    from specdec_cli.target_model.load.converted import converted_dir, ensure_converted
    from specdec_cli.target_model.load.target_source import default_gguf_path

    ours = ensure_converted(default_gguf_path())  # this machine's (the tests' home), converted once
    home = tmp_path / "home"
    copy = home / "models" / ours.name
    shutil.copytree(ours, copy)
    with open(copy / "model.safetensors", "r+b") as handle:
        handle.truncate(1_000_000)
    # dense weights: the GGUF's blocks would be made again and timed in this fresh home, which is not what is tested
    result = run_cli("chat", "--prompt", "hi", "-n", "4", "--json", "--drafter", "none", "--weights", "dense",
                     env_extra={"SPECDEC_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdec: warning: the converted model"), result.stderr
    assert str(copy) in lines[0] and "model.safetensors: 1,000,000 bytes" in lines[0]
    assert "de-quantizing" not in result.stderr
    from specdec_cli.target_model.load.converted import converted_damage

    monkeypatch.setenv("SPECDEC_HOME", str(home))
    assert converted_dir(default_gguf_path()) == copy and converted_damage(copy) is None  # repaired in place


def test_memory_info_converts_nothing(tmp_path):
    """`memory info` needs the target's tokenizer at most: on a fresh home the default model is not converted."""
    home = tmp_path / "home"
    result = invoke("memory", "info", "--json", env_extra={"SPECDEC_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["answers"] == 0
    assert not (home / "models").exists()


def test_the_default_gguf_in_place_is_the_converted_model_on_its_own_blocks(real_target):
    """The default file loaded in place (no transformers model, no dense copy): its tokenizer encodes and templates
    as transformers' AutoTokenizer reads the file, and its logits equal bit for bit those of the file's blocks
    installed into transformers' model of it (specdec's path before)."""
    from transformers import AutoTokenizer, PreTrainedModel

    from specdec_cli.target_model.load import converted_blocks
    from specdec_cli.target_model.load.target_source import default_gguf_path
    from specdec_cli.target_model.native import native, quant
    from specdec_cli.texts.prompt_ids import format_prompt

    in_place = real_target("float32", "gguf")
    assert not isinstance(in_place.model, PreTrainedModel) and in_place.model.source.cache.is_dir()
    path = default_gguf_path()
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    messages = [{"role": "user", "content": PROMPTS[1] + " Ünïcödé, 日本語, tabs\tand  spaces."}]
    assert format_prompt(in_place.tokenizer, messages) == format_prompt(reference, messages)
    assert in_place.tokenizer.eos_token_id == reference.eos_token_id
    dense = real_target("float32", "dense").model  # the converted float32 model: copied, never changed
    before = type(dense)(dense.config).eval()
    before.load_state_dict(dense.state_dict())
    quant.install_blocks(before, converted_blocks.plan_blocks(before, "gguf", path))
    ids = format_prompt(in_place.tokenizer, messages)

    with torch.inference_mode():
        assert torch.equal(split_logits(in_place.model, ids, 5), split_logits(native.decoder_for(before), ids, 5))
