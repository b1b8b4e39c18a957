"""Block weights in the engine: specdec's native decoder computes what transformers' forward computes on the same
block layers, every drafter's greedy output equals plain decoding (chains and trees, native decoder or
transformers' forward), sampling keeps the model's law, and the KV cache rolls back like a DynamicCache."""

from __future__ import annotations

import pytest
import torch
from conftest import chi_square, fixed_engine
from helpers import (
    EOS,
    GGUF_FAMILIES,
    OWN_LOADER,
    PROMPTS,
    LikelyTree,
    family_drafter,
    family_model,
    second_token_law,
    tree_path,
    write_family_gguf,
)

from specdec_cli import kernels
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.drafters.none import NoDrafter
from specdec_cli.errors import SpecdecError
from specdec_cli.target_model.load import converted_blocks
from specdec_cli.target_model.native import native, native_support, quant
from specdec_cli.target_model.native.kv_cache import KVCache, transformers_kv_cache
from specdec_cli.target_model.verify.exact_setup import NativeForward

pytestmark = pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")

NEW = 32


def _blocks(family: str, mode: str, seed: int = 11, **settings):
    model = family_model(family, seed=seed, **settings)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, mode, None))
    return model

def _config(**settings) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": NEW, "draft_max": 7, "eos_token_ids": (EOS,), **settings})


# every family docs/models.md lists, on 4-bit or 8-bit blocks made on load (the GGUF tests below: a file's own)
BLOCK_FAMILIES = [("llama", "int4"), ("mistral", "int8"), ("qwen2", "int8"), ("qwen3", "int4"), ("phi3", "int4"),
                  ("smollm3", "int8"), ("gemma", "int4"), ("gemma2", "int8"), ("gemma3_text", "int4")]
# Logits against transformers' forward on the same block layers: the kernels round activations to 8 bits, so a
# summation-order difference upstream now and then moves an activation by one code (~1% of a logit's scale)
TOLERANCE = 2e-2
LONG = 40  # a prompt longer than ROW_INVARIANT_ROWS (the prefill's own attention) and than the windows


def _sequence(length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [1, *torch.randint(4, 64, (length - 1,), generator=generator).tolist()]


def _assert_greedy(model, prompt: list[int], answer: list[int], tolerance: float = TOLERANCE) -> None:
    """The answer is transformers' greedy decoding on the same layers: each token its argmax after the tokens before
    it, or within rounding of it: a near-tie that summation order may decide either way, by as much as the logits
    may differ (TOLERANCE of their scale: one activation code moved by an 8-bit rounding upstream)."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1]  # [answer, V]
    best = logits.max(dim=-1).values
    chosen = logits.gather(1, torch.tensor(answer)[:, None])[:, 0]
    assert bool((chosen >= best - tolerance * logits.abs().amax(dim=-1)).all()), (model.config.model_type, answer)
    assert EOS not in answer[:-1] and (len(answer) == NEW or answer[-1] == EOS)


@pytest.mark.parametrize("family,mode", BLOCK_FAMILIES)
def test_the_native_decoder_computes_what_transformers_computes(family, mode):
    """A short prompt (the row-invariant kernel), a long one (the prefill's attention), then one-row steps and a
    4-row block on its cache: logits and hidden states as transformers' forward on the same block layers."""
    model = _blocks(family, mode)
    assert native_support.unsupported(model) is None
    decoder = native.decoder_for(model)
    sequence = _sequence(LONG + 6)
    with torch.inference_mode():
        reference = model(torch.tensor([sequence]), output_hidden_states=True)  # [1, n, V]
        scale = float(reference.logits.abs().max())
        for prompt in (PROMPTS[1], sequence[:LONG]):
            ids = torch.tensor([prompt])
            positions = torch.arange(ids.shape[1])[None]
            want = model(input_ids=ids, position_ids=positions, past_key_values=transformers_kv_cache(), use_cache=True,
                         output_hidden_states=True)
            cache = transformers_kv_cache()
            ours = decoder(input_ids=ids, position_ids=positions, past_key_values=cache, output_hidden_states=True)
            assert torch.allclose(ours.logits, want.logits, atol=TOLERANCE * scale), family
            assert torch.allclose(ours.hidden_states[-1], want.hidden_states[-1], atol=TOLERANCE * scale), family
            assert cache.get_seq_length() == ids.shape[1]
        for step in range(2):  # one-row steps after the long prompt, then a block of 4
            at = LONG + step
            out = decoder(input_ids=torch.tensor([[sequence[at]]]), position_ids=torch.tensor([[at]]),
                          past_key_values=cache, logits_to_keep=1)
            assert out.logits.shape == (1, 1, model.config.vocab_size) and out.hidden_states is None
            assert torch.allclose(out.logits[0, 0], reference.logits[0, at], atol=TOLERANCE * scale), (family, at)
        out = decoder(input_ids=torch.tensor([sequence[LONG + 2 : LONG + 6]]),
                      position_ids=torch.arange(LONG + 2, LONG + 6)[None], past_key_values=cache)
        assert torch.allclose(out.logits[0], reference.logits[0, LONG + 2 : LONG + 6], atol=TOLERANCE * scale), family


@pytest.mark.parametrize("family", ["mistral", "qwen3", "gemma2", "gemma3_text"])
def test_a_tree_deeper_than_the_window_equals_one_row_steps_bit_for_bit(family):
    """Sliding windows in a tree: a node attends only to the keys within the window of its own position (the
    prefix's and its ancestors'). Each node's logits equal one-row forwards along its path bit for bit, and
    transformers' forward of the path as a sequence up to rounding."""
    from specdec_cli.target_model.verify.tree_mask import tree_attention_mask, tree_layout

    model = _blocks(family, "int4")
    decoder = native.decoder_for(model)
    prompt = PROMPTS[0]
    tokens, parents = [30, *range(40, 50)], [-1, -1, *range(1, 10)]  # a junk root, then a 10-deep chain
    depth, ancestors = tree_layout(parents)
    past = len(prompt) - 1
    mask = tree_attention_mask(model.config, past, depth, ancestors)
    with torch.inference_mode():
        cache = transformers_kv_cache()
        decoder(input_ids=torch.tensor([prompt[:-1]]), position_ids=torch.arange(past)[None], past_key_values=cache)
        tree = decoder(input_ids=torch.tensor([[prompt[-1], *tokens]]), position_ids=(past + depth)[None],
                       past_key_values=cache, attention_mask=mask).logits[0]  # [12, V]
        for leaf in (0, 10):  # the junk root's path, and the deepest node's
            cache.crop(past - cache.get_seq_length())
            rows = [0, *(node + 1 for node in tree_path(parents, leaf))]
            sequence = [prompt[-1], *(tokens[row - 1] for row in rows[1:])]
            for offset, (row, token) in enumerate(zip(rows, sequence)):
                one = decoder(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[past + offset]]),
                              past_key_values=cache).logits[0, 0]
                assert torch.equal(tree[row], one), (family, row)
                want = model(torch.tensor([prompt[:-1] + sequence[: offset + 1]])).logits[0, -1]
                assert torch.allclose(tree[row], want, atol=TOLERANCE * float(want.abs().max())), (family, row)


def test_a_partial_rotary_turns_only_the_first_dimensions_of_each_head():
    """Phi-3.5/Phi-4-mini's partial_rotary_factor: the rotation in torch (the kernel turns whole heads), still
    row-invariant (blocks, and a tree, bit for bit as one-row forwards)."""
    from specdec_cli.target_model.verify.exact import block_mismatch

    model = _blocks("phi3", "int4", partial_rotary_factor=0.5)
    decoder = native.decoder_for(model)
    assert decoder.ropes[0].half * 2 < decoder.head_dim
    ids = torch.tensor([PROMPTS[1]])
    with torch.inference_mode():
        want = model(ids).logits
        ours = decoder(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None],
                       past_key_values=transformers_kv_cache()).logits
    assert torch.allclose(ours, want, atol=TOLERANCE * float(want.abs().max()))
    assert block_mismatch(decoder, model.config, torch.device("cpu"), 8) is None


def test_what_the_native_decoder_leaves_to_transformers(monkeypatch):
    dense = family_model("llama", seed=3)
    assert "not a block layer" in native_support.unsupported(dense)
    assert native.decoder_for(dense) is None
    model = _blocks("llama", "int4")
    monkeypatch.setattr(model.config, "model_type", "some-new-family")
    assert "some-new-family is not a family" in native_support.unsupported(model)
    monkeypatch.undo()
    monkeypatch.setattr(model.model.rotary_emb, "rope_type", "dynamic")
    assert native_support.unsupported(model) == "rope type 'dynamic' changes with the length"
    monkeypatch.undo()
    from transformers.activations import GELUTanh

    mlp = model.model.layers[1].mlp
    saved, mlp.act_fn = mlp.act_fn, GELUTanh(use_gelu_tanh_python=True)  # the formula in Python, not torch's gelu
    assert native_support.unsupported(model) == "activation GELUTanh"
    mlp.act_fn = saved
    monkeypatch.setattr(model.config, "layer_types", ["full_attention", "chunked_attention"], raising=False)
    assert native_support.unsupported(model) == "chunked_attention layers"
    monkeypatch.undo()
    assert native_support.unsupported(model) is None


@pytest.fixture(scope="module", params=BLOCK_FAMILIES, ids=[family for family, _ in BLOCK_FAMILIES])
def block_family(request):
    """A tiny block-weight model on the native decoder and its plain greedy answers through the engine, which equal
    transformers' greedy decoding on the same block layers."""
    family, mode = request.param
    model = _blocks(family, mode)
    engine = fixed_engine(model)
    references = [engine.generate(prompt, NoDrafter(), _config()).tokens for prompt in PROMPTS]
    assert engine.forward.outcome.state == "on", engine.forward.outcome.text()
    assert isinstance(engine.forward, NativeForward)
    for prompt, answer in zip(PROMPTS, references):
        _assert_greedy(model, prompt, answer)
    return type("Family", (), {"name": family, "model": model, "vocab": 64, "references": references})


@pytest.mark.parametrize("kind", ["pld", "chain", "tree", "model", "recycle", "aded"])
def test_speculation_on_block_weights_is_identical_to_plain_decoding(block_family, kind):
    for index, prompt in enumerate(PROMPTS):
        drafter = family_drafter(kind, block_family, index)
        generation = fixed_engine(block_family.model).generate(prompt, drafter, _config())
        assert generation.tokens == block_family.references[index], (block_family.name, kind, index)
        if kind in ("chain", "tree"):
            assert max(event.verify_rows for event in generation.events if event.kind == "step") >= 4


@pytest.mark.parametrize("family,mode", [("qwen2", "int8"), ("mistral", "int4")])  # biases; a sliding window
def test_a_bfloat16_kv_cache_keeps_every_drafter_identical_to_plain_decoding(monkeypatch, family, mode):
    """SPECDEC_KV_CACHE=bfloat16: the native decoder keeps keys and values in bfloat16 (the attention reads them as
    they are, the prompt's too); plain decoding stays transformers' greedy within rounding, every drafter (chains,
    trees, a draft model, Token Recycling, ADED) stays plain decoding's own answer token for token, and several
    sequences in one forward get the bits each gets alone."""
    from specdec_cli.decoding.plain_many import plain_many

    monkeypatch.setenv("SPECDEC_KV_CACHE", "bfloat16")
    model = _blocks(family, mode)
    engine = fixed_engine(model)
    cache = KVCache()
    native.decoder_for(model)(input_ids=torch.tensor([PROMPTS[0]]), position_ids=torch.arange(len(PROMPTS[0]))[None],
                              past_key_values=cache)
    assert cache.layers[0].key_buffer.dtype == torch.bfloat16
    references = [engine.generate(prompt, NoDrafter(), _config()).tokens for prompt in PROMPTS]
    for prompt, answer in zip(PROMPTS, references):  # within the cache's rounding (bfloat16: 8 significant bits)
        _assert_greedy(model, prompt, answer, tolerance=4 * TOLERANCE)
    family_case = type("Family", (), {"name": family, "model": model, "vocab": 64, "references": references})
    for kind in ("pld", "chain", "tree", "model", "recycle", "aded"):
        for index, prompt in enumerate(PROMPTS):
            generation = fixed_engine(model).generate(prompt, family_drafter(kind, family_case, index), _config())
            assert generation.tokens == references[index], (family, kind, index)
    answers = plain_many(engine.forward, PROMPTS, _config(), width=3)
    assert [answer.tokens for answer in sorted(answers, key=lambda answer: answer.index)] == references
    monkeypatch.setenv("SPECDEC_KV_CACHE", "float16")
    with pytest.raises(SpecdecError, match="SPECDEC_KV_CACHE must be one of float32, bfloat16"):
        native.decoder_for(model)


def test_sampling_on_block_weights_keeps_the_law():
    model = _blocks("llama", "int4", seed=7)
    prompt = PROMPTS[1]
    law = second_token_law(model, prompt)
    engine = fixed_engine(model)
    assert isinstance(engine.forward, NativeForward)
    drafter = LikelyTree(torch.topk(law, 2).indices.tolist(), 64)
    counts = torch.zeros(64, dtype=torch.float64)
    for seed in range(400):
        config = _config(max_new_tokens=3, temperature=1.0, seed=seed, eos_token_ids=(), draft_max=5)
        counts[engine.generate(prompt, drafter, config).tokens[1]] += 1
    statistic, dof = chi_square(counts, law)
    assert statistic < dof + 5 * (2 * dof) ** 0.5 + 5, (statistic, dof)


@pytest.mark.parametrize("kind", ["plain", "transformers"])
def test_the_kv_cache_rolls_back_and_keeps_paths_like_a_dynamic_cache(kind):
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    ours, theirs = KVCache() if kind == "plain" else transformers_kv_cache(), DynamicCache()
    length = 0
    for step in range(40):  # past the initial capacity (256 entries) twice over
        added = int(torch.randint(1, 30, (1,), generator=generator))
        keys, values = torch.randn(2, 1, 3, added, 4, generator=generator)
        got = ours.update(keys, values, 0)
        want = theirs.update(keys, values, 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        length += added
        if step % 3 == 0:
            drop = int(torch.randint(0, added, (1,), generator=generator))
            ours.crop(-drop)
            theirs.crop(-drop)
            length -= drop
        if step % 5 == 0 and length > 4:
            keep = [*range(length - 4), length - 3, length - 1]  # a tree path: skip a sibling
            if step % 10 == 0:  # any ascending positions, none in place
                keep = sorted(torch.randperm(length, generator=generator)[: length // 2 + 1].tolist())
                keep = keep if keep[0] else keep[1:]
                ours.keep(keep)
            else:  # the context stays in place, the path moves after it
                ours.keep(keep[length - 4 :], start=length - 4)
            index = torch.tensor(keep)
            layer = theirs.layers[0]
            layer.keys, layer.values = layer.keys.index_select(-2, index), layer.values.index_select(-2, index)
            length = len(keep)
        assert ours.get_seq_length() == theirs.get_seq_length() == length
        assert torch.equal(ours.layers[0].keys, theirs.layers[0].keys)


# -- GGUF files ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(GGUF_FAMILIES))
def test_a_gguf_of_each_family_runs_native_on_its_own_blocks(family, tmp_path):
    """A tiny GGUF of the family, loaded as specdec loads one (transformers' loader, then the file's own blocks):
    every matrix a block layer, the native decoder's logits close to transformers' forward on the same layers,
    its plain greedy answers equal transformers' greedy decoding, and speculation (chains and trees) equal to
    plain decoding."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    architecture, settings = GGUF_FAMILIES[family]
    source = family_model(family, seed=5, **settings)
    if family.startswith("gemma"):  # tied and scaled by sqrt(hidden), tiny embeddings would drown the layers
        with torch.no_grad():
            source.model.embed_tokens.weight.mul_(source.config.hidden_size ** -0.5)
    write_family_gguf(tmp_path / "tiny.gguf", source, architecture)
    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = EOS, 0
    assert model.config.model_type == family
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "gguf", tmp_path / "tiny.gguf"))
    assert not any(type(module) is torch.nn.Linear for module in model.modules())
    assert {layer.origin for layer in quant.block_layers(model)} == {"Q4_0", "Q4_1", "Q8_0"}
    assert native_support.unsupported(model) is None
    ids = torch.tensor([PROMPTS[1]])
    with torch.inference_mode():
        want = model(ids).logits
        ours = native.decoder_for(model)(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None],
                                         past_key_values=transformers_kv_cache()).logits
    assert torch.allclose(ours, want, atol=TOLERANCE * float(want.abs().max()))
    engine = fixed_engine(model)
    assert isinstance(engine.forward, NativeForward)
    case = type("Family", (), {"name": family, "model": model, "vocab": model.config.vocab_size, "references": []})
    for index, prompt in enumerate(PROMPTS):
        plain = engine.generate(prompt, NoDrafter(), _config()).tokens
        _assert_greedy(model, prompt, plain)
        case.references.append(plain)
        for kind in ("chain", "tree", "pld"):
            speculative = fixed_engine(model)
            generation = speculative.generate(prompt, family_drafter(kind, case, index), _config())
            assert generation.tokens == plain, (family, kind, index)
            assert kind != "tree" or speculative.tree_outcome.state == "passed", speculative.tree_check
    assert engine.forward.outcome.state == "on", engine.forward.outcome.text()


@pytest.mark.parametrize("family", sorted(OWN_LOADER))
def test_a_gguf_transformers_cannot_read_loads_through_specdec_and_runs_native(family, tmp_path, monkeypatch):
    """specdec's own reader for gemma and smollm3 GGUFs (config from the metadata, Gemma's norms stored as
    1 + weight, smollm3's q/k rows interleaved), through load_target as the CLI loads a file: every matrix the
    file's own block layer, the native decoder, answers equal to transformers' greedy decoding and speculation
    equal to plain decoding."""
    from transformers import AutoModelForCausalLM

    from specdec_cli.target_model.gguf import gguf_families
    from specdec_cli.target_model.load import models

    architecture, tokenizer, settings = OWN_LOADER[family]
    source = family_model(family, seed=5, **settings)
    if family == "gemma":  # tied and scaled by sqrt(hidden), tiny embeddings would drown the layers
        with torch.no_grad():
            source.model.embed_tokens.weight.mul_(source.config.hidden_size ** -0.5)
    path = tmp_path / f"tiny-{family}.gguf"
    write_family_gguf(path, source, architecture, tokenizer)
    assert gguf_families.handles(path)
    with pytest.raises(Exception, match="not supported"):  # what transformers' own loader says
        AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name)
    read, _ = gguf_families.load(path)
    expected = source.state_dict()
    for name, tensor in read.state_dict().items():  # within the 4/8-bit rounding (norms exact): rows in order
        assert (tensor - expected[name]).abs().max() <= 0.15 * expected[name].abs().max() + 1e-6, name
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    loaded = models.load_target(str(path), device="cpu", weights="gguf")
    model = loaded.model
    assert model.config.model_type == family and loaded.tokenizer.eos_token_id == EOS
    if family == "smollm3":
        assert model.config.no_rope_layers == [1, 1, 1, 0]
    assert not any(type(module) is torch.nn.Linear for module in model.modules())
    assert {layer.origin for layer in quant.block_layers(model)} == {"Q4_0", "Q4_1", "Q8_0"}
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = EOS, 0
    engine = fixed_engine(model)
    assert isinstance(engine.forward, NativeForward)
    case = type("Family", (), {"name": family, "model": model, "vocab": model.config.vocab_size, "references": []})
    for index, prompt in enumerate(PROMPTS):
        plain = engine.generate(prompt, NoDrafter(), _config()).tokens
        _assert_greedy(model, prompt, plain)
        case.references.append(plain)
        for kind in ("chain", "tree"):
            generation = fixed_engine(model).generate(prompt, family_drafter(kind, case, index), _config())
            assert generation.tokens == plain, (family, kind, index)


def test_auto_weights_that_choose_dense_give_torch_its_threads_back(tmp_path, monkeypatch):
    """`--weights auto` on a GGUF of a family the native decoder does not compute (transformers' forward on the
    file's blocks; a llama file stands in for one here) times the blocks, which hands torch's threads to the
    kernels; when dense wins, the dense model must run on those threads again, not on the one torch keeps while
    the kernels compute."""
    from specdec_cli import kernels
    from specdec_cli.target_model.gguf import gguf_layout
    from specdec_cli.target_model.load import models

    monkeypatch.setattr(gguf_layout, "native_reason", lambda gguf, config: "a family computed by transformers")

    source = family_model("llama", seed=5)
    path = tmp_path / "tiny.gguf"
    write_family_gguf(path, source, "llama", "llama")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_WEIGHTS", raising=False)
    threads, kernel_threads = torch.get_num_threads(), kernels.threads()
    timings = iter([0.001, 0.010, 0.001, 0.001, 0.001])  # dense 1 ms, blocks 10 ms: dense wins
    try:
        torch.set_num_threads(2)
        loaded = models.load_target(str(path), device="cpu", dtype="float32", weights="auto",
                                    step_timer=lambda model: next(timings))
        assert loaded.weights == "dense"
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
        kernels.set_threads(kernel_threads)


def test_the_row_invariance_check_runs_one_layer_of_each_kind_and_catches_a_fault_in_any(monkeypatch):
    """The end-to-end check (exact.block_mismatch) runs the first layer of each distinct signature and the head
    (distinct_layers), on the full decoder's weights: a row-dependent fault in a matrix kind that only a later
    layer uses is still caught, and the check leaves the full decoder's answers as they were."""
    from specdec_cli.target_model.verify.exact import block_mismatch

    model = family_model("llama", seed=5, num_hidden_layers=4)
    plan = converted_blocks.plan_blocks(model, "int4", None)
    plan["model.layers.2.mlp.down_proj"] = quant.quantize_dense(
        model.model.layers[2].mlp.down_proj.weight, kernels.KIND_Q8)  # layer 2 alone multiplies down on q8
    quant.install_blocks(model, plan)
    decoder = native.decoder_for(model)
    twin = decoder.distinct_layers()
    assert [layer.down.matrix.kind for layer in twin.layers] == [kernels.KIND_Q4, kernels.KIND_Q8]
    assert twin.layers[0] is decoder.layers[0] and twin.layers[1] is decoder.layers[2] and twin.head is decoder.head
    ids = torch.tensor([PROMPTS[1]])
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        before = decoder(input_ids=ids, position_ids=positions, past_key_values=transformers_kv_cache()).logits
        assert block_mismatch(twin, model.config, torch.device("cpu"), 8) is None
        after = decoder(input_ids=ids, position_ids=positions, past_key_values=transformers_kv_cache()).logits
    assert torch.equal(before, after)

    from specdec_cli.target_model.native import bound_steps

    exact_matmul = bound_steps.bind_matmul

    def row_dependent(source, layer, out, accumulate=False):  # a q8 tile that rounds by the block's size
        product = exact_matmul(source, layer, out, accumulate)
        if layer.matrix.kind != kernels.KIND_Q8 or source.tensor.shape[0] == 1:
            return product

        def faulty():
            product()
            out.tensor.mul_(1 + 1e-6)

        return faulty

    monkeypatch.setattr(bound_steps, "bind_matmul", row_dependent)
    with torch.inference_mode():
        assert "differs from a one-row forward" in block_mismatch(decoder.distinct_layers(), model.config,
                                                                  torch.device("cpu"), 8)


def test_a_row_count_stays_bound_and_a_long_prompts_buffers_are_not_kept(block_family):
    """Binding a row count's calls costs a third of a small model's step: every count a step or a prompt block uses
    stays bound, and a count used again is not bound anew. A longer forward (a whole prompt's, for training or
    scoring) has buffers of its own, freed with it: the decoder's scratch and bound counts do not grow."""
    from specdec_cli.target_model.native import bound_steps

    decoder = NativeForward(block_family.model).decoder
    blocks = native.ROW_INVARIANT_ROWS
    bound_steps.layer_steps(decoder, blocks, keep=True)  # the buffers sized once (a bigger block makes them again)
    first = bound_steps.layer_steps(decoder, 1, keep=True)
    for rows in range(2, blocks + 1):  # prompt tails and probes of many sizes, each followed by a one-row step
        bound_steps.layer_steps(decoder, rows, keep=True)
        assert bound_steps.layer_steps(decoder, 1, keep=True)[1] is first[1]  # its calls, not bound again
    scratch = {name: buffer.shape for name, buffer in decoder._scratch.items()}
    kept = set(decoder._bound)
    with torch.inference_mode():
        decoder(input_ids=torch.tensor([_sequence(3 * blocks)]), position_ids=torch.arange(3 * blocks)[None],
                past_key_values=KVCache(), use_cache=True)
    assert {name: buffer.shape for name, buffer in decoder._scratch.items()} == scratch
    assert set(decoder._bound) == kept and bound_steps.layer_steps(decoder, 1, keep=True)[1] is first[1]
