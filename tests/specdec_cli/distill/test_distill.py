"""`specdec distill` on tiny models: generate, train (loss falls, resume continues), evaluate, use the draft.

The target is the conftest tiny Llama saved with a character-level tokenizer built here (64 ids, a chat
template), so `--target DIR` works offline like a real model directory.
"""

from __future__ import annotations

import json

import pytest
from conftest import TINY_EOS, TINY_VOCAB, _tiny, assert_one_line_error, hf_greedy, invoke
from helpers import DISTILL_PROMPTS, make_tokenizer


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-target")
    tokenizer = make_tokenizer()
    assert len(tokenizer) == TINY_VOCAB and tokenizer.eos_token_id == TINY_EOS
    model = _tiny("llama")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def target(target_dir):
    from specdec_cli.target_model.load.models import load_target

    return load_target(str(target_dir), "cpu", "float32")


@pytest.fixture(scope="module")
def data_file(target_dir, tmp_path_factory):
    """Four answers written by `specdec distill generate` (the CLI), then a rerun that adds nothing."""
    folder = tmp_path_factory.mktemp("data")
    prompts = folder / "prompts.txt"
    prompts.write_text("\n".join(DISTILL_PROMPTS[:4]) + "\n")
    data = folder / "data.jsonl"
    result = invoke("distill", "generate", "--target", str(target_dir), "--prompts", str(prompts), "-o", str(data),
                    "--max-new-tokens", "24")
    assert result.returncode == 0, result.stderr
    rerun = invoke("distill", "generate", "--target", str(target_dir), "--prompts", str(prompts), "-o", str(data),
                   "--max-new-tokens", "24", "--drafter", "none")
    assert rerun.returncode == 0, rerun.stderr
    assert "0 new rows" in rerun.stderr and "4 already answered" in rerun.stderr
    return data


def _config(**changes):
    from specdec_cli.distill.train import TrainConfig

    values = dict(layers=1, steps=12, batch_size=2, lr=3e-3, holdout=0.25, save_every=0, seed=1)
    values.update(changes)
    return TrainConfig(**values)


def test_generated_rows(data_file, target):
    from specdec_cli.texts.fingerprint import tokenizer_fingerprint

    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == DISTILL_PROMPTS[:4]
    for row in rows:
        assert row["fingerprint"] == tokenizer_fingerprint(target.tokenizer)
        assert row["answer_ids"] and row["prompt_ids"]
        assert len(row["answer_ids"]) <= 24
        assert row["answer"] == target.tokenizer.decode(row["answer_ids"], skip_special_tokens=True)
        # the answer is the target's own greedy continuation of the prompt
        assert row["answer_ids"] == hf_greedy(target.model, row["prompt_ids"], 24)
        assert row["target"].endswith(target.name)
        assert {"category", "finish_reason", "temperature"} <= set(row)


def test_generate_resumes_after_a_torn_row(data_file, target, tmp_path):
    from specdec_cli.distill.generate import generate_data, read_rows
    from specdec_cli.texts.prompts import Conversation

    data = tmp_path / "torn.jsonl"
    lines = data_file.read_text().splitlines()
    data.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # a crash in the middle of row 2
    assert len(read_rows(str(data))) == 1
    items = [Conversation(str(number), "prompts", (text,)) for number, text in enumerate(DISTILL_PROMPTS[:3], start=1)]
    summary = generate_data(target.model, target.tokenizer, "tiny", items, str(data), max_new_tokens=24)
    assert (summary.written, summary.skipped, summary.rows) == (2, 1, 3)
    assert [row["prompt"] for row in read_rows(str(data))] == DISTILL_PROMPTS[:3]


def test_train_evaluate_and_use_the_draft(data_file, target, target_dir, tmp_path):
    from specdec_cli.distill.evaluate import evaluate_draft, prompts_from_data
    from specdec_cli.distill.train import train_draft

    out = tmp_path / "draft"
    result = train_draft(target.model, target.tokenizer, str(target_dir), str(data_file), str(out), _config())
    assert result.steps == 12 and (result.train_rows, result.held_out_rows) == (3, 1)
    losses = [entry[1] for entry in result.history]
    assert sum(losses[-3:]) / 3 < losses[0] - 0.05, losses
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
                 "specdec_draft.json", "distill_report.json"):
        assert (out / name).is_file(), name
    assert not list(tmp_path.glob(".draft.specdec-tmp-*"))
    meta = json.loads((out / "specdec_draft.json").read_text())
    assert meta["fingerprint"].startswith("sha256:") and meta["layers"] == 1

    prompts = prompts_from_data(str(data_file), 0.25, meta["fingerprint"])
    assert len(prompts) == 1
    evaluation = evaluate_draft(target.model, target.tokenizer, str(target_dir), str(out), prompts, max_new_tokens=16)
    for label in ("before", "after"):
        score = evaluation[label]
        assert 0.0 <= score["agreement"] <= 1.0 and score["mean_accepted_tokens"] >= 1.0
        assert score["positions"] > 0
    report = json.loads((out / "distill_report.json").read_text())
    assert report["evaluation"]["after"]["agreement"] == evaluation["after"]["agreement"]
    assert report["training"]["steps"] == 12

    # the CLI's chat with --drafter model gives the plain greedy output
    text = "what is a cat?"
    templated = target.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                     add_generation_prompt=True)
    ids = target.tokenizer(templated, add_special_tokens=False)["input_ids"]
    chat = invoke("chat", "--target", str(target_dir), "--drafter", "model", "--draft-model", str(out), "--prompt",
                  text,
                  "--max-new-tokens", "30", "--json", "--device", "cpu")
    assert chat.returncode == 0, chat.stderr
    payload = json.loads(chat.stdout)
    assert payload["output_token_ids"] == hf_greedy(target.model, ids, 30)
    assert payload["prompt_tokens"] == len(ids)


def test_resume_continues_the_run(data_file, target, target_dir, tmp_path):
    from specdec_cli.distill.train import train_draft

    straight = train_draft(target.model, target.tokenizer, "t", str(data_file), str(tmp_path / "a"), _config(steps=6))

    def interrupt(progress):
        if progress.step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_draft(target.model, target.tokenizer, "t", str(data_file), str(tmp_path / "b"), _config(steps=6),
                    on_progress=interrupt)
    state = json.loads((tmp_path / "b.checkpoint" / "state.json").read_text())
    assert state["step"] == 3 and not (tmp_path / "b").exists()
    resumed = train_draft(target.model, target.tokenizer, "t", str(data_file), str(tmp_path / "b"), _config(steps=6),
                          resume=True)
    assert resumed.resumed_from == 3 and resumed.steps == 6
    assert [entry[0] for entry in resumed.history] == [1, 2, 3, 4, 5, 6]
    straight_losses = [entry[1] for entry in straight.history]
    resumed_losses = [entry[1] for entry in resumed.history]
    assert resumed_losses == pytest.approx(straight_losses, abs=2e-3)

    from specdec_cli.errors import SpecdecError

    with pytest.raises(SpecdecError, match="other settings"):
        train_draft(target.model, target.tokenizer, "t", str(data_file), str(tmp_path / "b"), _config(steps=6, lr=1e-2),
                    resume=True)


def test_kd_config_init_and_small_head(data_file, target, tmp_path):
    from specdec_cli.distill.evaluate import evaluate_draft, tokenized
    from specdec_cli.distill.train import train_draft
    from specdec_cli.texts.prompts import Conversation

    out = tmp_path / "kd"
    result = train_draft(target.model, target.tokenizer, "t", str(data_file), str(out),
                         _config(steps=4, kd_weight=1.0, kd_loss="tvd", init="config", hidden=32, layers=1,
                                 draft_vocab=24))
    assert result.steps == 4 and all(entry[2] is not None for entry in result.history)
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] == 32 and config["vocab_size"] == TINY_VOCAB
    meta = json.loads((out / "specdec_draft.json").read_text())
    assert len(meta["head_tokens"]) == 24 and TINY_EOS in meta["head_tokens"]
    prompts = tokenized(target.tokenizer, [Conversation("5", "prompts", (DISTILL_PROMPTS[4],))])
    evaluation = evaluate_draft(target.model, target.tokenizer, "t", str(out), prompts, max_new_tokens=12)
    assert evaluation["settings"]["head_tokens"] == 24
    assert evaluation["before"]["positions"] == evaluation["after"]["positions"] > 0


def test_data_errors(target_dir, data_file, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    train = ("distill", "train", "-o", str(tmp_path / "x"), "--data")
    assert_one_line_error(invoke(*train, str(empty)), "no rows", code=1)
    assert_one_line_error(invoke(*train, str(tmp_path / "missing.jsonl")), "no such data file", code=1)
    other = tmp_path / "other.jsonl"
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    other.write_text("".join(json.dumps({**row, "fingerprint": "sha256:0000000000000000",
                                         "target": "other-model"}) + "\n"
                             for row in rows))
    assert_one_line_error(invoke(*train, str(other), "--target", str(target_dir)),
                          "generated by target 'other-model'", code=1)
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text(json.dumps({**rows[0], "answer_ids": ["not", "ids"]}) + "\n")
    assert_one_line_error(invoke(*train, str(garbled)), "line 1: prompt_ids and answer_ids must be lists of token ids",
                          code=1)
    garbled.write_text(json.dumps({"prompt": "hi", "answer": "hello"}) + "\n")
    assert_one_line_error(invoke(*train, str(garbled)), "line 1: not a distillation row (no prompt_ids and answer_ids)",
                          code=1)


def test_vocabulary_mismatch_in_chat(target_dir, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    draft = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    draft.save_pretrained(tmp_path / "wrong")
    make_tokenizer().save_pretrained(tmp_path / "wrong")  # same tokenizer, wrong head size
    result = invoke("chat", "--target", str(target_dir), "--drafter", "model", "--draft-model",
                    str(tmp_path / "wrong"),
                    "--prompt", "hi", "--device", "cpu")
    assert_one_line_error(result, "vocabulary of 80 tokens but the target has 64", code=1)


def test_other_tokenizer_is_refused(target, tmp_path):
    from specdec_cli.drafters import DrafterOptions, make_drafter, target_info
    from specdec_cli.errors import SpecdecError

    folder = tmp_path / "other-tokenizer"
    _tiny("llama").save_pretrained(folder)
    other = make_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<x0>"]})  # same size, other special tokens
    other.save_pretrained(folder)
    with pytest.raises(SpecdecError, match="another tokenizer") as caught:
        make_drafter("model", DrafterOptions(draft_model=str(folder)), target_info(target.model, target.tokenizer))
    assert "draft" in str(caught.value) and "target" in str(caught.value)


def test_a_signal_inside_a_training_update_arrives_after_it():
    import os
    import signal

    from specdec_cli.distill.checkpoints import whole_step

    done = []
    with pytest.raises(KeyboardInterrupt):
        with whole_step():
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of an update
            done.append("rest of the update")
    assert done == ["rest of the update"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers back as they were
    with whole_step():
        done.append("a quiet update")
    assert len(done) == 2


def test_an_eagle_head_from_the_command_line_trains_resumes_and_is_evaluated(target_dir, data_file, tmp_path):
    import json

    head, prompts = tmp_path / "head", tmp_path / "held-out.txt"
    prompts.write_text("\n".join(DISTILL_PROMPTS[4:]) + "\n")
    train = ("distill", "train", "--kind", "eagle", "--data", str(data_file), "-o", str(head), "--steps", "6",
             "--holdout", "0.25")
    result = invoke(*train)
    assert result.returncode == 0, result.stderr
    assert "Trained an EAGLE head: 6 steps" in result.stderr and (tmp_path / "head.checkpoint").is_dir()
    assert not (tmp_path / "head.checkpoint.features").exists()  # the features go once the head is written
    again = invoke(*train[:-4], "--steps", "8", "--holdout", "0.25", "--resume")  # a longer run, continued
    assert again.returncode == 0 and "Resuming from step 6" in again.stderr, again.stderr
    other = "--answers-only" if json.loads((head / "distill_report.json").read_text())["config"]["prompt_loss"] \
        else "--prompt-loss"
    refused = invoke(*train[:-4], "--steps", "8", "--holdout", "0.25", "--resume", other)
    assert refused.returncode != 0 and "other settings" in refused.stderr, refused.stderr
    evaluated = invoke("distill", "evaluate", "--draft-model", str(head), "--prompts", str(prompts), "-n", "12",
                       "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    evaluation = json.loads(evaluated.stdout)
    assert set(evaluation) >= {"before", "after", "after_chain"} and evaluation["prompts"] == 1
    assert evaluation["after"]["new_tokens"] == evaluation["before"]["new_tokens"] > 0
    foreign = invoke("distill", "evaluate", "--draft-model", str(head), "--data", str(data_file))
    assert foreign.returncode != 0 and "evaluated on --suite or --prompts" in foreign.stderr
    assert "Traceback" not in foreign.stderr


def test_an_eagle3_head_from_the_command_line_is_written_in_the_published_layout(target_dir, data_file, tmp_path):
    """`--kind eagle3`: trained, resumed and evaluated like specdec's own head; written as EAGLE-3 checkpoints are
    published (config.json that transformers reads, midlayer.* tensors, d2t, t2d; no pickle); it loads with
    `--drafter eagle --draft-model DIR` and drafting with it leaves greedy answers as plain decoding's; a later run
    may replace it, a downloaded checkpoint never."""
    import json

    import torch
    from safetensors import safe_open
    from transformers import AutoConfig

    head, prompts = tmp_path / "head3", tmp_path / "held-out.txt"
    prompts.write_text("\n".join(DISTILL_PROMPTS[4:]) + "\n")
    train = ("distill", "train", "--kind", "eagle3", "--data", str(data_file), "-o", str(head), "--steps", "6",
             "--holdout", "0.25", "--draft-vocab", "48")
    result = invoke(*train)
    assert result.returncode == 0, result.stderr
    assert "Trained an EAGLE-3 head: 6 steps" in result.stderr, result.stderr
    assert not (tmp_path / "head3.checkpoint.features").exists()
    again = invoke(*train[:-6], "--steps", "8", "--holdout", "0.25", "--draft-vocab", "48", "--resume")
    assert again.returncode == 0 and "Resuming from step 6" in again.stderr, again.stderr
    assert sorted(path.name for path in head.iterdir()) == ["config.json", "distill_report.json", "model.safetensors"]
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 48
    assert AutoConfig.from_pretrained(head).hidden_size == config["hidden_size"]
    with safe_open(str(head / "model.safetensors"), framework="pt") as weights:
        names = set(weights.keys())
        d2t, t2d = weights.get_tensor("d2t"), weights.get_tensor("t2d")
    assert {"fc.weight", "norm.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight",
            "midlayer.mlp.down_proj.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight"} <= names
    draft_ids = torch.arange(48) + d2t
    assert int(t2d.sum()) == 48 and bool(t2d[draft_ids].all()) and len(set(draft_ids.tolist())) == 48
    report = json.loads((head / "distill_report.json").read_text())
    assert report["kind"] == "eagle3" and report["steps"] == 8 and report["fingerprint"]
    evaluated = invoke("distill", "evaluate", "--draft-model", str(head), "--prompts", str(prompts), "-n", "12",
                       "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    evaluation = json.loads(evaluated.stdout)
    assert set(evaluation) >= {"before", "after", "after_chain"} and evaluation["prompts"] == 1
    for prompt in DISTILL_PROMPTS:
        compared = invoke("chat", "--target", str(target_dir), "-p", prompt, "-n", "16", "--drafter", "eagle",
                          "--draft-model", str(head), "--compare", "--json")
        assert compared.returncode == 0, compared.stderr
        payload = json.loads(compared.stdout)
        assert payload["identical"] and payload["speculative"]["output_token_ids"], payload
    assert invoke(*train[:-6], "--steps", "2", "--draft-vocab", "48").returncode == 0  # its own head: replaced
    published = tmp_path / "published"
    published.mkdir()
    for name in ("config.json", "model.safetensors"):
        (published / name).write_bytes((head / name).read_bytes())
    refused = invoke("distill", "train", "--kind", "eagle3", "--data", str(data_file), "-o", str(published))
    assert_one_line_error(refused, "is not an EAGLE-3 head `specdec distill` trained", code=1)


def test_a_student_is_cut_from_block_weights_dequantised(target_dir, data_file, tmp_path):
    """`--weights int8` (any block weights): the student starts from the target as it runs, its blocks
    dequantised (they are not in the state dict), and trains against it."""
    import torch

    from specdec_cli.distill.student import build_student
    from specdec_cli.distill.train import train_draft
    from specdec_cli.target_model.load.models import load_target
    from specdec_cli.target_model.native.quant import BlockLinear

    blocks = load_target(str(target_dir), "cpu", "float32", weights="int8")
    layer = blocks.model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, BlockLinear)
    student = build_student(blocks.model, {"kind": "target", "layers": 1})
    assert torch.equal(student.model.layers[0].self_attn.q_proj.weight, layer.blocks().dense())
    assert torch.equal(student.lm_head.weight, blocks.model.lm_head.blocks().dense())  # the head as it runs
    result = train_draft(blocks.model, blocks.tokenizer, str(target_dir), str(data_file), str(tmp_path / "draft"),
                         _config(steps=2, kd_weight=1.0))
    assert result.steps == 2


def test_no_progress_bars_where_stderr_is_not_a_terminal(target_dir, data_file, tmp_path):
    """A log or a pipe gets the results, not the frames of a progress bar (nor its last frame)."""
    result = invoke("distill", "train", "--data", str(data_file), "-o", str(tmp_path / "draft"), "--steps", "2",
                    "--layers", "1")
    assert result.returncode == 0, result.stderr
    trained = [line for line in result.stderr.splitlines() if line.startswith("Trained 2 steps")]
    assert len(trained) == 1 and trained[0].endswith(f"saved {tmp_path / 'draft'}"), result.stderr  # one line
    assert "━" not in result.stderr and "Training" not in result.stderr.replace("Trained", ""), result.stderr
    assert "Building the student" not in result.stderr


def test_train_refuses_an_output_that_is_a_file_before_loading_the_target(data_file, tmp_path):
    """The output is checked before the model loads: an unreadable target is never reached."""
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    assert_one_line_error(invoke("distill", "train", "--data", str(data_file), "-o", str(existing), "--target",
                                 str(broken)), "exists and is not a directory", code=1)
    assert existing.read_text() == "mine"
    head_output = invoke("distill", "train", "--kind", "eagle", "--data", str(data_file), "-o", str(existing),
                         "--target", str(broken))
    assert_one_line_error(head_output, "exists and is not a directory", code=1)
    features = tmp_path / "head.checkpoint.features"  # where a head's features would be kept while it trains
    features.mkdir()
    (features / "keep.txt").write_text("mine")
    for kind in ("eagle", "eagle3"):
        refused = invoke("distill", "train", "--kind", kind, "--data", str(data_file), "-o", str(tmp_path / "head"),
                         "--target", str(broken))
        assert_one_line_error(refused, "is not a folder of features specdec computed", code=1)
    assert (features / "keep.txt").read_text() == "mine"


def test_distill_takes_weights_like_every_command(target_dir, tmp_path):
    for command in (["distill"], ["distill", "generate", "--prompts", "x", "-o", str(tmp_path / "d.jsonl")],
                    ["distill", "train", "--data", "x", "-o", str(tmp_path / "o")],
                    ["distill", "evaluate", "-D", str(tmp_path)]):
        result = invoke(*command, "--target", str(target_dir), "--weights", "int3")
        assert result.returncode != 0 and "No such option" not in result.stderr, (command, result.stderr)


def test_the_pipeline_checks_where_it_writes_before_loading_the_target(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    missing = tmp_path / "missing"
    assert_one_line_error(invoke("distill", "-o", str(missing / "draft"), "--target", str(broken)),
                          f"--output {missing / 'draft'}: the folder {missing} does not exist", code=1)
    (tmp_path / "data-folder").mkdir()
    assert_one_line_error(invoke("distill", "-o", str(tmp_path / "draft"), "--data", str(tmp_path / "data-folder"),
                                 "--target", str(broken)), "is a directory", code=1)
    assert not (tmp_path / "missing").exists()


def test_an_interrupted_evaluation_of_the_pipeline_says_the_draft_is_kept(target_dir, tmp_path, monkeypatch):
    """Ctrl-C in `distill`'s third stage: the draft trained in the second is saved, and the line says where (it
    said only "interrupted")."""
    import signal

    from specdec_cli.distill import evaluate

    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # through the command line's handler, as a user's Ctrl-C

    monkeypatch.setattr(evaluate, "evaluate_draft", interrupted)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(DISTILL_PROMPTS[:2]) + "\n")
    out = tmp_path / "draft"
    result = invoke("distill", "--target", str(target_dir), "-o", str(out), "--prompts", str(prompts),
                    "--eval-prompts", str(prompts), "--max-new-tokens", "8", "--layers", "1", "--steps", "2",
                    "--device", "cpu")
    assert result.returncode == 130, result.stderr
    assert (out / "model.safetensors").is_file()
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"specdec: error: interrupted while evaluating the draft; the trained draft is saved in {out} "
                    f"(`specdec distill evaluate -D {out}` scores it)")


def test_a_heads_pipeline_answers_both_training_suites_whole_twice():
    """`--kind eagle` by default: every prompt of the `distill` suite and of the standard library's (a head needs
    far more answers than a student), two passes; a student keeps the `distill` suite's first 200, six passes."""
    from specdec_cli.cli.distill_stages import HeadStages, StudentStages
    from specdec_cli.texts.prompts import load_prompts, load_suite

    every = load_suite("distill") + load_suite("library")
    chosen = load_prompts(None, HeadStages.pipeline_suite, first_turns=True, max_prompts=HeadStages.pipeline_prompts)
    assert [c.id for c in chosen] == [c.id for c in every] and len(chosen) > 1000
    assert (HeadStages.pipeline_epochs, StudentStages.pipeline_epochs) == (2.0, 6.0)
    assert StudentStages.pipeline_suite == "distill"
