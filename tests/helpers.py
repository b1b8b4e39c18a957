"""Helpers shared by several test modules (fixtures live in conftest.py): tiny models of every family, scripted
drafters, and the character-level tokenizers the CLI tests save as model directories."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import TINY_EOS, TINY_VOCAB, char_level_tokenizer, make_char_tokenizer

from specdec_cli.decoding.draft import NOTHING, Draft
from specdec_cli.target_model.gguf import gguf_decode

REPO = Path(__file__).resolve().parents[1]

# -- tiny models of every family docs/models.md lists (test_families.py, test_exact.py, test_native.py) -----------

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
    """Lowercase letters, digits and punctuation, one token each, `</s>` = TINY_EOS, a `role: text` template."""
    tokenizer = char_level_tokenizer(BENCH_SPECIALS, BENCH_CHARS, BENCH_CHAT_TEMPLATE, eos_token="</s>",
                                     lowercase=True)
    assert len(tokenizer) == TINY_VOCAB and tokenizer.convert_tokens_to_ids("</s>") == TINY_EOS
    return tokenizer


DISTILL_SPECIALS = ["<pad>", "<s>", "<unk>", "</s>", "<|user|>", "<|assistant|>"]
DISTILL_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,!?'\n-:;()+=*/\"")
DISTILL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(extra: str = ""):
    """distill's tokenizer: `<|user|>`/`<|assistant|>` turns, lowercase characters (+ `extra`), TINY_VOCAB ids."""
    return char_level_tokenizer(DISTILL_SPECIALS, DISTILL_CHARS + list(extra), DISTILL_CHAT_TEMPLATE,
                                eos_token="</s>", vocab_size=TINY_VOCAB, lowercase=True,
                                more_specials=("<|user|>", "<|assistant|>"))


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


# The families transformers loads from a GGUF: (the file's architecture, settings of the tiny source model that its
# loader reads back or defaults to). A Mistral GGUF is a llama file (llama.cpp writes Mistral as llama).
GGUF_FAMILIES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 128}),  # its GGUF loader keeps Qwen3's default head_dim
    "phi3": ("phi3", {}),
    "gemma2": ("gemma2", {"tie_word_embeddings": True}),  # llama.cpp's Gemmas have no output tensor
    "gemma3_text": ("gemma3", {"tie_word_embeddings": True, "num_hidden_layers": 6, "layer_types": None}),
}


def add_tiny_tokenizer(writer, kind: str, vocab: int) -> None:
    """A tiny vocabulary (ids 0-3: pad, bos, eos... as the tests' EOS = 3), SentencePiece ("llama", as Gemma's
    files) or byte-level BPE ("gpt2", as SmolLM3's)."""
    letters = [chr(code) for code in range(ord("a"), ord("z") + 1)] + [chr(code) for code in range(ord("A"), 91)]
    if kind == "llama":
        tokens = ["<pad>", "<bos>", "<unk>", "<eos>"] + ["\u2581" + letter for letter in letters]
    else:
        tokens = ["<|pad|>", "<|bos|>", "<|unk|>", "<|eos|>", "\u0120"] + letters
    tokens = (tokens + [f"{a}{b}" for a in "xyz" for b in letters])[:vocab]
    writer.add_tokenizer_model(kind)
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 2, 3] + [1] * (vocab - 4))
    if kind == "llama":
        writer.add_token_scores([0.0] * 4 + [-float(index) for index in range(vocab - 4)])
    else:
        writer.add_token_merges([f"{a} {b}" for a in "xyz" for b in letters][: vocab - 5 - len(letters)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(EOS)


def write_family_gguf(path, model, architecture: str, tokenizer: str = "", drop=(), extra_tensor: str = "",
                      metadata=None, label: str = "") -> None:
    """The model as llama.cpp would write it, in a Q4_K_M file's mix where the kernels have the types (Q4_0/Q4_1
    for most matrices, Q8_0 for the embeddings, attn_v and ffn_down, F32 norms and biases): llama's q/k rows
    interleaved, Gemma's norms stored as 1 + weight."""
    import gguf
    import numpy as np

    config = model.config
    family = config.model_type
    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture)
    writer = gguf.GGUFWriter(str(path), label or architecture)  # label: a file that lies about its family
    writer.add_name(f"tiny-{family}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    for key, value in (("context_length", config.max_position_embeddings), ("block_count", config.num_hidden_layers),
                       ("embedding_length", config.hidden_size), ("feed_forward_length", config.intermediate_size),
                       ("head_count", config.num_attention_heads), ("head_count_kv", config.num_key_value_heads),
                       ("layer_norm_rms_eps", config.rms_norm_eps),
                       ("rope_freq_base", (rope.get("full_attention") or rope)["rope_theta"]),
                       ("rope_dimension_count", head_dim), ("key_length", head_dim), ("value_length", head_dim),
                       ("vocab_size", config.vocab_size), ("pad_token_id", 0)):
        getattr(writer, f"add_{key}")((metadata or {}).get(key, value))  # metadata: values that lie
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    if tokenizer:
        add_tiny_tokenizer(writer, tokenizer, config.vocab_size)
    name_map = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    for index, (name, tensor) in enumerate(model.state_dict().items()):
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, _, suffix = name.rpartition(".")
        found = name_map.get_name(base)
        data = tensor.detach().to(torch.float32).numpy()
        if family.startswith("gemma") and "norm" in base:
            data = data + 1
        if architecture in ("llama", "smollm3") and found.endswith(("attn_q", "attn_k")):
            heads = config.num_attention_heads if found.endswith("attn_q") else config.num_key_value_heads
            data = data[np.argsort(gguf_decode.permuted_rows(data.shape[0], heads))]
        if f"{found}.{suffix}" in drop:
            continue
        if data.ndim == 1:
            writer.add_tensor(f"{found}.{suffix}", data)
            continue
        type_name = "Q8_0" if found == "token_embd" or found.endswith(("attn_v", "ffn_down")) else \
            ("Q4_0", "Q4_1")[index % 2]
        qtype = getattr(gguf.GGMLQuantizationType, type_name)
        writer.add_tensor(f"{found}.{suffix}", gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    if extra_tensor:
        writer.add_tensor(extra_tensor, np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# gemma and smollm3: files transformers' GGUF loader does not read, loaded by gguf_families.py
OWN_LOADER = {"gemma": ("gemma", "llama", {"tie_word_embeddings": True}),
              "smollm3": ("smollm3", "gpt2", {"tie_word_embeddings": True, "num_hidden_layers": 4,
                                             "no_rope_layers": None})}  # layer 3 without rotary, as llama.cpp's


def split_logits(forward, ids: list[int], tail: int = 3) -> torch.Tensor:
    """Logits [len(ids), vocab] of a prompt then a block of its last `tail` tokens on one cache (a prefill and a
    verify-sized block), from anything called as the native decoder is."""
    from specdec_cli.target_model.native.kv_cache import transformers_kv_cache

    cache, head = transformers_kv_cache(), len(ids) - tail
    rows = [forward(input_ids=torch.tensor([ids[:head]]), position_ids=torch.arange(head)[None],
                    past_key_values=cache).logits[0]]
    rows.append(forward(input_ids=torch.tensor([ids[head:]]), position_ids=torch.arange(head, len(ids))[None],
                        past_key_values=cache).logits[0])
    return torch.cat(rows)


def benchmark_script(name: str):
    """benchmarks/NAME.py loaded as a module (the scripts are not part of the package; their folder goes on sys.path
    for those that import a script beside them)."""
    import importlib.util

    folder = str(REPO / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def write_gguf_script():
    """benchmarks/write_gguf.py loaded as a module (it is a script, not part of the package), for as long as the
    block runs: its dataclasses look their module up in sys.modules."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_gguf", REPO / "benchmarks" / "write_gguf.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["write_gguf"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("write_gguf", None)


class IdsTokenizer:
    """Enough of a tokenizer for target_info over a model of `vocab` ids: a length, an EOS and a vocabulary to
    fingerprint (tests that feed token ids and never text)."""

    eos_token_id = TINY_EOS

    def __init__(self, vocab: int = 64) -> None:
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def get_vocab(self) -> dict:
        return {f"t{index}": index for index in range(self.vocab)}


def qwen_coder_gguf() -> Path:
    """Where the real Qwen2.5-Coder-0.5B GGUF is, if anywhere: $SPECDEC_TEST_QWEN_GGUF, else where
    benchmarks/fetch_qwen_coder.py puts it ($SPECDEC_HOME/models/, default ~/.cache/specdec/models/). Tests that
    need it skip where it is absent."""
    import os

    named = os.environ.get("SPECDEC_TEST_QWEN_GGUF")
    if named:
        return Path(named).expanduser()
    home = Path(os.environ.get("SPECDEC_HOME") or "~/.cache/specdec").expanduser()
    return home / "models" / "qwen2.5-coder-0.5b-instruct.gguf"


# -- GGUF tensors (test_quant.py, test_packed_kernels.py) ------------------------------------------------------

QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16", "F32")  # gguf.quants.quantize makes these
# where each type keeps its float16 scales: byte offsets in a block
F16_AT = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,),
          "IQ4_XS": (0,)}


def gguf_bytes(type_name: str, out_features: int, in_features: int, seed: int = 0) -> np.ndarray:
    """A GGUF tensor's bytes: quantised by gguf itself where it can, otherwise random bytes with small finite
    float16 scales where the format keeps them."""
    import gguf

    rng = np.random.default_rng(seed)
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    if type_name in QUANTIZABLE:
        weights = rng.standard_normal((out_features, in_features)).astype(np.float32) * 0.1
        return np.asarray(gguf.quants.quantize(weights, qtype)).view(np.uint8).reshape(out_features, -1)
    size, per = gguf_decode.GGUF_BLOCKS[type_name]
    raw = rng.integers(0, 256, (out_features, in_features // per, size), dtype=np.uint8)
    for at in F16_AT[type_name]:
        scales = (rng.random((out_features, in_features // per)) * 0.01).astype(np.float16)
        raw[..., at : at + 2] = scales.view(np.uint8).reshape(out_features, in_features // per, 2)
    return raw.reshape(out_features, -1)


def not_a_file(path: Path, kind: str) -> None:
    """Put a FIFO, or a symbolic link to /dev/zero (a device that reads without end), at `path`."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


# the tiny target's distill prompts (test_distill.py, test_native_tokenizer.py)
DISTILL_PROMPTS = ["hello there, how are you?", "add 2 and 3.", "name a colour.", "write one word.", "what is a cat?"]
