"""Heads in EAGLE-3's published layout (drafters/eagle3_head.py): a tiny head written as such checkpoints are (a
config.json and model.safetensors with fc, a midlayer, norm, lm_head, d2t and t2d) loads with `--drafter eagle
--draft-model DIR`; it drafts what a straight reading of the layout computes from the target's three layers' states;
drafting with it is lossless on dense and block targets, chains and trees; and bad directories get one line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_EOS, fixed_engine, hf_greedy, invoke
from helpers import IdsTokenizer

from specdec_cli import kernels
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.drafters import DrafterOptions, make_drafter, target_info
from specdec_cli.drafters.eagle3_head import feature_layers
from specdec_cli.errors import SpecdecError

VOCAB, HIDDEN, LAYERS, DRAFT_VOCAB = 64, 64, 5, 40
PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 30, 31, 32, 33, 30, 31], [1, 20, 21, 22, 23, 20, 21, 22]]



@pytest.fixture(scope="module")
def target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512, initializer_range=0.3, eos_token_id=TINY_EOS,
                                         bos_token_id=1, pad_token_id=0)).eval()
    model.generation_config.eos_token_id = TINY_EOS
    return model


def _draft_ids() -> torch.Tensor:
    """The draft vocabulary: 40 of the 64 target ids, the EOS among them."""
    others = [token for token in range(2, VOCAB) if token != TINY_EOS][: DRAFT_VOCAB - 1]
    return torch.tensor(sorted([TINY_EOS, *others]))


def write_eagle3_head(folder, *, seed: int = 3, layout: str = "midlayer", **config_changes) -> dict:
    """A random head in EAGLE-3's layout for the tiny target: what such a checkpoint holds, named as they name it."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    heads, kv_heads, head_dim, ffn = 4, 2, HIDDEN // 4, 96

    def weight(*shape):
        return torch.randn(*shape, generator=generator) / math.sqrt(shape[-1])

    ids = _draft_ids()
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    layer = f"{layout}."
    tensors = {
        "fc.weight": weight(HIDDEN, 3 * HIDDEN),
        f"{layer}hidden_norm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=generator),
        f"{layer}input_layernorm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=generator),
        f"{layer}post_attention_layernorm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=generator),
        f"{layer}self_attn.q_proj.weight": weight(heads * head_dim, 2 * HIDDEN),
        f"{layer}self_attn.k_proj.weight": weight(kv_heads * head_dim, 2 * HIDDEN),
        f"{layer}self_attn.v_proj.weight": weight(kv_heads * head_dim, 2 * HIDDEN),
        f"{layer}self_attn.o_proj.weight": weight(HIDDEN, heads * head_dim),
        f"{layer}mlp.gate_proj.weight": weight(ffn, HIDDEN),
        f"{layer}mlp.up_proj.weight": weight(ffn, HIDDEN),
        f"{layer}mlp.down_proj.weight": weight(HIDDEN, ffn),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": 3 * weight(DRAFT_VOCAB, HIDDEN),
        "d2t": ids - torch.arange(DRAFT_VOCAB),
        "t2d": t2d,
    }
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": ffn, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": VOCAB,
              "draft_vocab_size": DRAFT_VOCAB, "max_position_embeddings": 512, "torch_dtype": "float32",
              **config_changes}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(folder / "model.safetensors"))
    return tensors


def _rotate(tensor, positions, theta=10000.0):
    """Rotate-half rotary embedding, written out: tensor [heads, n, d], positions [n]."""
    half = tensor.shape[-1] // 2
    frequencies = 1.0 / theta ** (torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * frequencies[None]  # [n, d/2]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # [n, d]
    return tensor * cos + torch.cat([-tensor[..., half:], tensor[..., :half]], -1) * sin


def _rms(x, weight, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def reference_first_token(model, tensors, context, layers) -> int:
    """The first token an EAGLE-3 head drafts after `context`, read straight off the layout: the target's states
    entering `layers` at every committed position, fc, the midlayer over (state t, embedding of token t+1) at
    positions 0..n-2, causal; the last row's norm, lm_head, argmax, and d2t to a target id."""
    with torch.no_grad():
        out = model(torch.tensor([context]), output_hidden_states=True)
        states = torch.cat([out.hidden_states[layer][0] for layer in layers], -1)[:-1]  # [n-1, 3H]
        hidden = states @ tensors["fc.weight"].T  # [n-1, H]
        embedded = model.get_input_embeddings()(torch.tensor(context[1:]))  # [n-1, H]
        name = "midlayer."
        joined = torch.cat([_rms(embedded, tensors[name + "input_layernorm.weight"]),
                            _rms(hidden, tensors[name + "hidden_norm.weight"])], -1)  # [n-1, 2H]
        count, positions = joined.shape[0], torch.arange(joined.shape[0])
        query = (joined @ tensors[name + "self_attn.q_proj.weight"].T).view(count, 4, 16).transpose(0, 1)
        key = (joined @ tensors[name + "self_attn.k_proj.weight"].T).view(count, 2, 16).transpose(0, 1)
        value = (joined @ tensors[name + "self_attn.v_proj.weight"].T).view(count, 2, 16).transpose(0, 1)
        query, key = _rotate(query, positions), _rotate(key, positions)
        key, value = key.repeat_interleave(2, 0), value.repeat_interleave(2, 0)  # [4, n-1, 16]
        scores = (query @ key.transpose(1, 2)) / 4.0
        scores = scores.masked_fill(~torch.ones(count, count, dtype=torch.bool).tril(), -math.inf)
        attended = (torch.softmax(scores, -1) @ value).transpose(0, 1).reshape(count, HIDDEN)
        hidden = hidden + attended @ tensors[name + "self_attn.o_proj.weight"].T
        normed = _rms(hidden, tensors[name + "post_attention_layernorm.weight"])
        hidden = hidden + (F.silu(normed @ tensors[name + "mlp.gate_proj.weight"].T) *
                           (normed @ tensors[name + "mlp.up_proj.weight"].T)) @ tensors[name + "mlp.down_proj.weight"].T
        logits = _rms(hidden[-1], tensors["norm.weight"]) @ tensors["lm_head.weight"].T  # [draft vocab]
        best = int(logits.argmax())
        return best + int(tensors["d2t"][best])


def _drafter(model, folder, **options):
    return make_drafter("eagle", DrafterOptions(draft_model=str(folder), **options),
                        target_info(model, IdsTokenizer(VOCAB)))


def test_the_layers_read_are_the_configs_or_eagle3s():
    assert feature_layers({}, 32) == (2, 16, 29)
    assert feature_layers({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 13, 24]}}, 28) == (1, 13, 24)
    assert feature_layers({"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}, 5) == (0, 2, 4)
    assert feature_layers({"eagle_config": ["not", "settings"]}, 32) == (2, 16, 29)


@pytest.mark.parametrize("layout", ["midlayer", "layers.0"])
def test_a_head_in_eagle3s_layout_drafts_what_the_layout_computes(target, tmp_path, layout):
    from specdec_cli.decoding.draft import Draft, StepEvent

    tensors = write_eagle3_head(tmp_path / "head", layout=layout)
    tensors = {name.replace("layers.0.", "midlayer."): tensor for name, tensor in tensors.items()}
    drafter = _drafter(target, tmp_path / "head")
    layers = feature_layers({}, LAYERS)
    assert drafter.needs.features and drafter.needs.feature_layers == layers == (2, 2, 2)
    engine = fixed_engine(target)
    for context in PROMPTS:
        from specdec_cli.target_model.native.kv_cache import new_kv_cache

        with torch.inference_mode():  # the engine's prefill event, as the engine's forward gives it
            scores = engine.forward(context[:-1], new_kv_cache(target), 0, features=True, feature_layers=layers)
        assert scores.features.shape == (len(context) - 1, 3 * HIDDEN)
        drafter.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[context[-1]],
                                  prompt_tokens=tuple(context[:-1]), features=scores.features))
        draft = drafter.propose(context, 1)
        assert draft.tokens == [reference_first_token(target, tensors, context, layers)]
        assert draft.tokens[0] in _draft_ids().tolist()


@pytest.mark.parametrize("tree_width", [0, 4])
def test_eagle3_drafting_is_greedy_identical_on_a_dense_target(target, tmp_path, tree_width):
    write_eagle3_head(tmp_path / "head")
    drafter = _drafter(target, tmp_path / "head")
    drafter.tree_width = tree_width
    drafted = 0
    for prompt in PROMPTS:
        drafter.reset()
        generation = fixed_engine(target).generate(prompt, drafter, GenerationConfig(
            max_new_tokens=24, eos_token_ids=(TINY_EOS,), draft_max=4))
        assert generation.tokens == hf_greedy(target, prompt, 24), prompt
        drafted += generation.stats.drafted_tokens
    assert drafted > 0


@pytest.mark.skipif(not kernels.available(), reason="specdec's CPU kernels are not compiled")
def test_on_block_weights_the_native_decoder_gives_the_layers_and_drafting_stays_lossless(target, tmp_path):
    import copy

    from specdec_cli.target_model.load import converted_blocks
    from specdec_cli.target_model.native import quant
    from specdec_cli.target_model.native.kv_cache import KVCache
    from specdec_cli.target_model.native.native import NativeDecoder
    from specdec_cli.target_model.verify.exact_setup import NativeForward

    model = copy.deepcopy(target)
    quant.install_blocks(model, converted_blocks.plan_blocks(model, "int8", None))
    context = PROMPTS[0]
    with torch.inference_mode():
        native = NativeDecoder(model)(torch.tensor([context]), torch.arange(len(context))[None], KVCache(),
                                      output_hidden_states=True, hidden_layers=(1, 3))
        dense = model(torch.tensor([context]), output_hidden_states=True)
    for layer in (1, 3):
        assert torch.allclose(native.hidden_states[layer], dense.hidden_states[layer], atol=2e-2, rtol=2e-2)
    assert native.hidden_states[0] is None and native.hidden_states[2] is None

    write_eagle3_head(tmp_path / "head")
    drafter = _drafter(model, tmp_path / "head")
    engine = fixed_engine(model)
    assert isinstance(engine.forward, NativeForward)
    plain = make_drafter("none", DrafterOptions(), target_info(model, IdsTokenizer(VOCAB)))
    for prompt in PROMPTS:
        config = GenerationConfig(max_new_tokens=24, eos_token_ids=(TINY_EOS,), draft_max=4)
        reference = engine.generate(prompt, plain, config).tokens
        drafter.reset()
        generation = engine.generate(prompt, drafter, config)
        assert generation.tokens == reference and generation.stats.drafted_tokens > 0


def test_bad_eagle3_directories_are_refused_in_one_line(target, tmp_path):
    folder = tmp_path / "pickled"
    write_eagle3_head(folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(SpecdecError, match="pickle"):
        _drafter(target, folder)
    write_eagle3_head(tmp_path / "wide", hidden_size=128)
    with pytest.raises(SpecdecError, match="128 wide"):
        _drafter(target, tmp_path / "wide")
    write_eagle3_head(tmp_path / "vocab", vocab_size=32000)
    with pytest.raises(SpecdecError, match="vocabulary"):
        _drafter(target, tmp_path / "vocab")
    write_eagle3_head(tmp_path / "deep", eagle_aux_hidden_state_layer_ids=[1, 2, 9])
    with pytest.raises(SpecdecError, match="layer 9"):
        _drafter(target, tmp_path / "deep")
    write_eagle3_head(tmp_path / "short")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "short" / "model.safetensors"))
    del tensors["fc.weight"]
    save_file(tensors, str(tmp_path / "short" / "model.safetensors"))
    with pytest.raises(SpecdecError, match="lacks fc.weight"):
        _drafter(target, tmp_path / "short")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    with pytest.raises(SpecdecError, match="no positive integer 'hidden_size'"):
        _drafter(target, tmp_path / "junk")


def test_the_cli_refuses_a_pickled_eagle3_head_before_loading_the_target(tmp_path):
    folder = tmp_path / "head"
    write_eagle3_head(folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    result = invoke("chat", "--drafter", "eagle", "--draft-model", str(folder), "--prompt", "hi", "-m",
                    str(tmp_path / "no-such-model"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "pickle" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- training heads in this layout (distill/eagle3_train.py) ----------------------------------------------------


def _answers(target, count: int = 12, length: int = 40) -> list[list[int]]:
    """The target's own greedy continuations of varied starts: what `distill generate` gives a head to learn."""
    generator = torch.Generator().manual_seed(11)
    starts = [[1, *torch.randint(2, VOCAB, (4,), generator=generator).tolist()] for _ in range(count)]
    return [start + hf_greedy(target, start, length) for start in starts]


def test_a_trained_eagle3_head_learns_the_target_and_saves_as_it_drafts(target, tmp_path):
    """Training lowers the token loss (the target's distribution two tokens ahead: a random tiny target is too
    chaotic for 9 pieces to teach held-out agreement); the written folder loads back (bfloat16, as published) into
    a head that drafts the tokens the trained module drafts."""
    from specdec_cli.distill.eagle3_train import Eagle3Kind
    from specdec_cli.distill.eagle_train import EagleTrainConfig
    from specdec_cli.distill.loop import train
    from specdec_cli.drafters.eagle3_head import load_eagle3, save_eagle3

    config = EagleTrainConfig(steps=80, lr=3e-3, head_vocab=48, holdout=0.25, save_every=0, seed=2, unroll=2)
    head, result = train(Eagle3Kind(target, _answers(target), config), None)
    report = result["report"]
    history = report["loss_history"]
    assert sum(history[-10:]) / 10 < 0.7 * sum(history[:10]) / 10, history
    assert report["top1_agreement_after"] is not None and report["steps"] == 80
    assert report["feature_layers"] == [2, 2, 2] and report["draft_vocab"] == 48
    info = target_info(target, IdsTokenizer(VOCAB))
    save_eagle3(tmp_path / "foreign", head, {**report, "target": "tiny", "fingerprint": "sha256:another"})
    with pytest.raises(SpecdecError, match="trained for another tokenizer"):
        load_eagle3(tmp_path / "foreign", info)
    save_eagle3(tmp_path / "head", head, {**report, "target": "tiny", "fingerprint": info.fingerprint})
    loaded, layers = load_eagle3(tmp_path / "head", info)
    assert layers == (2, 2, 2) and torch.equal(loaded.d2t, head.d2t)
    states = torch.randn(1, 6, 3 * HIDDEN)
    embedded = target.get_input_embeddings()(torch.tensor([[3, 4, 5, 6, 7, 8]]))
    with torch.inference_mode():
        outs = [module.lm_head(module.norm(module(module.reduce(states), embedded, torch.arange(6)))).argmax(-1)
                for module in (head.eval(), loaded)]
    assert (outs[0] == outs[1]).float().mean() >= 0.8  # (bfloat16 weights: near ties may flip)


def test_the_draft_vocabularys_lm_head_rows_come_from_the_blocks_alone(target):
    import copy

    from specdec_cli.distill.eagle_train import lm_head_rows
    from specdec_cli.target_model.load import converted_blocks
    from specdec_cli.target_model.native import quant

    blocks = copy.deepcopy(target)
    quant.install_blocks(blocks, converted_blocks.plan_blocks(blocks, "int8", None))
    ids = _draft_ids()
    lm_head = blocks.get_output_embeddings()
    assert isinstance(lm_head, quant.BlockLinear)
    assert torch.equal(lm_head_rows(lm_head, ids), lm_head.blocks().dense()[ids])
    assert torch.equal(lm_head_rows(target.get_output_embeddings(), ids), target.lm_head.weight[ids])
