"""Helpers shared by several test modules (fixtures live in conftest.py): tiny models of every family, scripted
drafters, and the character-level tokenizers the CLI tests save as model directories."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from conftest import TINY_EOS, TINY_VOCAB, make_char_tokenizer

from specdec_cli.decoding.draft import NOTHING, Draft

# -- tiny models of every family README lists (test_families.py, test_exact.py, test_native.py) ------------------

EOS = 3
WINDOW = 8  # sliding windows are this short: prompts, answers and the deepest trees below run past them

PROMPTS = [
    [1, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11],
    [1, 5, 6, 7, 8, 9, 20, 21, 22, 23, 24, 25, 26, 27, 5, 6, 7, 8],
]


def family_config(family: str, vocab: int = 64, **extra):
    """A tiny config of the family; `extra` settles any setting (the family's own ones below included)."""
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.3, eos_token_id=EOS, bos_token_id=1, pad_token_id=0)
    # Tiny Gemmas with tied embeddings only repeat their last input token (the scaled embedding dominates):
    # untied, their answers vary, so a wrong mask would show
    families = {
        "llama": (transformers.LlamaConfig, {}),
        "qwen2": (transformers.Qwen2Config, {}),
        # hybrid: a full layer, then a sliding one (Qwen's max_window_layers)
        "qwen3": (transformers.Qwen3Config, dict(head_dim=16, use_sliding_window=True, sliding_window=WINDOW,
                                                 max_window_layers=1)),
        "mistral": (transformers.MistralConfig, dict(sliding_window=WINDOW)),
        "phi3": (transformers.Phi3Config, dict(sliding_window=WINDOW)),  # a window on every layer (Phi-3-mini-4k)
        "smollm3": (transformers.SmolLM3Config, dict(no_rope_layers=[1, 0])),  # layer 1 without rotary (NoPE)
        "gemma": (transformers.GemmaConfig, dict(head_dim=16)),
        # eager attention (soft-capping), alternating sliding and full layers
        "gemma2": (transformers.Gemma2Config, dict(head_dim=16, sliding_window=WINDOW, tie_word_embeddings=False)),
        "gemma3_text": (transformers.Gemma3TextConfig, dict(head_dim=16, sliding_window=WINDOW,
                                                            tie_word_embeddings=False,
                                                            layer_types=["sliding_attention", "full_attention"])),
    }
    if family not in families:
        raise ValueError(family)
    kind, own = families[family]
    settings = {**common, **own, **extra}
    return kind(**{key: value for key, value in settings.items() if value is not None})


def family_model(family: str, vocab: int = 64, attention=None, seed: int = 0, **extra):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed or sum(map(ord, family)) + vocab)
    kwargs = {} if attention is None else {"attn_implementation": attention}
    model = AutoModelForCausalLM.from_config(family_config(family, vocab, **extra), **kwargs).eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    return model


def tree_path(parents, node):
    """Node indices from a root to `node`."""
    path = []
    while node >= 0:
        path.insert(0, node)
        node = parents[node]
    return path


class ScriptedChain:
    """The true continuation as a chain, with its third token wrong every other step (rollbacks mid-chain)."""

    name = "chain"
    needs = NOTHING

    def __init__(self, reference, prompt_len, vocab):
        self.reference, self.prompt_len, self.vocab, self.calls = reference, prompt_len, vocab, 0

    def propose(self, context, budget):
        done = len(context) - self.prompt_len
        tokens = list(self.reference[done : done + budget])
        self.calls += 1
        if self.calls % 2 and len(tokens) > 2:
            tokens[2] = (tokens[2] + 1) % self.vocab
        return Draft(tokens, self.name)

    def observe(self, event):
        pass

    def reset(self):
        pass


class ScriptedTree:
    """The truth behind a junk first sibling at depths 0 and 2, then a chain of truth: up to `budget` nodes, a
    path deeper than the window, and an accepted path that must be gathered in the cache."""

    name = "tree"
    needs = NOTHING

    def __init__(self, reference, prompt_len, vocab):
        self.reference, self.prompt_len, self.vocab = reference, prompt_len, vocab

    def propose(self, context, budget):
        done = len(context) - self.prompt_len
        truth = self.reference[done : done + budget]
        tokens, parents, parent = [], [], -1
        for depth, token in enumerate(truth):
            if depth in (0, 2):
                tokens.append((token + 1) % self.vocab)
                parents.append(parent)
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
        return Draft(tokens[:budget], self.name, parents=parents[:budget])

    def observe(self, event):
        pass

    def reset(self):
        pass


def family_drafter(kind, family, prompt_index):
    from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
    from specdec_cli.drafters.model import ModelDrafter

    prompt, reference = PROMPTS[prompt_index], family.references[prompt_index]
    if kind in ("pld", "recycle", "aded"):
        return make_drafter(kind, DrafterOptions(), TargetInfo(family.vocab, (EOS,)))
    if kind == "chain":
        return ScriptedChain(reference, len(prompt), family.vocab)
    if kind == "tree":
        return ScriptedTree(reference, len(prompt), family.vocab)
    return ModelDrafter(perturbed(family.model, 0.02), draft_max=4, eos_token_ids=(EOS,))


def perturbed(model, scale=0.05, seed=0):
    """A draft of the same family and vocabulary that mostly agrees with the target, but not always: each
    weight moved by `scale` times its tensor's spread."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            spread = float(parameter.std()) if parameter.numel() > 1 else 0.0
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale * (spread or 0.1))
    return draft


def second_token_law(model, prompt):
    """P(2nd new token) = sum over t1 of P(t1) P(t2 | t1) at temperature 1, from the model itself."""
    from specdec_cli.decoding.sampling import warp_probs

    vocab = model.config.vocab_size
    with torch.inference_mode():
        first = warp_probs(model(torch.tensor([prompt])).logits[0, -1], 1.0)  # [V]
        second = warp_probs(model(torch.tensor([prompt + [t] for t in range(vocab)])).logits[:, -1], 1.0)  # [V, V]
    return (first.unsqueeze(1) * second).sum(0).double()  # [V]


class LikelyTree:
    """At temperature > 0: a tree of the likeliest second tokens (a junk one first), continued by a chain."""

    name = "tree"
    needs = NOTHING

    def __init__(self, guesses, vocab):
        self.guesses, self.vocab = guesses, vocab

    def propose(self, context, budget):
        junk = (self.guesses[0] + 7) % self.vocab
        tokens = [junk, *self.guesses[:2], self.guesses[0], self.guesses[1]]
        return Draft(tokens[:budget], self.name, parents=[-1, -1, -1, 1, 3][:budget])

    def observe(self, event):
        pass

    def reset(self):
        pass


# -- character-level tokenizers ----------------------------------------------------------------------------------

BENCH_SPECIALS = ["<pad>", "<s>", "<x>", "</s>", "<unk>"]  # ids 0..4; </s> = 3 = conftest's TINY_EOS
BENCH_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,?!:'-\n;()\"/+=*<>_#%&")
BENCH_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(BENCH_SPECIALS + BENCH_CHARS)}
    assert len(vocab) == TINY_VOCAB and vocab["</s>"] == TINY_EOS
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges: one token per char
    backend.normalizer = normalizers.Lowercase()
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", pad_token="<pad>")
    tokenizer.chat_template = BENCH_CHAT_TEMPLATE
    return tokenizer


DISTILL_SPECIALS = ["<pad>", "<s>", "<unk>", "</s>", "<|user|>", "<|assistant|>"]
DISTILL_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,!?'\n-:;()+=*/\"")
DISTILL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(extra: str = ""):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = DISTILL_SPECIALS + DISTILL_CHARS + list(extra)
    tokens += [f"<x{i}>" for i in range(TINY_VOCAB - len(tokens))]
    vocab = {token: index for index, token in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(DISTILL_SPECIALS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                        pad_token="<pad>")
    tokenizer.chat_template = DISTILL_CHAT_TEMPLATE
    return tokenizer


def make_char_tokenizer_dir(directory: Path, extra_tokens: tuple[str, ...] = ()) -> Path:
    """The shared character-level tokenizer saved as a model directory (`load_tokenizer` accepts it)."""
    tokenizer = make_char_tokenizer()
    tokenizer.add_tokens(list(extra_tokens))
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    config = {"model_type": "llama", "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
              "eos_token_id": tokenizer.eos_token_id}
    (directory / "config.json").write_text(json.dumps(config))
    return directory

