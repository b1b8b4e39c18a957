"""The native GGUF path's tokenizer and chat templates (native_tokenizer.py, texts/chat_template.py) against
transformers', and the native path's start-up without transformers (issue 45).

For the default model, Qwen2.5-Coder-0.5B (where benchmarks/fetch_qwen_coder.py put it) and the tests' tiny GGUFs
(a byte-level BPE and a SentencePiece vocabulary): the tokenizer transformers builds from the GGUF is saved as the
in-place cache saves it, read back by `load_native_tokenizer`, and compared on the test suite's prompts, Spec-Bench's
questions, unicode and special-token texts (encoding with and without special tokens), the decoding of every
token id and of every encoded text, the special tokens, the vocabulary, and chat templates rendered both ways.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DISTILL_PROMPTS, family_model, qwen_coder_gguf, write_family_gguf
from test_real_model import PROMPTS as REAL_PROMPTS

from specdec_cli.target_model.gguf.gguf_file import open_gguf
from specdec_cli.target_model.in_place.gguf_model import tokenizer_from_file
from specdec_cli.target_model.in_place.native_tokenizer import NativeTokenizer, load_native_tokenizer
from specdec_cli.texts.chat_template import render_template

PROMPTS = REAL_PROMPTS + DISTILL_PROMPTS  # the test suite's text prompts

REPO = Path(__file__).resolve().parents[3]
QWEN = qwen_coder_gguf()  # (helpers.py: $SPECDEC_TEST_QWEN_GGUF or the fetch script's place)
SPEC_BENCH = Path(__file__).resolve().parents[4] / "shared/datasets/spec_bench/question.jsonl"
TEXTS = [
    "", " ", "  ", "\n", "\n\n\t", "hello", " hello", "Hello, world!", "x" * 300, "a  b   c\t\td",
    "naïve café façade — “quotes” ‘single’ … ½ € ¥ ©", "日本語のテキスト、中文文本。한국어 텍스트",
    "Ελληνικά Русский עברית العربية",
    "emoji 😀🚀👩‍👩‍👧‍👦 🇫🇷 and ZWJ", "\u200b\u200d\ufeff zero width", "tabs\tand\r\nwindows\rlines",
    "def f(x):\n    return x ** 2  # comment\n", "{\"json\": [1, 2.5e-3, null]}", "<b>html &amp; entities</b>",
    "12345678901234567890 3.14159 -0.001", "don't won't it's y'all", "ALLCAPS lowercase MiXeD",
    "\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
]


def _messages_sets(texts: list[str]) -> list[list[dict]]:
    sets = [[{"role": "user", "content": text}] for text in texts[:40]]
    sets.append([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])
    sets.append([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 😀"},
                 {"role": "user", "content": "Again, with <tags> & \"quotes\""}])
    return sets


def _spec_bench() -> list[str]:
    if not SPEC_BENCH.is_file():
        return []
    return [turn for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines() if line.strip()
            for turn in json.loads(line)["turns"]]


def _tiny_gguf(folder: Path, kind: str) -> Path:
    path = folder / f"tiny-{kind}.gguf"
    write_family_gguf(path, family_model("llama", seed=5), "llama", kind)
    return path


def _pair(gguf_path: Path, folder: Path) -> tuple[object, NativeTokenizer]:
    """(transformers' tokenizer as specdec built it, ours from the files the in-place cache keeps)."""
    theirs = tokenizer_from_file(open_gguf(gguf_path))
    theirs.save_pretrained(folder)
    ours = load_native_tokenizer(folder)
    assert ours is not None, "this tokenizer fell back to transformers"
    return theirs, ours


def _compare(theirs, ours, texts: list[str], all_ids: bool = True) -> None:
    specials = list(theirs.special_tokens_map.values())
    texts = texts + [f"{token}text{token} {token}" for token in specials] + ["".join(specials)]
    assert ours.special_tokens_map == dict(theirs.special_tokens_map)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "eos_token", "bos_token"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert len(ours) == len(theirs)
    assert ours.get_vocab() == theirs.get_vocab()
    assert {key: (token.content, token.special) for key, token in ours.added_tokens_decoder.items()} == \
        {key: (token.content, token.special) for key, token in theirs.added_tokens_decoder.items()}
    assert ours.chat_template == theirs.chat_template
    for text in texts:
        for special in (True, False):
            ids = ours(text, add_special_tokens=special)["input_ids"]
            assert ids == list(theirs(text, add_special_tokens=special)["input_ids"]), (text, special)
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(text, add_special_tokens=special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    if all_ids:
        for token in range(len(theirs)):
            for skip in (True, False):
                assert ours.decode([token], skip_special_tokens=skip) == \
                    theirs.decode([token], skip_special_tokens=skip), token
    if theirs.chat_template:
        for messages in _messages_sets(texts):
            want = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            assert render_template(ours, messages) == want
            assert render_template(theirs, messages) == want


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_tiny_gguf_tokenizers_read_without_transformers_equal_transformers(tmp_path, kind):
    theirs = tokenizer_from_file(open_gguf(_tiny_gguf(tmp_path, kind)))
    theirs.save_pretrained(tmp_path / "saved")
    ours = load_native_tokenizer(tmp_path / "saved")
    if ours is None:  # a tokenizer_config this reader does not reproduce: transformers reads it (gguf_model)
        pytest.skip(f"the tiny {kind} tokenizer is read by transformers")
    _compare(theirs, ours, TEXTS + PROMPTS)


def test_the_default_model_tokenizer_equals_transformers(tmp_path):
    from specdec_cli.target_model.load.target_source import default_gguf_path

    theirs, ours = _pair(default_gguf_path(), tmp_path)
    _compare(theirs, ours, TEXTS + PROMPTS + _spec_bench())


@pytest.mark.skipif(not QWEN.is_file(), reason=f"{QWEN} is not here")
def test_qwen_coder_tokenizer_equals_transformers(tmp_path):
    theirs, ours = _pair(QWEN, tmp_path)
    _compare(theirs, ours, TEXTS + PROMPTS + _spec_bench())


def _chat(target: Path, home: Path, raw: bool) -> subprocess.CompletedProcess:
    command = [sys.executable, "-X", "importtime", "-m", "specdec_cli", "chat", "--target", str(target),
               "--prompt", "Write one sentence about the sea.", "--max-new-tokens", "4", "--drafter", "none",
               "--json", *(["--raw"] if raw else [])]
    env = dict(os.environ, SPECDEC_HOME=str(home), PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=str(home.parent))


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_the_native_path_answers_without_importing_transformers(tmp_path, which):
    """`specdec chat --drafter none` on a GGUF the native decoder computes: the first run makes the in-place cache
    (its config, tokenizer and rotary tables built without transformers: native_side_files.py), and neither it nor
    any later run, which answers the same, imports transformers at all."""
    from specdec_cli.target_model.load.target_source import default_gguf_path

    target = _tiny_gguf(tmp_path, "gpt2") if which == "tiny" else default_gguf_path()
    home = tmp_path / "home"
    first = _chat(target, home, raw=which == "tiny")
    assert first.returncode == 0, first.stderr[-2000:]
    second = _chat(target, home, raw=which == "tiny")
    assert second.returncode == 0, second.stderr[-2000:]
    assert json.loads(first.stdout)["output_token_ids"] == json.loads(second.stdout)["output_token_ids"]
    for run in (first, second):
        heavy = sorted(name for name in _imported(run.stderr) if name.split(".")[0] == "transformers")
        assert not heavy, heavy[:5]


@pytest.mark.real_model
def test_a_batch_call_encodes_each_text_as_alone(tmp_path):
    """build-index tokenizes corpora in batches: `tokenizer(texts, return_attention_mask=False)` gives each text's
    ids as one call would, and no mask, as transformers' does."""
    from specdec_cli.target_model.load.target_source import default_gguf_path

    theirs, tokenizer = _pair(default_gguf_path(), tmp_path)
    texts = ["The sea is wide.", "", "def f(x):\n    return x * 2", "ünïcödé ✓"]
    batch = tokenizer(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)
    assert set(batch) == {"input_ids"}
    assert batch["input_ids"] == [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    assert batch == theirs(texts, add_special_tokens=False, return_attention_mask=False, verbose=False).data
