"""Drafter registry: names on the command line -> drafter objects.

`make_drafter(name, options, target)` is the only constructor the CLI, bench and chat use, so a drafter
added here appears everywhere. Heavy modules are imported only when their drafter is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from ..decoding.draft import Drafter
from ..defaults import DEFAULT_AUX, DEFAULT_L_BIAS
from ..errors import SpecdecError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..target_model.quant import BlockLinear

DRAFTERS = {
    "none": "plain decoding through the same loop (the baseline)",
    "pld": "prompt lookup: continue the longest recent n-gram match in the context",
    "sam": "suffix automata over the conversation and an optional static index (SAM-Decoding)",
    "recycle": "Token Recycling: a tree from the target's own recent top-8 predictions per token",
    "aded": "ADED: an adaptive tri-gram table searched with PUCT into a token tree",
    "model": "a small draft model with the target's tokenizer (see `specdec distill`)",
    "eagle": "a draft head on the target's own hidden states (EAGLE-style; `specdec distill train --kind eagle`)",
}


@dataclass(frozen=True)
class TargetWeights:
    """The target's frozen token embeddings and LM head, read (never trained) by feature-level heads (eagle)."""

    embedding: "Union[torch.Tensor, torch.nn.Embedding]"  # [vocab, hidden] rows, or a table that looks rows up
    lm_head: "Union[torch.Tensor, BlockLinear]"  # [vocab, hidden] dense rows, or the target's block layer (quant.py)
    lm_bias: Optional["torch.Tensor"] = None  # [vocab], when the LM head has one
    embed_scale: Optional[float] = None  # what the embedding layer multiplies looked-up rows by (Gemma 3's)

    def embed(self, ids: "torch.Tensor") -> "torch.Tensor":
        """Token ids [...] -> their embeddings [..., hidden], as the target's embedding layer gives them."""
        import torch

        if isinstance(self.embedding, torch.Tensor):
            rows = torch.nn.functional.embedding(ids, self.embedding)
        else:  # a GGUF's table left in the file (target_model/gguf_model.MappedEmbedding): only these rows are read
            rows = self.embedding.rows(ids.reshape(-1)).reshape(*ids.shape, -1)  # type: ignore[operator]
        return rows if self.embed_scale is None else rows * torch.tensor(self.embed_scale, dtype=rows.dtype)

    @property
    def vocab_size(self) -> int:
        import torch

        embedding = self.embedding
        return int(embedding.shape[0] if isinstance(embedding, torch.Tensor) else embedding.num_embeddings)

    def dense_lm_head(self) -> "torch.Tensor":
        """The LM head's weight [vocab, hidden] as dense rows (a block head unpacked: a float32 copy)."""
        import torch

        lm_head = self.lm_head
        return lm_head if isinstance(lm_head, torch.Tensor) else lm_head.weight.detach()


def target_weights(model: Any) -> Optional[TargetWeights]:
    """The embeddings and LM head of a loaded target, or None when its logits are not a plain linear map of its last
    hidden states (a softcap) or its layers are not an embedding table and a linear (or block) head."""
    import torch

    from ..target_model.quant import BlockLinear

    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(embeddings, torch.nn.Embedding) or head is None:
        return None
    scale = getattr(embeddings, "embed_scale", None)  # (transformers' scaled embeddings keep it as a buffer)
    bias = getattr(head, "bias", None)
    bias = bias.detach() if isinstance(bias, torch.Tensor) else None
    if isinstance(head, BlockLinear):  # (its `weight` would unpack and keep a float32 copy: test the type first)
        lm_head: Union[torch.Tensor, BlockLinear] = head
    elif isinstance(getattr(head, "weight", None), torch.Tensor):
        lm_head = head.weight.detach()
    else:
        return None
    table = embeddings if hasattr(embeddings, "rows") else embeddings.weight.detach()  # (rows: read on demand)
    return TargetWeights(table, lm_head, bias, None if scale is None else float(scale))


@dataclass(frozen=True)
class TargetInfo:
    """What drafters may know about the target without holding the model."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    fingerprint: str = ""  # tokenizer fingerprint (see specdec_cli.texts.fingerprint)
    device: str = "cpu"  # where the target runs: a draft model is put there too
    hidden_size: int = 0  # width of the target's last hidden state (the features step events carry)
    weights: Optional[TargetWeights] = field(default=None, compare=False, repr=False)  # for feature-level heads


@dataclass
class DrafterOptions:
    draft_max: Optional[int] = None  # longest draft; None = the drafter's own default
    index: Optional[str] = None  # static suffix-automaton index file (sam)
    l_bias: int = DEFAULT_L_BIAS  # sam: static match must beat the dynamic one by more than this
    l_threshold: int = 1  # sam: below this match length the auxiliary drafter takes over (= sam.L_THRESHOLD)
    aux: str = DEFAULT_AUX  # sam: the auxiliary drafter (recycle, aded, model, pld) or "none"
    pld_max_ngram: int = 3  # pld: longest n-gram to look up
    pld_min_ngram: int = 1  # pld: shortest n-gram to look up
    draft_model: Optional[str] = None  # model: directory of the draft model
    draft_min_prob: float = 0.0  # model: stop a chain when the draft's top probability falls below this
    memory: Optional[str] = None  # sam: an answer-memory directory read as a static index (memory.py)
    aded_time_budget: Optional[float] = None  # aded: seconds of tree search per draft; None = aded.TIME_BUDGET


HYBRID_HEAD = "sam"  # `sam+recycle` = sam with recycle as its auxiliary drafter (same as `sam --aux recycle`)
AUX_CHOICES = ("recycle", "aded", "model", "eagle", "pld", "none")  # `sam+none`: the suffix automata alone


def check_aux(aux: str) -> None:
    """A one-line SpecdecError unless `aux` is a drafter sam can hand over to (or "none")."""
    if aux not in AUX_CHOICES:
        raise SpecdecError(f"aux {aux}: the auxiliary drafter must be one of {', '.join(AUX_CHOICES)}", setting="aux")


def split_hybrid(name: str) -> tuple[str, Optional[str]]:
    """`"sam+aded"` -> `("sam", "aded")`; a plain name -> `(name, None)`. Raises on a malformed hybrid."""
    name = name.strip().lower()
    if "+" not in name:
        return name, None
    head, _, aux = name.partition("+")
    if head != HYBRID_HEAD or aux not in AUX_CHOICES:
        raise SpecdecError(f"unknown drafter {name!r}: a hybrid is sam+AUX with AUX one of {', '.join(AUX_CHOICES)}")
    return head, aux


def drafters_in(name: str, options: DrafterOptions) -> tuple[str, Optional[str]]:
    """The drafter named `name` and the auxiliary it runs with under `options`: a hybrid's own, else `--aux` for
    `sam`, else None."""
    head, aux = split_hybrid(name)
    return head, aux if aux is not None else (options.aux if head == HYBRID_HEAD else None)


def check_drafter(name: str) -> None:
    """Raise a one-line SpecdecError unless `name` is a drafter `make_drafter` can build."""
    head, _ = split_hybrid(name)
    if head not in DRAFTERS:
        raise SpecdecError(f"unknown drafter {name!r}; choose one of: {', '.join(DRAFTERS)}, sam+AUX")


def check_drafter_options(name: Union[str, Sequence[str]], options: DrafterOptions) -> None:
    """What can be checked of the options of a drafter (or of several that run with the same options, as bench's
    do) before the target loads: every option set is used by one of them (`check_options_used`), the files they
    will open exist and are what they claim to be, and the drafter a hybrid needs is named (a tokenizer match is
    checked at build)."""
    names = [name] if isinstance(name, str) else list(name)
    check_options_used(names, options)
    for one in names:
        _check_files(one, options)


def check_options_used(names: Sequence[str], options: DrafterOptions) -> None:
    """A one-line error for an option none of `names` uses (`--index` with pld, `--draft-model` with sam, ...): an
    option silently ignored would measure or answer something else than the user asked for. An option counts as
    set when it differs from its default (`--aux none`, the default, cannot be told from no --aux)."""
    pairs = [drafters_in(name, options) for name in names]
    using = {drafter for pair in pairs for drafter in pair if drafter is not None}
    plain_sam = any(split_hybrid(name) == (HYBRID_HEAD, None) for name in names)
    chosen = ", ".join(names) or "no drafter"

    def unused(setting: str, shown: str, users: str) -> SpecdecError:
        return SpecdecError(f"{setting} {shown}: {chosen} does not use it ({users})", setting=setting)

    if options.index and not using & {"sam", "aded"}:
        raise unused("index", options.index, "an index is read by sam and aded")
    if options.draft_model and not using & {"model", "eagle"}:
        raise unused("draft_model", options.draft_model, "a draft model is run by model and eagle, or sam+model "
                     "and sam+eagle")
    if options.draft_min_prob and not using & {"model", "eagle"}:
        raise unused("draft_min_prob", str(options.draft_min_prob), "only model and eagle drafts have probabilities")
    if options.aux != DEFAULT_AUX and not plain_sam:
        raise unused("aux", options.aux, f"--aux picks {HYBRID_HEAD}'s auxiliary; a {HYBRID_HEAD}+AUX drafter "
                     "names its own")
    if options.memory and HYBRID_HEAD not in {head for head, _ in pairs}:
        raise unused("memory", options.memory, f"only {HYBRID_HEAD} drafts from the answer memory")
    if options.l_threshold != DrafterOptions.l_threshold and HYBRID_HEAD not in {head for head, _ in pairs}:
        raise unused("l_threshold", str(options.l_threshold), f"it is {HYBRID_HEAD}'s")


def _check_files(name: str, options: DrafterOptions) -> None:
    from pathlib import Path

    head, aux = drafters_in(name, options)
    if aux is not None:
        check_aux(aux)
    if options.index and (head in ("sam", "aded") or aux == "aded"):
        from ..sam.index import read_index_info

        read_index_info(options.index)  # a missing, foreign or truncated file fails here, in a millisecond
    if options.memory and head == HYBRID_HEAD and not Path(options.memory).expanduser().is_dir():
        raise SpecdecError(f"memory {options.memory}: no such directory (`specdec memory info` shows where the "
                           "memory lives)", setting="memory")
    if "eagle" in (head, aux):
        if not options.draft_model:
            raise SpecdecError("the eagle drafter needs a head directory (make one with `specdec distill train "
                               "--kind eagle`)", setting="draft_model")
        from .eagle_head import read_head_meta

        read_head_meta(options.draft_model)
    if "model" in (head, aux):
        if not options.draft_model:
            raise SpecdecError("the model drafter needs a draft model directory (make one with `specdec distill`)",
                               setting="draft_model")
        folder = Path(options.draft_model).expanduser()
        if not (folder / "config.json").is_file():
            state = "no such directory" if not folder.exists() else "not a model directory (no config.json)"
            raise SpecdecError(f"draft_model {options.draft_model}: {state}", setting="draft_model")
        from ..target_model.models import refuse_pickled_weights

        refuse_pickled_weights(folder, f"draft_model {options.draft_model}", "draft_model")


EAGLE_MIN_PROB = 0.1  # eagle's default --draft-min-prob in chat and bench (drafters/eagle.py, docs/measurements.md)


def min_prob_in_force(name: str, options: DrafterOptions) -> Optional[float]:
    """The probability floor a drafter (or hybrid) named `name` drafts with under `options`: --draft-min-prob, or
    eagle's own default when it is 0; None for drafters that have no floor (retrieval and tables)."""
    head, aux = drafters_in(name, options)
    if "eagle" in (head, aux):
        return options.draft_min_prob or EAGLE_MIN_PROB
    if "model" in (head, aux):
        return options.draft_min_prob
    return None


def is_drafter(name: str) -> bool:
    """True for a registered drafter name or a valid `sam+AUX` hybrid."""
    try:
        check_drafter(name)
    except SpecdecError:
        return False
    return True


def make_drafter(name: str, options: DrafterOptions, target: TargetInfo) -> Drafter:
    name, aux = split_hybrid(name)
    if aux is not None:
        options = replace(options, aux=aux)
    if name == "none":
        from .none import NoDrafter

        return NoDrafter()
    if name == "pld":
        from .pld import PromptLookupDrafter

        return PromptLookupDrafter(
            max_ngram=options.pld_max_ngram, min_ngram=options.pld_min_ngram, draft_max=options.draft_max,
            vocab_size=target.vocab_size,
        )
    if name == "sam":
        from .sam import make_sam_drafter

        return make_sam_drafter(options, target)
    if name == "recycle":
        from .recycle import make_recycle_drafter

        return make_recycle_drafter(options, target)
    if name == "aded":
        from .aded import make_aded_drafter

        return make_aded_drafter(options, target)
    if name == "model":
        from .model import make_model_drafter

        return make_model_drafter(options, target)
    if name == "eagle":
        from .eagle import make_eagle_drafter

        return make_eagle_drafter(options, target)
    check_drafter(name)
    raise AssertionError(f"drafter {name!r} is registered but has no constructor")
