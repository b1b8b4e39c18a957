"""What a drafter proposes, what the engine reports back after each step, and the drafter protocol.

A `Draft` is a token tree flattened with every parent before its children. Node indices count from 0 over
the drafted tokens; `parents[i]` is the index of node i's parent, or -1 when its parent is the root (the last
committed token, which the target scores in the same forward). Tree drafters list their most promising nodes
first, so that any prefix the engine keeps (it trims drafts to what pays off) is the best subtree of that
size. A chain is the tree whose parents are -1, 0, 1, ...; it is the common case and `parents=None` spells it.

A `StepEvent` is emitted by the engine once per target forward (and once for the prefill). Displays,
statistics and drafters all read the same events; a drafter that needs more from the engine gets it here.
This module holds data only: no torch import at module load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .generation_config import GenerationConfig

EventKind = Literal["prefill", "step"]  # the prompt processed (first token chosen), or one verify forward
FinishReason = Literal["eos", "stop", "length"]  # the target's EOS, a stop string, or the token budget


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # drafted token ids, parents first; the root (last committed token) is not included
    source: str  # which drafter (or hybrid source) produced it: "pld", "sam-static", ...
    parents: Optional[list[int]] = None  # None = chain; else parent index per node, -1 = root
    p_draft: Optional["torch.Tensor"] = None  # [len(tokens), vocab] draft distributions; None = deterministic
    match_len: int = 0  # length of the context match the draft continues (retrieval drafters), 0 = n/a

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    def __len__(self) -> int:
        return len(self.tokens)

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


@dataclass(kw_only=True)  # built by keyword only: its fields are many, and most are optional
class StepEvent:
    kind: EventKind
    draft: Draft  # what was proposed (empty for the prefill and for plain decoding)
    accepted: int  # how many draft tokens the target accepted (along the accepted path)
    committed: list[int]  # tokens appended to the context by this event: accepted drafts + target's token
    target_token: int  # the target's own token: correction at the first mismatch, or the bonus token
    accepted_path: list[int] = field(default_factory=list)  # node indices of the accepted drafts
    context_len: int = 0  # committed context length after this event (prompt included)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prompt_tokens: Sequence[int] = ()  # prefill only: the prompt as fed to the target
    settings: Optional["GenerationConfig"] = None  # prefill only: the generation settings in force
    finished: Optional[FinishReason] = None  # on the last event of a generation
    scored_topk: Optional[list[list[int]]] = None  # step only: target's top-8 ids after root and each node
    verify_rows: int = 0  # step only: rows of the verify forward (len(draft) + 1, more when padded)
    # the target's last hidden states (after its final norm: what its LM head reads) at the positions this event
    # scored and committed: prefill [prompt_len, hidden]; step [1 + accepted, hidden] (the root and the accepted
    # drafts). The newest committed token has none until the next forward scores it. Views of tensors the
    # forward computed anyway (feature-level drafters read them; others ignore them).
    features: Optional["torch.Tensor"] = None


@runtime_checkable
class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], budget: int) -> Draft: ...

    def observe(self, event: StepEvent) -> None: ...
