"""What a drafter proposes, what the engine reports back after each step, and the drafter protocol.

A `Draft` is a token tree flattened with every parent before its children. Node indices count from 0 over
the drafted tokens; `parents[i]` is the index of node i's parent, or -1 when its parent is the root (the last
committed token, which the target scores in the same forward). Tree drafters list their most promising nodes
first, so that any prefix the engine keeps (it trims drafts to what pays off) is the best subtree of that
size. A chain is the tree whose parents are -1, 0, 1, ...; it is the common case and `parents=None` spells it.

A `StepEvent` is emitted by the engine once per target forward (and once for the prefill). Displays,
statistics and drafters all read the same events. What costs the engine extra work (the target's top tokens at
every scored position, its hidden states) is on an event only when the drafter in use asks for it: a drafter
declares what it reads in `needs`, and the engine computes that and nothing else, once per generation.
This module holds data only: no torch import at module load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .generation_config import GenerationConfig
    from .logprobs import TokenLogprob

EventKind = Literal["prefill", "step"]  # the prompt processed (first token chosen), or one verify forward
FinishReason = Literal["eos", "stop", "length"]  # the target's EOS, a stop string, or the token budget


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # drafted token ids, parents first; the root (last committed token) is not included
    source: str  # which drafter (or hybrid source) produced it: "pld", "sam-static", ...
    parents: Optional[list[int]] = None  # None = chain; else parent index per node, -1 = root
    p_draft: Optional["torch.Tensor"] = None  # [len(tokens), vocab] draft distributions; None = deterministic
    match_len: int = 0  # length of the context match the draft continues (retrieval drafters), 0 = n/a
    # per node: the drafter's estimate that the target accepts the node's whole path (a merged tree's, learned from
    # its sources' records); the planner weighs a prefix's sum, the expected accepted length. None = no estimate.
    confidence: Optional[list[float]] = None

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    @property
    def node_parents(self) -> list[int]:
        """Every node's parent index, a chain's too (-1, 0, 1, ...)."""
        return list(range(-1, len(self.tokens) - 1)) if self.parents is None else list(self.parents)

    def __len__(self) -> int:
        return len(self.tokens)

    def row_paths(self) -> list[list[int]]:
        """The tokens each verify row comes after, beyond the context: [] for the root's row, then each node's path
        from the root (itself last)."""
        paths: list[list[int]] = [[]]
        for node, parent in enumerate(self.node_parents):  # parents come before their children
            paths.append(paths[parent + 1] + [int(self.tokens[node])])
        return paths

    @property
    def depth(self) -> int:
        """The longest path from the root: len(tokens) for a chain."""
        if self.parents is None:
            return len(self.tokens)
        depths: list[int] = []
        for parent in self.parents:  # parents come before their children
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)

    @staticmethod
    def empty(source: str) -> "Draft":
        return Draft(tokens=[], source=source)


@dataclass(frozen=True)
class Needs:
    """What a drafter reads from step events beyond the tokens, each costing the engine work on every step."""

    scored_topk: bool = False  # the target's top-8 token ids at every scored position (a torch.topk per step)
    features: bool = False  # the target's last hidden states (requested from every forward)
    # with features: the target layers whose input states are read instead, side by side (EAGLE-3's three); () =
    # the last hidden state after the final norm
    feature_layers: tuple[int, ...] = ()

    def __or__(self, other: "Needs") -> "Needs":
        """What two drafters read together (a hybrid and its auxiliary; at most one of them reads features)."""
        return Needs(self.scored_topk or other.scored_topk, self.features or other.features,
                     self.feature_layers or other.feature_layers)


NOTHING = Needs()  # a drafter that reads tokens only


@dataclass(kw_only=True)  # built by keyword only: its fields are many, and most are optional
class StepEvent:
    kind: EventKind
    draft: Draft  # what was verified (empty for the prefill and for plain decoding)
    committed: list[int]  # tokens appended to the context by this event: accepted drafts + target's own token
    # node indices of the accepted drafts (a chain's: 0, 1, ..., accepted - 1); the target's own token follows
    # them in `committed` (unless a stop string or the token budget cut it)
    accepted_path: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prompt_tokens: Sequence[int] = ()  # prefill only: the prompt as fed to the target
    settings: Optional["GenerationConfig"] = None  # prefill only: the generation settings in force
    finished: Optional[FinishReason] = None  # on the last event of a generation
    # step only, for a drafter whose needs say so: the target's top-8 ids after the root and after each node
    scored_topk: Optional[list[list[int]]] = None
    verify_rows: int = 0  # step only: rows of the verify forward (len(draft) + 1, more when padded)
    # the target's last hidden states (after its final norm: what its LM head reads) at the positions this event
    # scored and committed: prefill [prompt_len, hidden]; step [1 + accepted, hidden] (the root and the accepted
    # drafts). The newest committed token has none until the next forward scores it. Only for a drafter whose
    # needs say so (None otherwise).
    features: Optional["torch.Tensor"] = None
    # the committed tokens' log probabilities (logprobs.py), where the generation asks for them (None otherwise)
    logprobs: Optional[list["TokenLogprob"]] = None

    @property
    def accepted(self) -> int:
        """How many draft tokens the target accepted (along the accepted path)."""
        return len(self.accepted_path)


@runtime_checkable
class Drafter(Protocol):
    """`name` names the drafter (drafts name their own `source`); `needs` is what it reads from step events beyond
    the tokens (read once per generation: the engine computes only that). `propose(context, budget)` returns at
    most `budget` tokens (nodes) to follow `context`; `observe(event)` is told every event, the prefill included;
    `reset()` forgets the conversation (the next context starts a new one; static indexes and what was learned of
    the target's habits may stay). Whether a draft is worth its verification, or its drafting, is the engine's
    planner's call alone (planner.py): a drafter drafts what it is asked for."""

    name: str
    needs: Needs

    def propose(self, context: Sequence[int], budget: int) -> Draft: ...

    def observe(self, event: StepEvent) -> None: ...

    def reset(self) -> None: ...


class NoDrafter:
    """The drafter of plain decoding: never drafts, so the engine's loop is plain autoregressive decoding (the
    `none` drafter, and plain_many's)."""

    name = "none"
    needs = NOTHING

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        return Draft.empty(self.name)

    def observe(self, event: StepEvent) -> None:
        pass

    def reset(self) -> None:
        pass
