"""The device engine (specdec_cli/target_model/device/): exact by construction, and built by the rules a GPU needs.

On the CPU, with torch's own GEMMs (not row-invariant by themselves), every drafter, chains and trees, answers
token for token what plain decoding answers on the same engine: tiny models of several families and the default
model. A step is run under a TorchDispatchMode on the `meta` device: every tensor it makes is on the model's
device, and it reads one thing back to the host (the accepted tokens).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_EOS
from helpers import EOS, PROMPTS, ScriptedChain, ScriptedTree, family_model, perturbed
from torch.utils._python_dispatch import TorchDispatchMode

from specdec_cli.decoding.cost_curve import CostCurve
from specdec_cli.decoding.engine import Engine
from specdec_cli.decoding.generation_config import GenerationConfig
from specdec_cli.decoding.planner import DraftPlanner
from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter, target_weights
from specdec_cli.errors import SpecdecError
from specdec_cli.target_model.device import ROWS
from specdec_cli.target_model.device.forward import DeviceForward
from specdec_cli.target_model.verify.check_outcome import CheckOutcome

REGISTERED = ["pld", "sam", "recycle", "aded", "sam+aded", "sam+recycle"]  # drafters that need no files


def _engine(forward):
    return Engine(forward, planner=DraftPlanner(CostCurve.fixed({1: 1.0, 64: 1.0})))


def _drafters(model, vocab, reference, prompt):
    """Every kind of drafter: the registry's (chains and trees), a draft model, an EAGLE head (features), and
    scripted chains and trees with rejections mid-draft and accepted paths gathered in the cache."""
    from specdec_cli.drafters.eagle import EagleDrafter
    from specdec_cli.drafters.eagle_head import EagleHead, head_config_for
    from specdec_cli.drafters.model import ModelDrafter

    info = TargetInfo(vocab_size=vocab, eos_token_ids=(EOS,))
    drafters = {name: make_drafter(name, DrafterOptions(), info) for name in REGISTERED}
    drafters["model"] = ModelDrafter(perturbed(model, 0.02), draft_max=4, eos_token_ids=(EOS,))
    if target_weights(model) is not None:  # (not where logits are soft-capped: gemma2)
        torch.manual_seed(0)
        drafters["eagle"] = EagleDrafter(EagleHead(head_config_for(model.config)).eval(), target_weights(model),
                                         eos_token_ids=(EOS,))
    drafters["chain"] = ScriptedChain(reference, len(prompt), vocab)
    drafters["tree"] = ScriptedTree(reference, len(prompt), vocab)
    return drafters


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2", "phi3"])
def test_every_drafter_is_token_identical_to_plain_decoding(family, one_torch_thread):
    """Chains and trees, on families with GQA, sliding windows, QK-norm, soft-capping and fused projections."""
    model = family_model(family)
    forward = DeviceForward(model, "cpu", slots=128)
    engine = _engine(forward)
    assert forward.prepare(8) == ROWS and forward.outcome.state == "on", forward.outcome
    config = GenerationConfig(max_new_tokens=40, eos_token_ids=(EOS,))
    for prompt in PROMPTS:
        plain = engine.generate(prompt, make_drafter("none", DrafterOptions(), TargetInfo(64, (EOS,))), config)
        for name, drafter in _drafters(model, 64, plain.tokens, prompt).items():
            drafter.reset()
            spoken = engine.generate(prompt, drafter, config)
            assert spoken.tokens == plain.tokens, (family, name, prompt)
            if name == "tree":
                assert any(len(event.accepted_path) > 1 and event.accepted_path != list(range(len(
                    event.accepted_path))) for event in spoken.events)  # a path gathered into place
    assert engine.tree_check == "passed"


def test_it_computes_what_transformers_computes(tiny_llama):
    """Up to rounding (summation order), the device engine's logits are transformers' on the same weights, for a
    prompt longer than a step and for a tree of the same tokens."""
    forward = DeviceForward(tiny_llama, "cpu", slots=128)
    prompt = [1, *range(5, 45)]
    cache = forward.new_cache()
    with torch.inference_mode():
        reference = tiny_llama(torch.tensor([prompt])).logits[0]  # [n, vocab]
        logits = forward(prompt, cache, 0).logits
    assert torch.allclose(logits, reference, atol=1e-4, rtol=1e-4)
    assert cache.get_seq_length() == len(prompt)


def test_a_block_longer_than_a_step_runs_as_consecutive_steps(tiny_llama):
    forward = DeviceForward(tiny_llama, "cpu", slots=128)
    ids = list(range(5, 5 + 2 * ROWS + 3))
    with torch.inference_mode():
        cache = forward.new_cache()
        forward(ids[:10], cache, 0)
        block = forward(ids[10:], cache, 10).logits  # more rows than a step: three steps
        cache.crop(10 - cache.get_seq_length())
        one_by_one = torch.cat([forward([token], cache, 10 + index).logits for index, token in enumerate(ids[10:])])
    assert torch.equal(block, one_by_one)


def test_a_cost_curve_measured_on_the_static_cache_does_not_disturb_a_generation(tiny_llama):
    """The planner measures its curve at the first draft worth planning, with forwards on the forward's cache; on
    the device engine that cache is the generation's own, so the engine has it measured before the prompt."""
    from specdec_cli.decoding.curve_store import forward_timer

    forward = DeviceForward(tiny_llama, "cpu", slots=128)
    measured = []

    def measure():
        measured.append(forward_timer(forward, prefix=8)(4))
        return CostCurve.fixed({1: 1.0, 64: 1.0})

    prompt, config = PROMPTS[0], GenerationConfig(max_new_tokens=24, eos_token_ids=(EOS,))
    info = TargetInfo(64, (EOS,))
    plain = _engine(forward).generate(prompt, make_drafter("none", DrafterOptions(), info), config)
    spoken = Engine(forward, planner=DraftPlanner(measure)).generate(prompt, make_drafter("pld", DrafterOptions(),
                                                                                          info), config)
    assert measured and spoken.tokens == plain.tokens


def test_the_engine_bounds_answers_by_the_static_cache(tiny_llama):
    forward = DeviceForward(tiny_llama, "cpu", slots=48)
    generation = _engine(forward).generate([1, 5, 6], make_drafter("pld", DrafterOptions(), TargetInfo(64, (99,))),
                                           GenerationConfig(max_new_tokens=100, eos_token_ids=(99,)))
    assert len(generation.tokens) == forward.capacity - 3 and generation.finish_reason == "length"


@pytest.mark.parametrize("value", ["-5", "abc", "0", "17", "33", "40", "288", "1e3"])
def test_a_device_context_the_engine_cannot_run_in_is_one_line_before_the_model_loads(tiny_llama_dir, monkeypatch,
                                                                                         value):
    """SPECDEC_DEVICE_CONTEXT of -5 or abc was `internal error` (RuntimeError, ValueError) after the model loaded;
    17, 33 or 40 slots an IndexError or ValueError in the one-time check, fewer than 289 one in the cost curve's."""
    from conftest import assert_one_line_error, invoke

    from specdec_cli.target_model.load import models

    monkeypatch.setattr(models, "model_location", lambda *a, **k: pytest.fail("the model loaded before the check"))
    result = invoke("chat", "--target", str(tiny_llama_dir), "--decoder", "device", "--device", "cpu", "--prompt",
                    "abc", "-n", "4", env_extra={"SPECDEC_DEVICE_CONTEXT": value})
    assert_one_line_error(result, f"SPECDEC_DEVICE_CONTEXT must be a whole number of cache slots of at least 289 "
                                  f"(the verify-cost curve times blocks of up to 32 tokens after 256, each padded to "
                                  f"16 rows), got '{value}'", code=1)


def test_the_fewest_slots_allowed_run_the_check_and_the_cost_curve_and_fewer_time_a_shorter_prompt(tiny_llama):
    from specdec_cli.decoding.curve_store import forward_timer
    from specdec_cli.defaults import VERIFY_ROW_COUNTS
    from specdec_cli.target_model.device.forward import MIN_CONTEXT, context_setting

    assert context_setting({"SPECDEC_DEVICE_CONTEXT": f" {MIN_CONTEXT} "}) == MIN_CONTEXT == 289
    assert context_setting({"SPECDEC_DEVICE_CONTEXT": ""}) is None and context_setting({}) is None
    forward = DeviceForward(tiny_llama, "cpu", slots=MIN_CONTEXT)
    assert forward.prepare(8) == ROWS, forward.outcome
    timer = forward_timer(forward)
    assert all(timer(rows) > 0 for rows in VERIFY_ROW_COUNTS)
    # fewer slots (a model of a short context caps them): the timer times after a shorter prompt, never past the
    # cache (it was an internal error on a model of context 256)
    short = forward_timer(DeviceForward(tiny_llama, "cpu", slots=MIN_CONTEXT - 24))
    assert all(short(rows) > 0 for rows in VERIFY_ROW_COUNTS)


def test_a_block_whose_padding_passes_the_last_slot_is_refused_not_an_index_error(tiny_llama):
    """A step pads to ROWS rows whose positions must lie inside the cache (the rotary tables): the check counts
    them (it counted the real rows only, and 33 slots ran into an IndexError)."""
    forward = DeviceForward(tiny_llama, "cpu", slots=40)
    cache = forward.new_cache()
    with torch.inference_mode():
        forward(list(range(5, 29)), cache, 0)  # 24 tokens: a prompt chunk of 32 padded rows fits 40 slots
        forward([7] * 7, cache, 24)  # ends at 31: 24 + 16 padded rows reach slot 39, the last
        with pytest.raises(ValueError, match="a block of 1 after 31 committed tokens needs 47 slots"):
            forward([7], cache, 31)


def test_the_default_model_is_token_identical_for_every_drafter(real_target):
    """The default GGUF, loaded in place: its blocks dequantised by the device engine, every drafter identical."""
    model = real_target("float32", "auto").model
    forward = DeviceForward(model, "cpu", slots=128)
    engine = _engine(forward)
    vocab = int(model.config.vocab_size)
    prompt = [1, *([504, 3136, 282, 260, 4744, 30] * 3)]  # a repeated sentence: the drafters find matches
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=(2,))
    plain = engine.generate(prompt, make_drafter("none", DrafterOptions(), TargetInfo(vocab, (2,))), config)
    steps = {}
    for name in ["pld", "sam", "recycle", "aded", "sam+aded"]:
        spoken = engine.generate(prompt, make_drafter(name, DrafterOptions(), TargetInfo(vocab, (2,))), config)
        assert spoken.tokens == plain.tokens, name
        steps[name] = len(spoken.events) - 1
    tree = ScriptedTree(plain.tokens, len(prompt), vocab)
    assert engine.generate(prompt, tree, config).tokens == plain.tokens
    assert min(steps.values()) < len(plain.events) - 1  # some drafter saved steps
    assert forward.outcome.state == "on"
    # the blocks dequantised on the device compute what the native decoder computes on them (which rounds each
    # row's activations to 8 bits per block of 32: close, not equal)
    from specdec_cli.target_model.native.kv_cache import transformers_kv_cache
    from specdec_cli.target_model.verify.exact_setup import NativeForward

    with torch.inference_mode():
        native = NativeForward(model)(prompt, transformers_kv_cache(), 0).logits  # [n, vocab]
        device = forward(prompt, forward.new_cache(), 0).logits
    assert float(torch.nn.functional.cosine_similarity(native, device, dim=-1).min()) > 0.99


# -- the rules a GPU needs, checked on the `meta` device ---------------------------------------------------------

SCALAR_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}


class DeviceRecorder(TorchDispatchMode):
    """Records each operation with its outputs' devices; a read back to the host (an output on the CPU from an
    input on the model's device: .item(), .tolist(), .cpu(), copy_ into a host tensor) is counted, and answered
    with zeros (a meta tensor holds no data)."""

    def __init__(self, device: str):
        super().__init__()
        self.watched = device
        self.log: list = []  # ("op", name, output devices) or ("read", name) or ("mark", text)

    def mark(self, text: str) -> None:
        self.log.append(("mark", text))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        on_device = any(value.device.type == self.watched for value in inputs)
        if on_device:
            devices = [value for value in (*args, *kwargs.values()) if isinstance(value, (torch.device, str))]
            to_host = any(torch.device(value).type == "cpu" for value in devices if str(value) in ("cpu", "cpu:0")
                          or isinstance(value, torch.device))
            if func in SCALAR_READS:
                self.log.append(("read", func.__name__))
                return 0
            if func.__name__.startswith(("to.", "_to_copy.")) and to_host:
                self.log.append(("read", func.__name__))
                return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
            if func is torch.ops.aten.copy_.default and args[0].device.type == "cpu":
                self.log.append(("read", func.__name__))
                return args[0].zero_()
        out = func(*args, **kwargs)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        self.log.append(("op", func.__name__, {value.device.type for value in outputs
                                                if isinstance(value, torch.Tensor)}))
        return out


@pytest.mark.parametrize("drafter_name", ["none", "pld", "recycle", "aded"])
def test_a_step_makes_every_tensor_on_the_device_and_reads_back_once(tiny_llama, drafter_name):
    """Every operation of every step (staging its inputs, the forward, accepting, rolling the cache back, a tree's
    path gathered) makes its tensors on the model's device, here `meta`; each step reads back to the host exactly
    once (the accepted tokens, with recycle's top tokens in the same read)."""
    forward = DeviceForward(copy.deepcopy(tiny_llama), "meta", slots=64)
    forward.outcome = CheckOutcome("on", "a meta device computes nothing to check")
    engine = _engine(forward)
    _ = engine.supports_trees  # (answered from the outcome above)
    drafter = make_drafter(drafter_name, DrafterOptions(), TargetInfo(64, (TINY_EOS,)))
    recorder = DeviceRecorder("meta")
    with recorder:
        generation = engine.generate([1, 5, 6, 7, 5, 6, 7, 5, 6], drafter,
                                     GenerationConfig(max_new_tokens=12, eos_token_ids=(TINY_EOS,)),
                                     on_event=lambda event: recorder.mark(event.kind))
    steps = [event for event in generation.events if event.kind == "step"]
    assert steps and len(generation.tokens) == 12
    reads, section = [], []
    for entry in recorder.log:
        if entry[0] == "mark":
            reads.append((entry[1], sum(item[0] == "read" for item in section)))
            section = []
        else:
            section.append(entry)
            if entry[0] == "op":
                assert entry[2] <= {"meta"}, f"{entry[1]} made a tensor on {entry[2]}"
    assert [count for kind, count in reads if kind == "step"] == [1] * len(steps), reads


def test_the_meta_device_sees_a_tensor_made_off_the_device(tiny_llama):
    """The recorder catches what the step must not do: a tensor made on the host in the middle of a step."""
    recorder = DeviceRecorder("meta")
    with recorder:
        x = torch.zeros(4, device="meta")
        _ = torch.arange(4)  # made on the CPU
        _ = int(x.sum())  # a read back
    made = [entry for entry in recorder.log if entry[0] == "op" and not entry[2] <= {"meta"}]
    assert made and [entry for entry in recorder.log if entry[0] == "read"]


def test_decoder_device_is_a_load_setting_chosen_by_choose_forward(tiny_llama):
    from specdec_cli.target_model.load.forward_choice import choose_forward
    from specdec_cli.target_model.load.load_settings import LoadSettings
    from specdec_cli.target_model.verify.exact_setup import NativeForward, TransformersForward

    chosen = choose_forward(tiny_llama, None, LoadSettings(device="cpu", decoder="device"))
    assert isinstance(chosen, DeviceForward) and chosen.dtype == torch.float32
    assert isinstance(choose_forward(tiny_llama, None, LoadSettings(device="cpu")),
                      (NativeForward, TransformersForward))  # auto on a CPU: as before
    with pytest.raises(SpecdecError, match="decoder must be one of"):
        LoadSettings(decoder="gpu")


def test_bench_and_chat_take_decoder_device(tiny_llama_dir, tmp_path):
    """`--decoder device` from the command line: the bench's rows run on the device engine (its check in the
    report), every output identical to plain decoding's; chat answers on it too."""
    import json

    from conftest import invoke

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "copy", "turns": [text]}) + "\n"
                               for text in ("abc abc abc abc", "the cat sat on the mat, the cat sat")))
    result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompts), "--drafters",
                    "none,pld,aded", "--decoder", "device", "--device", "cpu", "--max-new-tokens", "12",
                    "--no-warmup", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["exact_check"].startswith("on: specdec's device engine on cpu")
    rows = [row for row in document["results"] if row["category"] == "overall"]
    assert len(rows) == 3 and all(row["identical"] == row["compared"] == 2 for row in rows)
    chat = invoke("chat", "--target", str(tiny_llama_dir), "--decoder", "device", "--prompt", "abc abc",
                  "-n", "6", "--json", "--no-memory")
    assert chat.returncode == 0, chat.stderr
    assert 1 <= len(json.loads(chat.stdout)["output_token_ids"]) <= 6


def test_sampling_runs_on_the_device_engine(tiny_llama):
    """Speculative sampling (temperature > 0) on the device engine: chains and trees, seeded runs repeat."""
    forward = DeviceForward(tiny_llama, "cpu", slots=128)
    engine = _engine(forward)
    config = GenerationConfig(max_new_tokens=16, temperature=0.8, seed=3, eos_token_ids=(99,))
    for name in ("pld", "aded"):
        first = engine.generate(PROMPTS[0], make_drafter(name, DrafterOptions(), TargetInfo(64, (99,))), config)
        again = engine.generate(PROMPTS[0], make_drafter(name, DrafterOptions(), TargetInfo(64, (99,))), config)
        assert first.tokens == again.tokens and len(first.tokens) == 16


def test_bfloat16_as_on_a_gpu_is_exact_too(tiny_llama):
    """The compute dtype a GPU gets (bfloat16: GEMMs and the cache in it, norms and softmax in float32): blocks
    equal one-row forwards bit for bit, and drafters answer as plain decoding does."""
    forward = DeviceForward(tiny_llama, "cpu", dtype=torch.bfloat16, slots=128)
    assert forward.weights.head.weight.dtype == torch.bfloat16 and forward.static.keys.dtype == torch.bfloat16
    engine = _engine(forward)
    assert forward.prepare(8) == ROWS, forward.outcome
    config = GenerationConfig(max_new_tokens=24, eos_token_ids=(EOS,))
    info = TargetInfo(64, (EOS,))
    for prompt in PROMPTS:
        plain = engine.generate(prompt, make_drafter("none", DrafterOptions(), info), config)
        for drafter in (make_drafter("pld", DrafterOptions(), info), make_drafter("aded", DrafterOptions(), info),
                        ScriptedTree(plain.tokens, len(prompt), 64)):
            assert engine.generate(prompt, drafter, config).tokens == plain.tokens


def test_a_gguf_on_cuda_is_opened_in_place_for_the_device_engine(monkeypatch):
    """Deciding where a GGUF loads on cuda needs no GPU: in place (its blocks for the device engine to dequantise
    on the GPU) when the caller runs the forward the settings choose; else transformers' conversion, as before."""
    from specdec_cli.target_model.load import models
    from specdec_cli.target_model.load.load_settings import LoadSettings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    plan = models.check_load(LoadSettings(device="cuda"))
    assert plan.in_place and plan.device == "cuda"
    assert not models.check_load(LoadSettings(device="cuda"), device_engine=False).in_place
