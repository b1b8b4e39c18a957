"""A conversation with the target: prompt formatting, history, and one answer per turn.

`ChatSettings` is everything a session is made from (one run's settings, run_settings.py, and the system
message), checked before the slow model load; `open_session` loads the target and builds the `ChatSession`,
which holds the loaded target, the engine, the drafter (which lives as long as the conversation, so its automata
and tables keep learning), the prompt cache (a turn computes only the tokens the previous turn did not) and the
message history. `generate` is one answer to token ids (what `specdec serve` calls per request); `ask` is a turn.
`format_prompt` is the one place prompts become token ids: the tokenizer's chat template with the generation
prompt, a system message first when given, or the raw text with `raw=True`. Rendering is the CLI's job;
nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..decoding.engine import Engine, EventCallback, Generation, GenerationConfig
from ..decoding.prompt_cache import PromptCache
from ..defaults import DEFAULT_DRAFTER
from ..drafters import DrafterOptions, TargetInfo, make_drafter, target_weights
from ..errors import SpecdecError
from ..target_model.load.load_settings import LoadSettings
from ..target_model.verify.exact_setup import choose_forward
from ..texts.memory import Memory
from .compare import Comparison, compare
from .run_settings import RunSettings
from .template import render_template

if TYPE_CHECKING:  # pragma: no cover
    from ..target_model.load.models import LoadedTarget


def format_prompt(tokenizer: Any, messages: list[dict], raw: bool = False) -> list[int]:
    """Token ids for a conversation ending in a user turn (raw: the concatenated contents, no template)."""
    if raw:
        text = "".join(message["content"] for message in messages if message["role"] != "system")
        return list(tokenizer(text)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise SpecdecError("this model's tokenizer has no chat template; use --raw")
    text = render_template(tokenizer, messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def target_info(model: Any, tokenizer: Any) -> TargetInfo:
    from ..target_model.load.models import eos_token_ids
    from ..texts.fingerprint import tokenizer_fingerprint

    eos = eos_token_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer)
    vocab = max(len(tokenizer), int(getattr(model.config, "vocab_size", 0) or 0))
    device = str(next(model.parameters()).device)
    return TargetInfo(vocab_size=vocab, eos_token_ids=tuple(eos), fingerprint=tokenizer_fingerprint(tokenizer),
                      device=device, hidden_size=int(getattr(model.config, "hidden_size", 0) or 0),
                      weights=target_weights(model))


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
                 on_status: Optional[Callable[[str], None]] = None) -> tuple["ChatSession", "LoadedTarget"]:
    """Check the settings, load the target (the slow part), and start a conversation."""
    from ..target_model.load.models import load_target
    from ..texts.memory import memory_cap, memory_dir, memory_enabled

    settings.check()
    run, load = settings.run, settings.run.load
    use_memory = settings.remember and memory_enabled()
    if use_memory:
        memory_cap()  # a malformed SPECDEC_MEMORY_MAX_TOKENS fails before the model loads
    loaded = load_target(load.target, load.device, load.dtype, on_status=on_status, weights=load.weights,
                         decoder=load.decoder)
    options, memory = run.drafter.options, None
    if use_memory:
        fingerprint = target_info(loaded.model, loaded.tokenizer).fingerprint
        memory = Memory(memory_dir(loaded.name, fingerprint), fingerprint, loaded.name)
        options = replace(options, memory=str(memory.directory))
    session = ChatSession(loaded.model, loaded.tokenizer, str(run.drafter.name), options,
                          run.generation, settings.system, run.raw, run.exact, memory, load)
    return session, loaded


@dataclass
class Turn:
    user: str
    answer: str
    prompt_tokens: int
    generation: Generation
    drafter: str


@dataclass
class ChatSession:
    model: Any
    tokenizer: Any
    drafter_name: str = DEFAULT_DRAFTER
    drafter_options: DrafterOptions = field(default_factory=DrafterOptions)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    system: Optional[str] = None
    raw: bool = False
    exact: Optional[bool] = None
    memory: Optional[Memory] = None  # where each answer is remembered (None: nowhere)
    load: Optional[LoadSettings] = None  # how the target was loaded (its device and decoder pick the forward)

    def __post_init__(self) -> None:
        self.engine = Engine(choose_forward(self.model, self.exact, self.load), self.tokenizer)
        self.info = target_info(self.model, self.tokenizer)
        self.generation = replace(self.generation, eos_token_ids=self.info.eos_token_ids)
        self.generation.check()
        self.engine.forward.prepare(self.generation.budget)  # row-invariant verification, when on, is checked now
        self.drafter = make_drafter(self.drafter_name, self.drafter_options, self.info)
        self.prompt_cache = PromptCache()  # the KV entries of the last answer's context, reused by the next prompt
        self.history: list[dict] = []
        self.turns: list[Turn] = []
        self.cut_short: list[int] = []  # tokens kept of each answer cut short (Ctrl-C): in the history, not in turns

    def set_drafter(self, name: str) -> None:
        self.drafter = make_drafter(name, self.drafter_options, self.info)
        self.drafter_name = name

    def clear(self) -> None:
        """A new conversation: history and every learned drafter state are dropped."""
        self.history.clear()
        self.turns.clear()
        self.cut_short.clear()
        self.prompt_cache.clear()
        self.drafter = make_drafter(self.drafter_name, self.drafter_options, self.info)

    def messages_for(self, user_text: str) -> list[dict]:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return messages + self.history + [{"role": "user", "content": user_text}]

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
                 on_event: Optional[EventCallback] = None) -> Generation:
        """One answer to these token ids with the session's drafter, reusing the prompt cache, remembered once
        finished (settings: the session's own `generation` with what a request changes; its EOS ids are the
        model's)."""
        config = replace(config, eos_token_ids=self.info.eos_token_ids)
        generation = self.engine.generate(prompt_ids, self.drafter, config, on_event, self.prompt_cache)
        self._remember(generation.tokens, prompt_ids)
        return generation

    def _remember(self, tokens: list[int], prompt_ids: list[int]) -> None:
        """Append a finished answer to the memory; a memory that cannot be written costs a warning, not the answer."""
        if self.memory is None:
            return
        try:
            self.memory.append(tokens, prompt_ids)
        except SpecdecError as error:
            import warnings

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
