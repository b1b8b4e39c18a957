"""The EAGLE-style head: the module and its cache, features in step events, training that learns, the head's
files and their checks, and the `eagle` / `sam+eagle` drafters lossless (greedy identity, sampling law)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from conftest import TINY_EOS, chi_square, fixed_engine, hf_greedy, invoke
from helpers import IdsTokenizer

from specdec_cli import kernels
from specdec_cli.decoding.draft import Needs
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.drafters import DrafterOptions, make_drafter, target_info, target_weights
from specdec_cli.drafters.eagle import EagleDrafter, check_target
from specdec_cli.drafters.eagle_head import EagleHead, HeadCache, head_config_for, load_head, save_head
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.drafters.pld import PromptLookupDrafter
from specdec_cli.errors import SpecdecError

PATTERN = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 30, 31, 32, 33, 30, 31]]



class _Listener(NoDrafter):
    """Plain decoding whose events carry the target's features (what the eagle drafter reads)."""

    needs = Needs(features=True)


class _FeaturePld(PromptLookupDrafter):
    """Prompt lookup (drafts that get accepted) that asks for the features too."""

    needs = Needs(features=True)


def _trained_head(model):
    """A head trained briefly on the model's own greedy answers to a few prompts."""
    from specdec_cli.distill.eagle_train import EagleTrainConfig, train_eagle

    sequences = [prompt + hf_greedy(model, prompt, 40) for prompt in ([1, *PATTERN], *PROMPTS, [1, 40, 41, 42])]
    sequences = sequences * 3
    head, result = train_eagle(model, sequences, EagleTrainConfig(steps=150, lr=3e-3, head_vocab=0, holdout=0.25))
    return head, result


@pytest.fixture(scope="module")
def trained(tiny_llama):
    return _trained_head(tiny_llama)


def test_feeding_a_block_equals_feeding_its_positions_one_by_one(tiny_llama):
    torch.manual_seed(0)
    head = EagleHead(head_config_for(tiny_llama.config)).eval()
    features, embedded = torch.randn(1, 6, 64), torch.randn(1, 6, 64)
    with torch.inference_mode():
        whole = head(features, embedded, torch.arange(6))  # [1, 6, 64]
        cache = HeadCache()
        first = head(features[:, :4], embedded[:, :4], torch.arange(4), cache)
        rest = [head(features[:, index : index + 1], embedded[:, index : index + 1], torch.tensor([index]), cache)
                for index in (4, 5)]
    assert torch.allclose(torch.cat([first, *rest], dim=1), whole, atol=1e-5)
    assert len(cache) == 6
    cache.crop(3)
    assert len(cache) == 3


def test_a_whole_piece_attends_causally_as_its_mask_says():
    """A piece with no cache (training's) takes the causal kernel, no mask made: the bits of the masked call, with
    groups of query heads too."""
    from specdec_cli.drafters.eagle_head import attend

    torch.manual_seed(1)
    for heads, kv_heads, length in ((4, 4, 37), (6, 2, 130)):
        query = torch.randn(1, heads, length, 16)
        key, value = torch.randn(1, kv_heads, length, 16), torch.randn(1, kv_heads, length, 16)
        mask = torch.ones(length, length, dtype=torch.bool).tril()
        assert torch.equal(attend(query, key, value, None, None), attend(query, key, value, None, mask))


def test_step_events_carry_the_committed_positions_features(tiny_llama):
    engine = fixed_engine(tiny_llama)
    events = []
    drafter = _FeaturePld()
    prompt = [1, *PATTERN, *PATTERN[:6]]
    generation = engine.generate(prompt, drafter, GenerationConfig(max_new_tokens=12), events.append)
    sequence = prompt + generation.tokens
    with torch.inference_mode():
        reference = tiny_llama(torch.tensor([sequence]), output_hidden_states=True).hidden_states[-1][0]  # [n, H]
    features = torch.cat([event.features for event in events])
    assert events[0].features.shape == (len(prompt), 64)
    assert all(event.features.shape[0] == 1 + event.accepted for event in events[1:])
    assert features.shape[0] == len(sequence) - 1  # every committed token but the newest
    assert torch.allclose(features, reference[: len(sequence) - 1], atol=1e-4)
    assert all(event.scored_topk is None for event in events)  # not asked for: not computed
    plain = []  # a drafter that needs no features gets none: the forwards do not even request them
    engine.generate(prompt, make_drafter("pld", DrafterOptions(), target_info(tiny_llama, IdsTokenizer(64))),
                    GenerationConfig(max_new_tokens=12), plain.append)
    assert all(event.features is None for event in plain)
    assert sum(event.accepted for event in plain) == sum(event.accepted for event in events)


def test_training_raises_agreement_with_the_target(trained):
    _, result = trained
    report = result["report"]
    assert report["top1_agreement_after"] > report["top1_agreement_before"] + 0.2, report
    assert report["train_tokens"] > 0 and report["steps"] == 150


def test_drafters_alive_on_one_target_share_one_head_and_draft_alike(tiny_llama, trained, tmp_path):
    """A server's slots each hold a drafter: those made from one head file for one target share its weights (read
    only) and draft as a drafter alone does; a head file rewritten, or a head no drafter holds any more, is read
    again."""
    import gc
    import os
    import weakref

    head, _ = trained
    info = target_info(tiny_llama, IdsTokenizer(64))
    folder = tmp_path / "head"
    save_head(folder, head, {"fingerprint": info.fingerprint, "vocab_size": 64, "head_tokens": None})
    options = DrafterOptions(draft_model=str(folder))
    first, second = make_drafter("eagle", options, info), make_drafter("eagle", options, info)
    assert second.head is first.head and second.vocabulary is not first.vocabulary  # (a vocabulary grows per context)
    engine = fixed_engine(tiny_llama)
    config = GenerationConfig(max_new_tokens=24, eos_token_ids=(TINY_EOS,))
    alone = [engine.generate(prompt, make_drafter("eagle", options, info), config).tokens for prompt in PROMPTS]
    plain = [engine.generate(prompt, NoDrafter(), config).tokens for prompt in PROMPTS]
    for prompt, want, greedy in zip(PROMPTS, alone, plain):  # turns of two drafters interleaved, one head
        assert engine.generate(prompt, first, config).tokens == want == greedy
        assert engine.generate(prompt, second, config).tokens == want
    stat = (folder / "head.safetensors").stat()
    os.utime(folder / "head.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten
    assert make_drafter("eagle", options, info).head is not first.head
    held = weakref.ref(first.head)
    del first, second
    gc.collect()
    assert held() is None  # the share keeps no head alive


@pytest.mark.parametrize("name", ["eagle", "eagle-chain", "sam+eagle"])
def test_eagle_drafting_is_greedy_identical(tiny_llama, trained, tmp_path, name):
    head, _ = trained
    info = target_info(tiny_llama, IdsTokenizer(64))
    save_head(tmp_path / "head", head, {"fingerprint": info.fingerprint, "vocab_size": 64, "head_tokens": None})
    if name == "eagle-chain":
        drafter = EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama),
                               tree_width=0, eos_token_ids=(TINY_EOS,))
    else:
        drafter = make_drafter(name, DrafterOptions(draft_model=str(tmp_path / "head")), info)
    accepted = 0
    trees = 0
    for prompt in [[1, *PATTERN], *PROMPTS]:
        generation = fixed_engine(tiny_llama).generate(prompt, drafter, GenerationConfig(max_new_tokens=32,
                                                                                       eos_token_ids=(TINY_EOS,)))
        assert generation.tokens == hf_greedy(tiny_llama, prompt, 32), (name, prompt)
        accepted += generation.stats.accepted_tokens
        trees += sum(event.draft.parents is not None and len(set(event.draft.parents)) < len(event.draft)
                     for event in generation.events)
    assert accepted > 0  # the head drafted tokens the target kept
    assert (trees > 0) == (name != "eagle-chain")  # eagle drafts trees with siblings; its chain mode does not


@pytest.mark.parametrize("tree_width", [0, 4])
def test_a_head_far_behind_starts_again_from_its_last_pairs_and_stays_lossless(tiny_llama, trained, monkeypatch,
                                                                                tree_width):
    """A draft's catch-up feeds at most CATCH_UP_MAX committed pairs (a long prompt cost a head forward over all of
    it): the head's cache then holds the last ones, at their own positions; greedy answers stay plain decoding's."""
    from specdec_cli.drafters import eagle

    monkeypatch.setattr(eagle, "CATCH_UP_MAX", 5)
    head, _ = trained
    drafter = EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama), tree_width=tree_width,
                           eos_token_ids=(TINY_EOS,))
    fed = []
    forward = drafter.head.forward

    def counted(features, *args, **kwargs):
        fed.append(int(features.shape[1]))
        return forward(features, *args, **kwargs)

    monkeypatch.setattr(drafter.head, "forward", counted)
    prompt = [1, *PATTERN, *PATTERN]  # longer than 5
    generation = fixed_engine(tiny_llama).generate(prompt, drafter, GenerationConfig(max_new_tokens=24,
                                                                                   eos_token_ids=(TINY_EOS,)))
    assert generation.tokens == hf_greedy(tiny_llama, prompt, 24)
    assert fed and max(fed) <= 5 and fed[0] == 5  # the first draft fed the prompt's last 5 pairs alone
    assert generation.stats.accepted_tokens > 0  # and the head still drafted tokens the target kept
    assert drafter.cache_start >= len(prompt) - 5 and len(drafter.cache) > 0  # (the prompt and the first token)


def test_a_tree_stopped_early_is_the_best_nodes_of_the_whole_tree(tiny_llama, trained):
    """Growing stops once `budget` nodes outscore every open node: the draft must be the first `budget` nodes of
    the tree grown to full depth (a budget larger than any tree never stops early)."""
    head, _ = trained
    drafter = EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama), draft_max=5, expand_gain=0)
    events = []
    prompt = [1, *PATTERN, *PATTERN[:5]]
    fixed_engine(tiny_llama).generate(prompt, _Listener(),
                                 GenerationConfig(max_new_tokens=6), events.append)
    forwards = []
    drafter.head.register_forward_hook(lambda module, args, out: forwards.append(args[0].shape[1]))
    context = list(prompt)
    levels = {}
    for event in events:
        drafter.observe(event)
        context += event.committed
        whole = drafter.propose(context, 10_000)
        assert len(whole) > 8
        for budget in (1, 2, 3, 5, 8):
            forwards.clear()
            draft = drafter.propose(context, budget)
            assert draft.tokens == whole.tokens[:budget] and draft.parents == whole.parents[:budget], budget
            levels[budget] = levels.get(budget, 0) + len(forwards)
    assert levels[1] < levels[8]  # small budgets grew fewer levels


def _event(kind, committed, features, draft=None, prompt=()):
    from specdec_cli.decoding.draft import Draft, StepEvent

    return StepEvent(kind=kind, draft=draft or Draft.empty("x"), accepted_path=[0] if draft else [],
                     committed=committed, features=features, prompt_tokens=prompt)


def test_the_head_skips_unlikely_nodes(tiny_llama, trained):
    head, _ = trained
    prompt = [1, *PATTERN, *PATTERN[:5]]
    events = []
    fixed_engine(tiny_llama).generate(prompt, _Listener(),
                                 GenerationConfig(max_new_tokens=1), events.append)
    likely, whole = (EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama),
                                  min_prob=min_prob) for min_prob in (0.2, 0.0))
    for drafter in (likely, whole):
        drafter.observe(events[0])
    context = prompt + events[0].committed
    short, full = likely.propose(context, 64), whole.propose(context, 64)
    assert 0 < len(short) < len(full)  # the nodes scoring under 0.2 are left out, the rest kept in order
    assert short.tokens == full.tokens[: len(short)] and short.parents == full.parents[: len(short)]


def test_a_tree_grows_only_nodes_worth_a_head_forward(tiny_llama, trained):
    """Once a tree level's seconds and a verify step's are measured, a node is expanded only if it scores at least
    expand_gain x their ratio: a level as dear as a step expands nothing past the root's children (one forward);
    the shallow tree is the full tree's nodes of depth 1, in the same order."""
    head, _ = trained
    prompt = [1, *PATTERN, *PATTERN[:5]]
    events = []
    fixed_engine(tiny_llama).generate(prompt, _Listener(), GenerationConfig(max_new_tokens=1), events.append)
    dear, free = (EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama), expand_gain=gain)
                  for gain in (3.0, 0.0))
    forwards = []
    dear.head.register_forward_hook(lambda module, args, out: forwards.append(args[0].shape[1]))
    context = prompt + events[0].committed
    for drafter in (dear, free):
        drafter.observe(events[0])
        drafter.level_seconds, drafter.step_seconds = 0.01, 0.01  # a level costs a step: floor min(0.9, 3)
    assert dear.expand_floor() == 0.9 and free.expand_floor() == free.min_prob
    shallow, full = dear.propose(context, 64), free.propose(context, 64)
    assert len(forwards) == 1  # the catch-up forward alone
    assert set(shallow.parents) == {-1} and len(shallow) < len(full)
    assert shallow.tokens == [token for token, parent in zip(full.tokens, full.parents) if parent == -1]


def test_the_head_drafts_what_it_is_asked_for(tiny_llama, trained):
    """No back-off of its own (the planner decides whether drafting pays): unverified drafts change nothing."""
    head, _ = trained
    drafter = EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama))
    torch.manual_seed(3)
    context = [1, *PATTERN]
    drafter.observe(_event("prefill", [PATTERN[0]], torch.randn(len(context), 64), prompt=context))
    context.append(PATTERN[0])
    for _ in range(6):
        assert len(drafter.propose(context, 8)) > 0
        drafter.observe(_event("step", [7], torch.randn(1, 64)))
        context.append(7)
    assert len(drafter.propose(context, 0)) == 0


def _block_target(tiny_llama, mode):
    from specdec_cli.target_model.load import converted_blocks
    from specdec_cli.target_model.native import quant

    model = copy.deepcopy(tiny_llama)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, mode, None))
    return model


@pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_on_a_block_target_the_head_drafts_on_the_kernels_and_stays_lossless(tiny_llama, trained, mode):
    """On a block target the head's layers become 8-bit block layers (close to the float head, not equal) and its
    tokens are read from the target's own LM-head blocks (exactly the target's logits on them); greedy output is
    still the target's own."""
    from specdec_cli.drafters.eagle_head import head_on_blocks
    from specdec_cli.target_model.native.quant import BlockLinear

    head, _ = trained
    model = _block_target(tiny_llama, mode)
    assert isinstance(model.lm_head, BlockLinear)
    check_target(target_info(model, IdsTokenizer(64)))
    assert model.lm_head._dense is None  # checking the target unpacked no float32 copy of its LM head
    blocked = head_on_blocks(copy.deepcopy(head))
    assert isinstance(blocked.qkv, BlockLinear) and isinstance(blocked.fuse, BlockLinear)
    torch.manual_seed(1)
    features, embedded = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
    with torch.inference_mode():
        dense_out, block_out = head(features, embedded, torch.arange(5)), blocked(features, embedded, torch.arange(5))
    assert not torch.equal(dense_out, block_out)
    assert torch.allclose(dense_out, block_out, atol=0.05 * float(dense_out.abs().max()))

    drafter = EagleDrafter(copy.deepcopy(head), target_weights(model), head_tokens=[3, 9, 7],
                           eos_token_ids=(TINY_EOS,))
    assert drafter.vocabulary.on_blocks and isinstance(drafter.head.down, BlockLinear)
    drafter.vocabulary.extend([9, 40, 2])
    assert drafter.vocabulary.ids.tolist() == [3, 7, 9, 2, 40]
    rows = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(drafter.vocabulary.logits(rows), model.lm_head(rows)[:, drafter.vocabulary.ids])
    drafter.vocabulary.PENDING_MAX = 3  # the context's tokens wait apart, then are folded in by one repacking
    drafter.vocabulary.extend([11])
    assert drafter.vocabulary.pending_ids.tolist() == [2, 40, 11]
    drafter.vocabulary.extend([12, 3])
    assert drafter.vocabulary.pending_ids.tolist() == [] and drafter.vocabulary.ids.tolist() == [3, 7, 9, 2, 40, 11, 12]
    with torch.inference_mode():
        assert torch.equal(drafter.vocabulary.logits(rows), model.lm_head(rows)[:, drafter.vocabulary.ids])

    drafter = EagleDrafter(copy.deepcopy(head), target_weights(model),
                           eos_token_ids=(TINY_EOS,))
    assert model.lm_head._dense is None  # nor did building drafters
    accepted = 0
    for prompt in [[1, *PATTERN], *PROMPTS]:
        generation = fixed_engine(model).generate(prompt, drafter, GenerationConfig(max_new_tokens=32,
                                                                                 eos_token_ids=(TINY_EOS,)))
        assert generation.tokens == hf_greedy(model, prompt, 32), prompt
        accepted += generation.stats.accepted_tokens
    assert accepted > 0


@pytest.mark.slow
def test_eagle_sampling_keeps_the_target_law(tiny_llama, trained):
    from specdec_cli.decoding.sampling import warp_probs

    head, _ = trained
    prompt = PROMPTS[0]
    with torch.inference_mode():
        first = warp_probs(tiny_llama(torch.tensor([prompt])).logits[0, -1], 1.0)  # [V]
        second = warp_probs(tiny_llama(torch.tensor([prompt + [t] for t in range(64)])).logits[:, -1], 1.0)
    law = (first.unsqueeze(1) * second).sum(0).double()  # P(2nd new token)
    engine = fixed_engine(tiny_llama)
    counts = torch.zeros(64, dtype=torch.float64)
    for seed in range(400):
        drafter = EagleDrafter(copy.deepcopy(head), target_weights(tiny_llama))
        config = GenerationConfig(max_new_tokens=3, temperature=1.0, seed=seed)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


def test_a_head_for_another_tokenizer_or_width_is_refused(tiny_llama, trained, tmp_path):
    head, _ = trained
    info = target_info(tiny_llama, IdsTokenizer(64))
    save_head(tmp_path / "foreign", head, {"fingerprint": "someone-else", "vocab_size": 64, "head_tokens": None})
    with pytest.raises(SpecdecError, match="another tokenizer"):
        load_head(tmp_path / "foreign", info)
    save_head(tmp_path / "ok", head, {"fingerprint": info.fingerprint, "vocab_size": 64, "head_tokens": None})
    from dataclasses import replace

    with pytest.raises(SpecdecError, match="features"):
        load_head(tmp_path / "ok", replace(info, hidden_size=128))
    (tmp_path / "ok" / "head.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SpecdecError, match="cannot load"):
        load_head(tmp_path / "ok", info)


def test_the_cli_refuses_a_missing_or_foreign_head_directory(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for folder, message in ((tmp_path / "nothing", "no such directory"), (tmp_path / "model", "not an EAGLE head")):
        result = invoke("chat", "--prompt", "hi", "--drafter", "eagle", "--draft-model", str(folder))
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr


def _cut_training(model, tmp_path, config, phase: str, done: int):
    """(sequences, the head of an uninterrupted run) after a run with `config` stopped (Ctrl-C) when `phase`
    reached `done`, checkpointed in tmp_path / "cut"."""
    from specdec_cli.distill.eagle_train import train_eagle

    sequences = [prompt + hf_greedy(model, prompt, 24) for prompt in ([1, *PATTERN], *PROMPTS)] * 2
    whole, _ = train_eagle(model, sequences, config, checkpoint_dir=tmp_path / "whole")

    def stop(update) -> None:
        if update.phase == phase and update.done == done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_eagle(model, sequences, config, stop, checkpoint_dir=tmp_path / "cut")
    return sequences, whole


def test_an_interrupted_training_resumes_to_the_same_head(tiny_llama, tmp_path):
    from specdec_cli.distill.eagle_train import EagleTrainConfig, train_eagle

    config = EagleTrainConfig(steps=14, lr=3e-3, head_vocab=0, holdout=0.2, save_every=5)
    sequences, whole = _cut_training(tiny_llama, tmp_path, config, "train", 8)
    with pytest.raises(SpecdecError, match="other settings"):
        train_eagle(tiny_llama, sequences, EagleTrainConfig(steps=14, lr=1e-3, head_vocab=0, holdout=0.2),
                    checkpoint_dir=tmp_path / "cut", resume=True)
    with pytest.raises(SpecdecError, match="other settings"):
        train_eagle(tiny_llama, sequences, dataclasses.replace(config, head_mlp=16), checkpoint_dir=tmp_path / "cut",
                    resume=True)
    with pytest.raises(SpecdecError, match="data changed"):
        train_eagle(tiny_llama, sequences[1:], config, checkpoint_dir=tmp_path / "cut", resume=True)
    state_file = tmp_path / "cut" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["mlp_width"] == tiny_llama.config.intermediate_size
    state_file.write_text(json.dumps({**state, "mlp_width": 2 * state["mlp_width"]}))  # (made to another width)
    with pytest.raises(SpecdecError, match="start again without --resume"):
        train_eagle(tiny_llama, sequences, config, checkpoint_dir=tmp_path / "cut", resume=True)
    state_file.write_text(json.dumps({key: value for key, value in state.items() if key != "mlp_width"}))
    computed = []
    resumed, result = train_eagle(tiny_llama, sequences, config, lambda update: computed.append(update.phase),
                                  checkpoint_dir=tmp_path / "cut", resume=True)
    assert result["report"]["resumed_from"] == 8
    assert "features" not in computed  # read from the interrupted run's store, not computed again
    assert (tmp_path / "cut.features" / "features.json").is_file()
    for (name, value), other in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(value, other), name  # the same pieces, moments and steps: the same head, bit for bit


def test_a_training_stopped_in_its_features_goes_on_from_them(tiny_llama, tmp_path, monkeypatch):
    """Ctrl-C while the target's features are computed (before any checkpoint): `--resume` starts training from
    step 0, the features computed so far read back and the rest computed, and the head is the one an uninterrupted
    run trains, bit for bit."""
    from specdec_cli.distill import feature_store
    from specdec_cli.distill.eagle_train import EagleTrainConfig, train_eagle

    monkeypatch.setattr(feature_store, "RECORD_SECONDS", 0.0)  # every piece recorded as it is computed
    config = EagleTrainConfig(steps=6, lr=3e-3, head_vocab=0, holdout=0.2, max_len=12)
    sequences, whole = _cut_training(tiny_llama, tmp_path, config, "features", 3)
    computed, notes = [], []
    resumed, _ = train_eagle(tiny_llama, sequences, config, lambda update: computed.append(update),
                             checkpoint_dir=tmp_path / "cut", resume=True, on_status=notes.append)
    assert any("No checkpoint" in note for note in notes)
    assert [update.done for update in computed if update.phase == "features"][0] == 3  # the first two were kept
    for (name, value), other in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(value, other), name


def test_writing_a_head_never_replaces_a_foreign_directory(trained, tmp_path):
    head, _ = trained
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(SpecdecError, match="not an EAGLE head directory"):
        save_head(tmp_path / "notes", head, {"fingerprint": "x", "vocab_size": 64, "head_tokens": None})
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    save_head(tmp_path / "head", head, {"fingerprint": "x", "vocab_size": 64, "head_tokens": None})
    save_head(tmp_path / "head", head, {"fingerprint": "y", "vocab_size": 64, "head_tokens": None})  # a head: replaced


def test_evaluating_a_head_reports_what_training_bought(tiny_llama, trained, tmp_path):
    from specdec_cli.distill.eagle_evaluate import evaluate_head
    from specdec_cli.files import read_json
    from specdec_cli.texts.prompts import Conversation

    head, result = trained
    info = target_info(tiny_llama, IdsTokenizer(64))
    save_head(tmp_path / "head", head, {"fingerprint": info.fingerprint, "vocab_size": 64, "head_tokens": None,
                                        "report": result["report"]})
    prompts = [Conversation(str(number), category, (), prompt_ids=tuple(ids))  # tokenized already: no text needed
               for number, (ids, category) in enumerate([([1, *PATTERN], "copy"), (PROMPTS[0], "other"),
                                                         (PROMPTS[1], "other")])]
    evaluation = evaluate_head(tiny_llama, IdsTokenizer(64), "tiny", str(tmp_path / "head"), prompts, max_new_tokens=24)
    before, after, chain = evaluation["before"], evaluation["after"], evaluation["after_chain"]
    assert chain["prompts"] == 3 and after["positions"] == before["positions"] > 0
    # the teacher-forced agreement along the answers and the real acceptance both show what training bought
    assert after["agreement"] > before["agreement"] + 0.2, (before, after)
    assert after["mean_accepted_tokens"] > before["mean_accepted_tokens"]
    assert after["mean_accepted_tokens"] >= chain["mean_accepted_tokens"] - 0.05  # trees keep at least as much
    assert chain["per_position_acceptance"] and 0 <= chain["per_position_acceptance"][0] <= 1
    assert read_json(tmp_path / "head" / "distill_report.json")["evaluation"]["after"] == after


def test_unrolling_deeper_trains_on_more_of_the_heads_own_predictions(tiny_llama):
    """unroll 1 is teacher forcing alone; each further step adds a loss on the head's own predicted features, so
    from the same start the first step's loss grows with the depth; a resumed run must keep the depth."""
    from specdec_cli.distill.eagle_train import EagleTrainConfig, train_eagle

    sequences = [prompt + hf_greedy(tiny_llama, prompt, 24) for prompt in ([1, *PATTERN], *PROMPTS)]
    first_losses = []
    for depth in (1, 2, 3):
        _, result = train_eagle(tiny_llama, sequences, EagleTrainConfig(steps=2, head_vocab=0, holdout=0.2,
                                                                         unroll=depth))
        first_losses.append(result["report"]["loss_history"][0])
    assert first_losses[0] < first_losses[1] < first_losses[2]
    with pytest.raises(SpecdecError, match="unroll must be in 1..8"):
        EagleTrainConfig(unroll=0).check()


def test_a_narrower_head_trains_drafts_and_reloads_at_its_width(tiny_llama, tmp_path):
    """--head-mlp sizes the head's MLP (the drafting cost's largest part); the width travels in its files, a
    resumed run must keep it, and the head drafts losslessly."""
    from specdec_cli.distill.eagle_train import EagleTrainConfig, train_eagle

    sequences = [prompt + hf_greedy(tiny_llama, prompt, 24) for prompt in ([1, *PATTERN], *PROMPTS)]
    head, result = train_eagle(tiny_llama, sequences, EagleTrainConfig(steps=30, lr=3e-3, head_vocab=0, holdout=0.2,
                                                                       head_mlp=24))
    assert head.config.intermediate_size == 24 != tiny_llama.config.intermediate_size
    assert head.down.weight.shape == (tiny_llama.config.hidden_size, 24)
    info = target_info(tiny_llama, IdsTokenizer(64))
    save_head(tmp_path / "head", head, {"fingerprint": info.fingerprint, "vocab_size": 64, "head_tokens": None})
    loaded, _ = load_head(tmp_path / "head", info)
    assert loaded.config.intermediate_size == 24
    drafter = EagleDrafter(loaded, target_weights(tiny_llama), eos_token_ids=(TINY_EOS,))
    for prompt in PROMPTS:
        generation = fixed_engine(tiny_llama).generate(prompt, drafter, GenerationConfig(max_new_tokens=24,
                                                                                        eos_token_ids=(TINY_EOS,)))
        assert generation.tokens == hf_greedy(tiny_llama, prompt, 24)
    with pytest.raises(SpecdecError, match="head_mlp must be >= 0"):
        EagleTrainConfig(head_mlp=-1).check()


def test_a_heads_default_mlp_is_the_targets_at_most_twice_its_hidden_size():
    from types import SimpleNamespace

    from specdec_cli.drafters.eagle_head import MLP_PER_HIDDEN

    def width(mlp, **config):
        return head_config_for(SimpleNamespace(num_attention_heads=4, **config), mlp).intermediate_size

    assert MLP_PER_HIDDEN == 2
    assert width(0, hidden_size=896, intermediate_size=4864) == 1792  # Qwen2.5-0.5B's shape
    assert width(0, hidden_size=576, intermediate_size=1536) == 1152  # SmolLM2-135M's
    assert width(0, hidden_size=64, intermediate_size=100) == 100  # narrower than the cap: the target's
    assert width(4864, hidden_size=896, intermediate_size=4864) == 4864  # given: as given
