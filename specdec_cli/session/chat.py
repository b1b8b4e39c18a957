"""A conversation with the target: prompt formatting, history, and one answer per turn.

`ChatSettings` is everything a session is made from (one run's settings, run_settings.py, and the system
message), checked before the slow model load; `open_session` loads the target and builds the `ChatSession`,
which holds the loaded target, the engine, the drafter (which lives as long as the conversation, so its automata
and tables keep learning), the prompt cache (a turn computes only the tokens the previous turn did not) and the
message history. `generate` is one answer to token ids (what `specdec serve` calls per request); `ask` is a turn,
its prompt formatted by texts/prompt_ids.py. Rendering is the CLI's job; nothing here prints.
"""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from ..decoding.draft import Drafter
from ..decoding.engine import Engine, EventCallback, Generation, GenerationConfig
from ..decoding.prompt_cache import PromptCache
from ..drafters import TargetInfo, make_drafter, target_info
from ..drafters.none import NoDrafter
from ..errors import SpecdecError
from ..target_model.load import models
from ..target_model.load.forward_choice import choose_forward
from ..texts.memory import Memory, memory_cap, memory_dir, memory_enabled
from ..texts.prompt_ids import format_prompt, next_turn_ids, with_system
from .compare import Comparison, compare
from .run_settings import RunSettings

AHEAD_MOST = 32  # tokens a next turn's opening is computed ahead at most (a template's is under 10)


@dataclass(frozen=True)
class ChatSettings:
    """What a chat session is made from: one run's settings (the target and how to load it, the drafter,
    generation), and what is the conversation's own."""

    run: RunSettings = field(default_factory=RunSettings)
    system: Optional[str] = None
    remember: bool = True  # remember answers and let `sam` draft from them (memory.py; SPECDEC_NO_MEMORY=1 = off)

    def check(self) -> None:
        """Everything that can be checked without the model (so a bad setting fails in the first second)."""
        if self.run.drafter.name is None:
            raise SpecdecError("a chat drafts with one drafter: name it", setting="drafter")
        self.run.check()


def open_session(settings: ChatSettings,
                 on_status: Optional[Callable[[str], None]] = None) -> tuple["ChatSession", models.LoadedTarget]:
    """Check the settings, load the target (the slow part), and start a conversation."""
    settings.check()
    run, load = settings.run, settings.run.load
    use_memory = settings.remember and memory_enabled()
    if use_memory:
        memory_cap()  # a malformed SPECDEC_MEMORY_MAX_TOKENS fails before the model loads
    loaded = models.load(load, on_status=on_status)
    info = target_info(loaded.model, loaded.tokenizer)  # (read once: the fingerprint hashes the whole vocabulary)
    memory = None
    if use_memory:
        memory = Memory(memory_dir(loaded.name, info.fingerprint), info.fingerprint, loaded.name)
        options = replace(run.drafter.options, memory=str(memory.directory))
        settings = replace(settings, run=replace(run, drafter=replace(run.drafter, options=options)))
    return ChatSession(loaded.model, loaded.tokenizer, settings, memory, info), loaded


@dataclass
class Turn:
    user: str
    answer: str
    prompt_tokens: int
    generation: Generation
    drafter: str


@dataclass
class ChatSession:
    """A conversation on a loaded target, made from its `settings` kept whole (a ChatSettings: the drafter, the
    generation settings, raw prompts, exact verification, how the target was loaded, the system message);
    `generation`, `drafter_name`, `system` and `raw` read them, and the `set_` methods replace them."""

    model: Any
    tokenizer: Any
    settings: ChatSettings = field(default_factory=ChatSettings)
    memory: Optional[Memory] = None  # where each answer is remembered (None: nowhere)
    known_info: InitVar[Optional[TargetInfo]] = None  # target_info(model, tokenizer), where the caller has it

    def __post_init__(self, known_info: Optional[TargetInfo]) -> None:
        run = self.settings.run
        self.engine = Engine(choose_forward(self.model, run.exact, run.load), self.tokenizer)
        self.info = known_info or target_info(self.model, self.tokenizer)
        self._replace_run(generation=replace(run.generation, eos_token_ids=self.info.eos_token_ids))
        self.generation.check()
        self.engine.forward.prepare(self.generation.budget)  # row-invariant verification, when on, is checked now
        self.drafter = self.make_drafter()
        self.prompt_cache = PromptCache()  # the KV entries of the last answer's context, reused by the next prompt
        self.history: list[dict] = []
        self.turns: list[Turn] = []
        self.cut_short: list[int] = []  # tokens kept of each answer cut short (Ctrl-C): in the history, not in turns

    @property
    def generation(self) -> GenerationConfig:
        return self.settings.run.generation

    @property
    def drafter_name(self) -> str:
        return str(self.settings.run.drafter.name)

    @property
    def system(self) -> Optional[str]:
        return self.settings.system

    @property
    def raw(self) -> bool:
        return self.settings.run.raw

    def _replace_run(self, **changes: Any) -> None:
        self.settings = replace(self.settings, run=replace(self.settings.run, **changes))

    def make_drafter(self, name: Optional[str] = None) -> Drafter:
        """A fresh drafter named `name` (default: the session's), built as the session builds its own."""
        run = self.settings.run
        return make_drafter(name or self.drafter_name, run.drafter.options, self.info, run.generation.draft_max)

    def set_drafter(self, name: str) -> None:
        self.drafter = self.make_drafter(name)
        self._replace_run(drafter=replace(self.settings.run.drafter, name=name))

    def set_generation(self, generation: GenerationConfig) -> None:
        """Answer with these settings from the next turn on; a new draft_max builds the drafter again (its cap)."""
        rebuild = generation.draft_max != self.generation.draft_max
        self._replace_run(generation=generation)
        if rebuild:
            self.set_drafter(self.drafter_name)

    def set_system(self, system: Optional[str]) -> None:
        self.settings = replace(self.settings, system=system)

    def clear(self) -> None:
        """A new conversation: history and every learned drafter state are dropped."""
        self.history.clear()
        self.turns.clear()
        self.cut_short.clear()
        self.prompt_cache.clear()
        self.drafter = self.make_drafter()

    def messages_for(self, user_text: str) -> list[dict]:
        return with_system(self.history + [{"role": "user", "content": user_text}], self.system)

    def ask(self, user_text: str, on_event: Optional[EventCallback] = None) -> Turn:
        if not user_text.strip():
            raise SpecdecError("the prompt is empty")
        prompt_ids = format_prompt(self.tokenizer, self.messages_for(user_text), self.raw)
        generation = self.generate(prompt_ids, self.generation, on_event)
        answer = self.decode(generation)
        self.history += [{"role": "user", "content": user_text}, {"role": "assistant", "content": answer}]
        turn = Turn(user_text, answer, len(prompt_ids), generation, self.drafter_name)
        self.turns.append(turn)
        return turn

    def generate(self, prompt_ids: list[int], config: GenerationConfig,
                 on_event: Optional[EventCallback] = None, remember: bool = True, cached: bool = True) -> Generation:
        """One answer to these token ids with the session's drafter, reusing the prompt cache (without `cached`: the
        prompt computed whole and its context not kept), remembered once finished unless the caller remembers it
        later (`remember`: a server answers its client first); settings: the session's own `generation` with what a
        request changes; its EOS ids are the model's."""
        config = replace(config, eos_token_ids=self.info.eos_token_ids)
        generation = self.engine.generate(prompt_ids, self.drafter, config, on_event,
                                          self.prompt_cache if cached else None)
        if remember:
            self.remember(generation.tokens, prompt_ids)
        return generation

    def start_in(self, batch: Any, prompt_ids: list[int], config: GenerationConfig, drafter: Any,
                 on_event: Optional[EventCallback] = None, cached: bool = True) -> Any:
        """`generate`, begun inside a batch (decoding/batch.py) with a drafter of its own: the prompt computed in
        the batch's next steps (whole, and its context not kept, without `cached`), the answer stepped with the
        batch's others;
        `finish_in` ends it."""
        config = replace(config, eos_token_ids=self.info.eos_token_ids)
        return batch.add(prompt_ids, drafter, config, on_event, self.prompt_cache if cached else None)

    def finish_in(self, batch: Any, run: Any) -> Generation:
        """An answer begun with `start_in` that ended: its Generation (the caller remembers it: `remember`)."""
        return batch.close(run)

    @property
    def _computes_ahead(self) -> bool:
        """Whether prompts' openings are worth computing ahead: a chat template writes them, and the drafter reads
        no prompt's features (for one that does, the engine computes every prompt whole)."""
        return not self.raw and bool(getattr(self.tokenizer, "chat_template", None)) and \
            not self.drafter.needs.features

    def warm_up(self) -> int:
        """What every conversation begins with (the system message and a user turn's opening, as the template
        writes them) computed into the prompt cache, one token chosen after it and dropped: a server's first
        request then computes only its own words, and the forward's first calls (their buffers, the kernels'
        first touch of the weights) are behind it, as llama-server warms up. No drafter sees it. How many tokens
        (none for raw prompts)."""
        if not self._computes_ahead:
            return 0
        tokens = next_turn_ids(self.tokenizer, with_system([], self.system))
        if len(tokens) < 2:
            return 0
        config = replace(self.generation, max_new_tokens=1, min_new_tokens=0, stop=(), logprobs=None)
        self.engine.generate(tokens, NoDrafter(), config, prompt_cache=self.prompt_cache)
        return len(tokens)

    def compute_ahead(self, conversation: list[dict], prompt_tokens: int) -> int:
        """What every next turn of `conversation` (its messages, ending in an answer; the session's system message
        added as for a prompt; its last prompt `prompt_tokens` long) begins with, computed into the prompt cache
        now, while nobody waits: the template's close of the answer and opening of a user turn, so the next
        prompt computes only what the user writes and what follows it. The same entries the next prompt would
        compute (Engine.compute_ahead): its answer is the same. How many tokens were computed (none for raw
        prompts or when the cache holds nothing it continues)."""
        if not self._computes_ahead:
            return 0
        tokens = next_turn_ids(self.tokenizer, with_system(conversation, self.system))
        return self.engine.compute_ahead(self.prompt_cache, tokens, prompt_tokens, AHEAD_MOST)

    def remember(self, tokens: list[int], prompt_ids: Sequence[int]) -> None:
        """Append a finished answer to the memory; a memory that cannot be written costs a warning, not the answer."""
        if self.memory is None:
            return
        try:
            self.memory.append(tokens, prompt_ids)
        except SpecdecError as error:
            warnings.warn(f"memory: {error} (the answer was not remembered)", stacklevel=3)

    def compare(self, user_text: str, on_event: Optional[EventCallback] = None) -> Comparison:
        """Answer once plainly and once with the drafter (greedy), outside the conversation's history."""
        if not user_text.strip():
            raise SpecdecError("the prompt is empty")
        prompt_ids = format_prompt(self.tokenizer, self.messages_for(user_text), self.raw)
        return compare(self.engine, prompt_ids, self.drafter, self.generation, on_event)

    def record(self, user_text: str, answer: str, tokens: int = 0) -> None:
        """Keep an answer that was cut short (Ctrl-C) in the history, so the conversation goes on from it (its
        `tokens` are counted in `cut_short`; its statistics were never finished)."""
        self.history += [{"role": "user", "content": user_text}, {"role": "assistant", "content": answer}]
        self.cut_short.append(tokens)

    def decode(self, generation: Generation) -> str:
        text = self.tokenizer.decode(generation.tokens, skip_special_tokens=True)
        return text[: generation.text_end] if generation.text_end is not None else text
