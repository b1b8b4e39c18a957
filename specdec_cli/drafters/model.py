"""The `model` drafter: a small causal LM with the target's tokenizer drafts a chain token by token.

The draft keeps its own KV cache and the token sequence that cache holds. Each `propose` compares that
sequence with the committed context, crops the cache to their common prefix (which rolls back rejected
drafts, and keeps the accepted ones: they were fed while drafting) and feeds only the missing tokens. It
then drafts up to `min(budget, draft_max)` tokens: the draft's argmax under greedy decoding, or a sample
from its distribution warped exactly like the target's (temperature, top-k, top-p, read from the prefill
event's settings) under speculative sampling, returning those distributions as `p_draft`. The chain stops
early when the draft's own top probability falls below `min_prob`, and after an EOS.

Every drafted token costs a forward, so how long a chain is worth drafting is the engine's planner's call: it
charges the drafting time per token, and asks (through `budget`) for the length that pays, or for nothing
(with a probe now and then). The drafter drafts what it is asked for.

A draft trained by `specdec distill` usually predicts only a subset of the vocabulary (`head_tokens` in its
`specdec_draft.json`: the tokens its training data and its target use most), which cuts its largest matrix,
the output head, and so its cost per drafted token. Tokens seen in the context are added to that subset as
they appear, so names and code identifiers of the conversation can still be drafted. Every other token
gets probability 0 in `p_draft`, which speculative sampling handles exactly (the draft never proposes it).

A draft whose vocabulary or tokenizer differs from the target's is refused: its token ids would mean other
strings. This module loads the draft directory; it does not train drafts (specdec_cli/distill does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from ..decoding.draft import NOTHING, Draft, StepEvent
from ..errors import SpecdecError
from ..files import read_json
from ..target_model.load.target_source import refuse_pickled_weights
from ..texts.fingerprint import tokenizer_fingerprint
from .spec import DrafterOptions, DrafterSpec
from .target import TargetInfo
from .token_ids import check_token_ids

# Draft forwards per step when --draft-max is not given: one per drafted token, so a chain stops below the engine's
# default budget (a drafted token costs a forward here, not a lookup). --draft-max sets both.
FORWARDS_PER_DRAFT = 6
DRAFT_META = "specdec_draft.json"  # written by `specdec distill train` next to the weights


def split_model(model: Any) -> tuple[Any, Any]:
    """(base transformer, output head) when logits are a plain linear map of the last hidden state, else
    (None, None)."""
    config = model.config
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None, None
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if base is None or head is None or base is model or not hasattr(head, "weight"):
        return None, None
    return base, head


class DraftHead:
    """The draft's output head restricted to `head_tokens` plus the tokens seen so far (or the full head).

    `logits(hidden)` returns full-width logits [n, vocab] with -inf outside the allowed set, so argmax,
    softmax and the sampling warps work unchanged.
    """

    def __init__(self, model: Any, head_tokens: Optional[Sequence[int]], vocab_size: int) -> None:
        import torch

        self.base, head = split_model(model)
        self.vocab_size = vocab_size
        self.restricted = bool(head_tokens) and self.base is not None
        if not self.restricted or head_tokens is None:
            return
        ids = sorted({int(token) for token in head_tokens if 0 <= int(token) < vocab_size})
        self.ids = torch.tensor(ids, dtype=torch.long, device=head.weight.device)  # [K]
        self.weight = head.weight.detach()[self.ids].contiguous()  # [K, H]
        bias = getattr(head, "bias", None)
        self.bias = None if bias is None else bias.detach()[self.ids].contiguous()
        self.head = head
        self.allowed = torch.zeros(vocab_size, dtype=torch.bool)
        self.allowed[ids] = True
        self.static_count = len(ids)

    def reset(self) -> None:
        """Drop the context tokens added so far (back to the trained subset)."""
        if self.restricted and self.ids.numel() > self.static_count:
            self.allowed[self.ids[self.static_count :].cpu()] = False
            self.ids = self.ids[: self.static_count]
            self.weight = self.weight[: self.static_count]
            self.bias = None if self.bias is None else self.bias[: self.static_count]

    def add(self, tokens: Sequence[int]) -> None:
        """Allow tokens that appeared in the context."""
        if not self.restricted:
            return
        import torch

        wanted = {int(token) for token in tokens}
        new = sorted(token for token in wanted if 0 <= token < self.vocab_size and not self.allowed[token])
        if not new:
            return
        self.allowed[new] = True
        extra = torch.tensor(new, dtype=torch.long, device=self.ids.device)
        self.ids = torch.cat([self.ids, extra])
        self.weight = torch.cat([self.weight, self.head.weight.detach()[extra]])
        if self.bias is not None:
            self.bias = torch.cat([self.bias, self.head.bias.detach()[extra]])

    def logits(self, hidden: Any) -> Any:
        """hidden [n, H] -> logits [n, vocab] (float32), -inf outside the allowed tokens."""
        import torch

        sub = hidden.to(self.weight.dtype) @ self.weight.T  # [n, K]
        if self.bias is not None:
            sub = sub + self.bias
        full = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        full[:, self.ids] = sub.float()
        return full


class ModelDrafter:
    name = "model"
    needs = NOTHING  # tokens only

    def __init__(
        self,
        model: Any,
        *,
        draft_max: Optional[int] = None,
        min_prob: float = 0.0,
        eos_token_ids: Sequence[int] = (),
        name: str = "model",
        head_tokens: Optional[Sequence[int]] = None,
    ) -> None:
        import torch

        self.model = model
        self.head = DraftHead(model, head_tokens, draft_vocab_size(model))
        self.draft_max = FORWARDS_PER_DRAFT if draft_max is None else int(draft_max)
        if self.draft_max < 0:
            raise SpecdecError(f"draft_max must be >= 0, got {self.draft_max}", setting="draft_max")
        if not 0.0 <= min_prob <= 1.0:
            raise SpecdecError(f"draft_min_prob must be in [0, 1], got {min_prob}", setting="draft_min_prob")
        self.min_prob = float(min_prob)
        self.eos = frozenset(int(token) for token in eos_token_ids)
        self.name = name
        self.device = next(model.parameters()).device
        self.temperature = 0.0
        self.top_k = 0
        self.top_p = 1.0
        self.min_p = 0.0
        self.generator: Optional[torch.Generator] = None
        self.forwards = 0  # draft forwards so far (for statistics and tests)
        self.reset()

    def reset(self) -> None:
        """Forget the cache (the next propose feeds the whole context)."""
        self.cache: Any = None
        self.head.reset()
        self.tokens: list[int] = []  # the token sequence whose keys and values the cache holds

    # -- the engine's two calls --------------------------------------------------------------------------

    def observe(self, event: StepEvent) -> None:
        if event.kind != "prefill":
            return
        settings = event.settings
        self.temperature = settings.temperature if settings is not None else 0.0
        self.top_k = settings.top_k if settings is not None else 0
        self.top_p = settings.top_p if settings is not None else 1.0
        self.min_p = settings.min_p if settings is not None else 0.0
        self.generator = None
        if self.temperature > 0:
            import torch

            self.generator = torch.Generator(device="cpu")
            seed = settings.seed if settings is not None else None
            # a seeded run is reproducible; the offset keeps the draft's stream apart from the engine's
            self.generator.manual_seed(int(seed) + 7919 if seed is not None else torch.seed())

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        limit = min(int(budget), self.draft_max)
        if limit <= 0 or not len(context):
            return Draft.empty(self.name)
        ids = [int(token) for token in context]
        check_token_ids(ids, self.head.vocab_size)  # an id beyond the draft's embeddings would fail inside torch
        import torch

        with torch.inference_mode():
            logits = self._sync(ids)  # [vocab]
            tokens: list[int] = []
            rows: list[torch.Tensor] = []
            sampling = self.temperature > 0
            for position in range(limit):
                if sampling:
                    from ..decoding.sampling import sample, warp_probs

                    probs = warp_probs(logits, self.temperature, self.top_k, self.top_p, self.min_p)  # [vocab]
                    token = sample(probs, self.generator)
                    top = float(probs.max())
                else:
                    token = int(logits.argmax())
                    top = float(torch.softmax(logits.float(), dim=-1)[token]) if self.min_prob > 0 else 1.0
                if top < self.min_prob:
                    break
                tokens.append(token)
                if sampling:
                    rows.append(probs)
                if token in self.eos or position + 1 == limit:
                    break
                logits = self._feed([token])
        p_draft = torch.stack(rows) if rows else None  # [len(tokens), vocab], on the draft's device
        return Draft(tokens, self.name, None, p_draft)

    # -- the draft's own cache ---------------------------------------------------------------------------

    def _sync(self, context: list[int]) -> Any:
        """Bring the cache to `context` minus its last token and feed what is missing; next-token logits."""
        held = len(self.tokens)
        if held <= len(context) and context[:held] == self.tokens:
            common = held
        else:
            common = 0
            for mine, theirs in zip(self.tokens, context):
                if mine != theirs:
                    break
                common += 1
        common = min(common, len(context) - 1)  # the last token is always fed: its logits are needed
        if common == 0:
            self.reset()
        elif common < held:
            self.cache.crop(common - self.cache.get_seq_length())  # negative: drop that many entries
            del self.tokens[common:]
        return self._feed(context[common:])

    def _feed(self, tokens: list[int]) -> Any:
        import torch
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        start = len(self.tokens)
        input_ids = torch.tensor([tokens], device=self.device)  # [1, n]
        position_ids = torch.arange(start, start + len(tokens), device=self.device).unsqueeze(0)  # [1, n]
        self.forwards += 1
        self.tokens.extend(tokens)
        if self.head.restricted:
            self.head.add(tokens)
            out = self.head.base(input_ids=input_ids, position_ids=position_ids, past_key_values=self.cache,
                                 use_cache=True)
            return self.head.logits(out.last_hidden_state[0, -1:])[0]  # [vocab]
        out = self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()  # [vocab]


# -- loading a draft directory -------------------------------------------------------------------------


def draft_vocab_size(model: Any, tokenizer: Any = None) -> int:
    """The width of the draft's logits (the target's is computed the same way in chat.target_info)."""
    size = int(getattr(model.config, "vocab_size", 0) or 0)
    if tokenizer is not None:
        size = max(size, len(tokenizer))
    return size


def read_draft_meta(directory: Path) -> dict:
    return read_json(directory / DRAFT_META)


def check_draft_compatible(where: str, draft_vocab: int, draft_fingerprint: str, target: Any) -> None:
    """Refuse a draft whose token ids would not mean the target's tokens."""
    target_fp = getattr(target, "fingerprint", "") or ""
    if draft_fingerprint and target_fp and draft_fingerprint != target_fp:
        raise SpecdecError(
            f"draft model {where} uses another tokenizer than the target (draft vocabulary {draft_vocab}, "
            f"tokenizer {draft_fingerprint}; target vocabulary {target.vocab_size}, tokenizer {target_fp}); "
            "a draft must share the target's tokenizer"
        )
    if draft_vocab != int(target.vocab_size):
        raise SpecdecError(
            f"draft model {where} has a vocabulary of {draft_vocab} tokens but the target has {target.vocab_size} "
            f"(draft tokenizer {draft_fingerprint or 'unknown'}, target tokenizer {target_fp or 'unknown'}); "
            "a draft must share the target's tokenizer"
        )


def load_draft_model(directory: str, target: Any, device: Any = "cpu", dtype: Any = None) -> tuple[Any, Any, dict]:
    """(model, tokenizer or None, specdec metadata) from a draft directory, refused unless its vocabulary and
    tokenizer fit `target` (anything with `vocab_size` and `fingerprint`); one-line errors."""
    path = Path(directory).expanduser()
    if not path.exists():
        raise SpecdecError(f"draft_model {directory}: no such directory", setting="draft_model")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise SpecdecError(f"draft_model {directory}: not a model directory (no config.json)", setting="draft_model")

    refuse_pickled_weights(path, f"draft_model {directory}", "draft_model")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = None
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except Exception:  # a model directory with a broken tokenizer: the vocabulary check still applies
            tokenizer = None
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32, use_safetensors=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecdecError(f"draft_model {directory}: cannot load the model: {first}", setting="draft_model") from exc
    model.to(device)
    model.eval()
    meta = read_draft_meta(path)

    fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else str(meta.get("fingerprint", ""))
    check_draft_compatible(str(directory), draft_vocab_size(model, tokenizer), fingerprint, target)
    return model, tokenizer, meta


def _draft_model_dir(options: DrafterOptions) -> str:
    if not options.draft_model:
        raise SpecdecError("the model drafter needs a draft model directory (make one with `specdec distill`)",
                           setting="draft_model")
    return options.draft_model


def make_model_drafter(options: DrafterOptions, target: TargetInfo, draft_max: Optional[int] = None) -> ModelDrafter:
    # on the target's device (a draft on the CPU beside a target on a GPU would copy every step's tokens across)
    model, _, meta = load_draft_model(_draft_model_dir(options), target, target.device)
    return ModelDrafter(model, draft_max=draft_max, min_prob=options.draft_min_prob,
                        eos_token_ids=target.eos_token_ids, head_tokens=meta.get("head_tokens"))


def check_model(options: DrafterOptions) -> None:
    """The draft model directory exists, holds a config.json and no pickled weights (before the target loads)."""
    folder = Path(_draft_model_dir(options)).expanduser()
    if not (folder / "config.json").is_file():
        state = "no such directory" if not folder.exists() else "not a model directory (no config.json)"
        raise SpecdecError(f"draft_model {options.draft_model}: {state}", setting="draft_model")

    refuse_pickled_weights(folder, f"draft_model {options.draft_model}", "draft_model")


SPEC = DrafterSpec(name="model", help="a small draft model with the target's tokenizer (see `specdec distill`)",
                   build=make_model_drafter, options=("draft_model", "draft_min_prob"), check=check_model,
                   aux_rank=3, min_prob=0.0)
