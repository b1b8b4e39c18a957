"""Shared fixtures: tiny randomly initialised target models built from configs (no downloads).

Weights get a large init scale so the logits are peaked and greedy choices are far from ties; otherwise a
one-token and a many-token forward could legitimately round differently and pick different tokens.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

# The tests run on a CPU: Triton (the device engine's packed kernel) interprets, which it decides as it is imported
# (torch.compile imports it too). Not where vLLM is installed: its environment runs only vLLM's tests, whose CPU
# build imports Triton for itself.
if importlib.util.find_spec("vllm") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# transformers resolves its names lazily, and not safely across threads: a server a test left winding down could be
# resolving one while a fixture asks for another ("cannot import name 'LlamaConfig'"). Resolved here, before any.
import transformers  # noqa: E402

_RESOLVED = (transformers.LlamaConfig, transformers.LlamaForCausalLM, transformers.Qwen2Config,
             transformers.Qwen2ForCausalLM)

# Tiny models run faster on one thread than on two (thread start-up dwarfs their matrix products).
torch.set_num_threads(1)

# A test run started in the background by a non-interactive shell (`make test &`, some CI runners) inherits
# SIGINT ignored, and so would every process it starts: Ctrl-C's tests would then test nothing. Python's own
# handler here resets the signal to its default in the processes the tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TINY_VOCAB = 64
TINY_EOS = 3
TESTS = Path(__file__).resolve().parent
SPAWNS = ("run_cli(", "subprocess.", "pexpect.", "Popen(")  # what starts a process, as test code spells it


def pytest_collection_modifyitems(items):
    """Mark `subprocess` every test that starts a process, itself or through a fixture or helper of tests/ it
    calls (run_cli, subprocess, pexpect), and `real_model` every test that uses the embedded model's fixture
    (real_target), so that `make test-fast` can leave them out."""
    for item in items:
        if "real_target" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_model)
        function = getattr(item, "function", None)
        fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        used = [function, *(definitions[-1].func for definitions in fixtures.values())]
        if any(_spawns(used_function, set()) for used_function in used if used_function is not None):
            item.add_marker(pytest.mark.subprocess)


def _spawns(function, seen: set) -> bool:
    """Whether a function of tests/ starts a process, or calls a function of tests/ that does (transitively)."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None or code in seen or not Path(code.co_filename).resolve().is_relative_to(TESTS):
        return False
    seen.add(code)
    try:
        if any(spawn in inspect.getsource(function) for spawn in SPAWNS):
            return True
    except (OSError, TypeError):
        return False
    called = getattr(function, "__globals__", {})
    return any(inspect.isfunction(called.get(name)) and _spawns(called[name], seen) for name in _names(code))


def _names(code) -> set:
    """The global names a code object and the functions nested in it use."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if inspect.iscode(constant):
            names |= _names(constant)
    return names


def _tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.3, eos_token_id=TINY_EOS, bos_token_id=1, pad_token_id=0,
    )
    torch.manual_seed(1234 if kind == "llama" else 4321)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    model.generation_config.eos_token_id = TINY_EOS
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests, restored after them (a test that loads a model may change the count):
    tiny models run fastest on one thread, and a busy shared machine makes more threads far slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_model(request):
    return _tiny(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return _tiny("llama")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_llama):
    """tiny_llama with the bench's character tokenizer, saved as a model directory `--target DIR` loads (never
    written to by a test)."""
    from helpers import char_tokenizer

    folder = tmp_path_factory.mktemp("tiny-target")
    tiny_llama.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def hf_greedy(model, prompt_ids, max_new_tokens, eos=TINY_EOS, min_new_tokens=0):
    """The model's own plain greedy decoding through transformers' generate (the reference)."""
    input_ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=0,
                             min_new_tokens=min_new_tokens, temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt_ids):].tolist()


_FORWARDS: dict = {}  # (id(model), exact) -> (model, its forward): one per model within a test module


@pytest.fixture(autouse=True, scope="module")
def _forget_forwards():
    """fixed_engine's forwards (and the models they hold) last one test module."""
    yield
    _FORWARDS.clear()


def fixed_engine(model, exact=None):
    """An engine whose planner prices a forward of 1 to 64 rows the same (a fixed cost curve, no timing anywhere):
    drafts are never trimmed for speed, so no outcome depends on this machine. Engines over one model share one
    forward (choose_forward(model, exact)), as one session's would: its row-invariance check, seconds in
    bfloat16, runs once per model, not per test."""
    from specdec_cli.decoding.engine import Engine
    from specdec_cli.target_model.load.forward_choice import choose_forward

    held = _FORWARDS.get((id(model), exact))
    if held is None or held[0] is not model:
        held = _FORWARDS[(id(model), exact)] = (model, choose_forward(model, exact))
    return Engine(held[1], planner=flat_planner())


def flat_planner():
    """A planner pricing a forward of 1 to 64 rows the same (a fixed cost curve, no timing anywhere)."""
    from specdec_cli.decoding.cost_curve import CostCurve
    from specdec_cli.decoding.planner import DraftPlanner

    return DraftPlanner(CostCurve.fixed({1: 1.0, 64: 1.0}))


def fixed_planner(session):
    """`session` (a chat session) with a flat_planner, as fixed_engine's: a test that asserts drafts were verified
    must not depend on the cost curve a busy machine measures. Returns it."""
    session.engine.planner = flat_planner()
    return session


HANG_GUARD = 600  # seconds: a process that takes longer is stuck, not slow (no test waits on speed)


def cli_env(extra=None) -> dict:
    """The environment of every specdec process a test starts (run_cli, pexpect, Popen).

    The same dtype on every machine (`--dtype auto` would time plain steps to choose) and the user's answer memory
    never read or written; tests of either say otherwise in `extra`. The weights are a user's default,
    `--weights auto`: on the default model, the GGUF's blocks where a plain step on them is measured faster (on
    every machine so far), else dense; a test that needs one of them names it (`--weights dense`), and no test's
    outcome depends on which `auto` chose."""
    env = dict(os.environ)
    env.pop("SPECDEC_DEBUG", None)
    env.pop("SPECDEC_WEIGHTS", None)  # a developer's own default must not change what the tests run
    env.setdefault("OMP_NUM_THREADS", "1")  # robust when the machine is busy: no thread oversubscription
    env.setdefault("SPECDEC_DTYPE", "float32")
    env.setdefault("SPECDEC_NO_MEMORY", "1")
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS.parent), env.get("PYTHONPATH")]))
    return env


def run_cli(*args, input_text=None, env_extra=None, timeout=HANG_GUARD, cwd=None, input_bytes=None):
    """`python -m specdec_cli ARGS` in a subprocess; text output (stdin as text, or raw `input_bytes`)."""
    env = cli_env(env_extra)
    if input_bytes is not None:
        result = subprocess.run([sys.executable, "-m", "specdec_cli", *args], input=input_bytes,
                                capture_output=True, env=env, timeout=timeout, cwd=cwd)
        return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode("utf-8", "replace"),
                                           result.stderr.decode("utf-8", "replace"))
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], input=input_text, capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=cwd)


@dataclass
class CliResult:
    """What `invoke` returns: a run's exit status and its output, as a finished process's would be."""

    returncode: int
    stdout: str
    stderr: str


def invoke(*args, input_text=None, env_extra=None, cwd=None, input_bytes=None) -> CliResult:
    """`specdec ARGS` in this process: the console script's own `main()` (the same mapping of errors to one line
    and an exit status) under Typer's CliRunner, whose stdin, stdout, stderr and environment are swapped in for the
    run. For the tests where no process boundary is under test; it costs no interpreter, torch or model start-up.

    The environment is run_cli's (cli_env: float32, no answer memory, no SPECDEC_DEBUG); whatever a run changes in
    this process is put back after it: os.environ, the working directory, torch's and the kernels' threads,
    signal handlers, warning filters and the CLI's per-process records and consoles."""
    from typer.testing import CliRunner

    from specdec_cli import cli as cli_package
    from specdec_cli import files, kernels
    from specdec_cli.cli import common

    environ, where, argv = dict(os.environ), os.getcwd(), sys.argv
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    torch_threads = torch.get_num_threads()
    kernel_threads = kernels.threads() if kernels.available() else None
    threads_chosen, kernels._threads_chosen = kernels._threads_chosen, False  # chosen once a process (ensure_threads)
    records = (cli_package._received, common._activity, common._interrupted_during, files._checked_outputs)
    kept = [type(record)(record) for record in records]
    for record in records:
        record.clear()
    consoles = (common.console, common.err_console)  # made once a process: each run makes its own (COLUMNS, NO_COLOR)
    for made in consoles:
        made.cache_clear()
    env = {key: value for key, value in cli_env(env_extra).items() if os.environ.get(key) != value}
    env.update({key: None for key in os.environ if key not in cli_env(env_extra)})  # e.g. SPECDEC_DEBUG
    stdin = input_bytes if input_bytes is not None else input_text
    code: object = 0
    try:
        with CliRunner().isolation(input=stdin, env=env) as (out, err, _), warnings.catch_warnings():
            if cwd is not None:
                os.chdir(cwd)
            sys.argv = ["specdec", *map(str, args)]
            try:
                cli_package.main()
            except SystemExit as exit:
                code = exit.code
            sys.stdout.flush()
            sys.stderr.flush()
            stdout, stderr = out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace")
    finally:
        sys.argv = argv
        os.chdir(where)
        os.environ.clear()
        os.environ.update(environ)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        torch.set_num_threads(torch_threads)
        if kernel_threads is not None:
            kernels.set_threads(kernel_threads)
        kernels._threads_chosen = threads_chosen
        for made in consoles:
            made.cache_clear()
        for record, before in zip(records, kept):
            record.clear()
            if isinstance(record, list):
                record.extend(before)
            else:
                record.update(before)
    return CliResult(code if isinstance(code, int) else (0 if code is None else 1), stdout, stderr)


def assert_one_line_error(result, needle: str = "", code=None) -> str:
    """A user error: a non-zero exit (`code` where given), one line `specdec: error: ...` on stderr holding
    `needle` (case-insensitive), no traceback; returns the line."""
    assert result.returncode != 0 if code is None else result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdec: error:"), result.stderr
    assert needle.lower() in lines[0].lower(), lines[0]
    return lines[0]


BLOCK_WEIGHTS = ("gguf", "int8", "int4")  # computed in float32 whatever --dtype says


@pytest.fixture(scope="session")
def real_target():
    """The embedded default model (SmolLM2-135M-Instruct), loaded once a session for each (dtype, weights) asked
    for: `real_target()` is the dense float32 model transformers' float32 generate is compared with;
    `real_target("float32", "auto")` what a user's `--weights auto` loads. Tests must not change the model."""
    from specdec_cli.target_model.load import models
    from specdec_cli.target_model.load.load_settings import LoadSettings

    original = models.load  # held before shared_real_model puts its own in its place
    loaded: dict = {}

    def load(dtype: str = "float32", weights: str = "dense"):
        key = ("float32" if weights in BLOCK_WEIGHTS else dtype, weights)
        if key not in loaded:
            loaded[key] = original(LoadSettings(dtype=key[0], weights=weights), for_engine=False)
        return loaded[key]

    return load


@pytest.fixture
def shared_real_model(real_target, monkeypatch):
    """For `invoke`: a command that loads the default model (chat, bench, distill...) gets the session's copy of it
    (real_target) instead of loading it again; any other target, device or home loads as usual."""
    from specdec_cli.defaults import DEFAULT_TARGET
    from specdec_cli.target_model.load import models

    load, home = models.load, os.environ.get("SPECDEC_HOME")

    def shared(settings, on_status=None, step_timer=None, for_engine=True):
        dtype = settings.dtype if settings.dtype != "auto" else os.environ.get("SPECDEC_DTYPE", "").strip() or "auto"
        weights = settings.weights if settings.weights != "auto" else \
            os.environ.get("SPECDEC_WEIGHTS", "").strip() or "auto"
        if (settings.target, settings.device, step_timer, os.environ.get("SPECDEC_HOME")) != \
                (DEFAULT_TARGET, "auto", None, home) or dtype == "auto":
            return load(settings, on_status, step_timer, for_engine)
        return real_target(dtype, weights)

    monkeypatch.setattr(models, "load", shared)


def char_level_tokenizer(specials: list[str], chars: list[str], chat_template: str, *, eos_token: str,
                         vocab_size: int = 0, lowercase: bool = False, more_specials: tuple[str, ...] = ()):
    """The tests' one tokenizer builder: a fast tokenizer with one token per character, built offline.

    Token ids are `specials`, then `chars`, then fillers `<x0>`, `<x1>`, ... up to `vocab_size` (when given).
    `<s>`, `<unk>`, `<pad>`, `eos_token` and `more_specials` are special tokens (matched whole in text); other
    entries of `specials` are plain tokens. `lowercase`: text is lowercased first (a vocabulary without capitals).
    """
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokens = specials + chars
    tokens += [f"<x{index}>" for index in range(vocab_size - len(tokens))]
    core = Tokenizer(WordLevel({token: index for index, token in enumerate(tokens)}, unk_token="<unk>"))
    if lowercase:
        core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token=eos_token,
                                        unk_token="<unk>", pad_token="<pad>",
                                        additional_special_tokens=list(more_specials))
    tokenizer.chat_template = chat_template
    return tokenizer


def make_char_tokenizer():
    """Printable ASCII, one token each, with a ChatML-style template (`<|im_end|>` ends a turn)."""
    import string

    return char_level_tokenizer(
        ["<pad>", "<s>", "<unk>", "<|im_end|>", "<|im_start|>"], sorted(set(string.printable) - set("\x0b\x0c\r")),
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        eos_token="<|im_end|>", more_specials=("<|im_start|>",))


def make_tiny_model_dir(path, seed: int = 99, never_eos: bool = False):
    """A tiny Llama with the character tokenizer, saved as a model directory `--target DIR` can load.

    never_eos: the EOS row of the output layer is zeroed, so greedy decoding practically never ends early
    (some other token's logit is positive), which lets a test interrupt a long answer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_char_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.3, eos_token_id=tokenizer.eos_token_id, bos_token_id=1,
                         pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = 0
    if never_eos:
        with torch.no_grad():
            model.lm_head.weight[tokenizer.eos_token_id] = 0.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
       "<|endoftext|>"]  # Qwen2.5-Coder's fill-in-the-middle tokens, found by their text


def make_fim_model_dir(path, newline_bias: float = 0.0):
    """A tiny Llama over characters and the FIM tokens, saved as a model directory; `newline_bias` multiplies the
    newline's output row (answers full of line breaks, for llama-server's line limits)."""
    import string

    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = char_level_tokenizer(["<pad>", "<s>", "<unk>", "<|im_end|>", "<|im_start|>", *FIM],
                                     sorted(set(string.printable) - set("\x0b\x0c\r")),
                                     "{% for m in messages %}{{ m['content'] }}{% endfor %}", eos_token="<|im_end|>",
                                     more_specials=("<|im_start|>", *FIM))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.3, eos_token_id=tokenizer.eos_token_id, bos_token_id=1, pad_token_id=0)
    torch.manual_seed(7)
    model = LlamaForCausalLM(config).eval()
    if newline_bias:
        with torch.no_grad():
            model.lm_head.weight[tokenizer.convert_tokens_to_ids("\n")] *= newline_bias
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def endless_model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("endless-model"), never_eos=True))


def check_draft(draft, budget: int) -> None:
    """A well-formed draft: within the budget, parents before children."""
    assert len(draft.tokens) <= budget
    if draft.parents is not None:
        assert len(draft.parents) == len(draft.tokens)
        assert all(-1 <= parent < node for node, parent in enumerate(draft.parents))


class CheckedDrafter:
    """Wraps a drafter, checks every draft it emits, and counts calls and non-empty drafts."""

    def __init__(self, inner):
        self.inner, self.name, self.needs = inner, inner.name, inner.needs
        self.nonempty = self.calls = 0

    def propose(self, context, budget):
        draft = self.inner.propose(context, budget)
        check_draft(draft, budget)
        self.nonempty += bool(len(draft))
        self.calls += 1
        return draft

    def observe(self, event):
        self.inner.observe(event)

    def reset(self):
        self.inner.reset()


def chi_square(counts, expected_probs):
    """Pearson statistic with categories of expected count < 5 pooled; returns (statistic, degrees of freedom)."""
    runs = counts.sum()
    expected = expected_probs * runs
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = wanted > 0
    statistic = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    return statistic, int(keep.sum()) - 1


@pytest.fixture
def kernel_settings():
    """The kernels' thread count and instruction-set path as they were, restored after a test that changes them."""
    from specdec_cli import kernels

    before = kernels.threads()
    yield
    kernels.set_threads(before)
    kernels.force_isa(None)
