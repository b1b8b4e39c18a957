"""The answer memory (memory.py): storage, cap and eviction, bad files, concurrent writers, `sam` drafting from
it losslessly, the `specdec memory` commands, chat writing it (and not with --no-memory or SPECDEC_NO_MEMORY),
and bench leaving it alone unless asked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import HANG_GUARD, TINY_EOS, fixed_engine, hf_greedy, invoke

from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
from specdec_cli.texts.memory import Memory, prompt_hash

FINGERPRINT = "tiny-fingerprint"
ON = {"SPECDEC_NO_MEMORY": "0"}


def test_answers_come_back_oldest_first_with_their_prompts(tmp_path):
    memory = Memory(tmp_path / "memory", FINGERPRINT)
    memory.append([5, 6, 7], prompt_ids=[1, 2])
    memory.append([8, 9])
    recalled = memory.recall()
    assert recalled.answers == [[5, 6, 7], [8, 9]] and recalled.tokens == 5
    assert recalled.prompt_hashes == [prompt_hash([1, 2]), ""] and recalled.warning() is None
    assert memory.append([]) is None  # nothing to remember
    assert memory.info()["answers"] == 2 and memory.info()["tokens"] == 5


def test_the_cap_evicts_the_oldest_answers_first(tmp_path):
    memory = Memory(tmp_path / "memory", FINGERPRINT, cap=10)
    for start in (10, 20, 30, 40):
        memory.append(list(range(start, start + 4)))  # 4 tokens each: 16 > 10
    assert memory.recall().answers == [[30, 31, 32, 33], [40, 41, 42, 43]]
    assert Memory(tmp_path / "none", FINGERPRINT, cap=0).append([1, 2]) is None  # a cap of 0 keeps nothing


def test_a_corrupt_or_foreign_file_is_skipped_and_the_rest_kept(tmp_path):
    memory = Memory(tmp_path / "memory", FINGERPRINT)
    memory.append([5, 6])
    (memory.directory / "1-1-2.json").write_text("{not json")
    foreign = Memory(memory.directory, "another-tokenizer")
    foreign.append([7, 8])
    memory.append([9])
    recalled = memory.recall()
    assert recalled.answers == [[5, 6], [9]]
    assert len(recalled.skipped) == 2
    warning = recalled.warning()
    assert warning is not None and warning.count("\n") == 0 and "(and 1 more)" in warning


def test_a_file_read_once_is_not_read_again_unless_it_changed(tmp_path, monkeypatch):
    from specdec_cli.texts import memory as memory_module

    reads = []
    read = memory_module.read_json_bounded
    monkeypatch.setattr(memory_module, "read_json_bounded", lambda path: reads.append(path.name) or read(path))
    memory = Memory(tmp_path / "memory", FINGERPRINT)
    first = memory.append([5, 6, 7])
    memory.append([8, 9])
    assert memory.recall().answers == [[5, 6, 7], [8, 9]] and len(reads) == 2
    memory.append([10])
    again = Memory(tmp_path / "memory", FINGERPRINT)  # another object on the same folder: the same reads
    assert again.recall().answers == [[5, 6, 7], [8, 9], [10]] and len(reads) == 3  # only the new file
    first.write_text(json.dumps({"format": 1, "fingerprint": FINGERPRINT, "tokens": [1, 2, 3, 4]}))
    assert memory.recall().answers == [[1, 2, 3, 4], [8, 9], [10]] and len(reads) == 4  # changed: read again
    first.write_text("{not json")
    recalled = memory.recall()
    assert recalled.answers == [[8, 9], [10]] and recalled.warning() and len(reads) == 5
    assert memory.recall().warning() and len(reads) == 6  # a bad file is read (and reported) every time
    first.unlink()
    assert memory.recall().answers == [[8, 9], [10]] and len(reads) == 6


def test_two_writers_at_once_lose_nothing(tmp_path):
    directory = tmp_path / "memory"
    script = ("import sys; from specdec_cli.texts.memory import Memory\n"
              "memory = Memory(sys.argv[1], 'tiny-fingerprint')\n"
              "for index in range(60): memory.append([int(sys.argv[2]), index])\n")
    root = str(Path(__file__).resolve().parents[3])
    writers = [subprocess.Popen([sys.executable, "-c", script, str(directory), str(writer)], cwd=root)
               for writer in (1, 2)]
    assert all(writer.wait(timeout=HANG_GUARD) == 0 for writer in writers)
    answers = Memory(directory, FINGERPRINT).recall().answers
    assert sorted(map(tuple, answers)) == sorted((writer, index) for writer in (1, 2) for index in range(60))


def test_sam_drafting_from_the_memory_is_greedy_identical(tiny_llama, tmp_path):
    prompts = [[1, 8, 9, 10, 11], [1, 20, 21, 22]]
    memory = Memory(tmp_path / "memory", FINGERPRINT)
    references = [hf_greedy(tiny_llama, prompt, 40) for prompt in prompts]
    for prompt, reference in zip(prompts, references):
        memory.append(reference, prompt)
    info = TargetInfo(64, (TINY_EOS,), FINGERPRINT)
    engine = fixed_engine(tiny_llama)
    for prompt, reference in zip(prompts, references):
        drafter = make_drafter("sam+none", DrafterOptions(memory=str(memory.directory)), info)
        generation = engine.generate(prompt, drafter, GenerationConfig(max_new_tokens=40, eos_token_ids=(TINY_EOS,)))
        assert generation.tokens == reference
        from_memory = [event for event in generation.events if event.draft.source == "sam-memory"]
        assert from_memory and sum(event.accepted for event in from_memory) > len(reference) // 2


def _memory_dir(home: Path) -> Path:
    folders = list((home / "memory").iterdir())
    assert len(folders) == 1, folders
    return folders[0]


def test_chat_remembers_answers_unless_told_not_to(tiny_model_dir, tmp_path):
    home = tmp_path / "home"
    base = ("chat", "--target", tiny_model_dir, "--drafter", "sam", "-n", "12", "--json")
    env = {"SPECDEC_HOME": str(home), **ON}
    assert invoke(*base, "--prompt", "abc abc", env_extra=env).returncode == 0
    directory = _memory_dir(home)
    assert len(list(directory.glob("*.json"))) == 1
    assert invoke(*base, "--prompt", "abd", "--no-memory", env_extra=env).returncode == 0
    assert invoke(*base, "--prompt", "abe", env_extra={**env, "SPECDEC_NO_MEMORY": "1"}).returncode == 0
    assert invoke(*base, "--prompt", "abf", "--compare", env_extra=env).returncode == 0  # a measurement
    assert len(list(directory.glob("*.json"))) == 1
    result = invoke("memory", "info", "--target", tiny_model_dir, "--json", env_extra=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["answers"] == 1


def test_memory_commands_import_export_and_clear(tiny_model_dir, tmp_path):
    env = {"SPECDEC_HOME": str(tmp_path / "home"), **ON}
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello memory " * 400)
    result = invoke("memory", "import", str(corpus), "--target", tiny_model_dir, env_extra=env)
    assert result.returncode == 0 and "remembered" in result.stderr, result.stderr
    exported = tmp_path / "out.jsonl"
    result = invoke("memory", "export", str(exported), "--target", tiny_model_dir, env_extra=env)
    assert result.returncode == 0, result.stderr
    assert "hello memory" in "".join(json.loads(line)["text"] for line in exported.read_text().splitlines())
    result = invoke("memory", "clear", "--target", tiny_model_dir, env_extra=env)
    assert result.returncode == 0 and "cleared" in result.stderr
    info = json.loads(invoke("memory", "info", "--target", tiny_model_dir, "--json", env_extra=env).stdout)
    assert info["answers"] == 0
    result = invoke("memory", "import", str(tmp_path / "missing.txt"), "--target", tiny_model_dir, env_extra=env)
    assert result.returncode != 0 and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bench_leaves_the_memory_alone_unless_asked(tiny_model_dir, tmp_path):
    home = tmp_path / "home"
    env = {"SPECDEC_HOME": str(home), **ON}
    assert invoke("chat", "--target", tiny_model_dir, "--prompt", "abc", "-n", "8", env_extra=env).returncode == 0
    directory = _memory_dir(home)
    before = sorted(path.name for path in directory.iterdir())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": index, "category": "x", "turns": [text]}) + "\n"
                               for index, text in enumerate(["abc", "xyz"])))
    args = ("bench", "--target", tiny_model_dir, "--prompts", str(prompts), "--drafters", "none,sam", "-n", "8",
            "--no-warmup")
    plain = invoke(*args, "--json", env_extra=env)
    assert plain.returncode == 0, plain.stderr
    assert "memory" not in json.loads(plain.stdout)["settings"]
    asked = invoke(*args, "--json", "--memory", str(directory), env_extra=env)
    assert asked.returncode == 0, asked.stderr
    memory = json.loads(asked.stdout)["settings"]["memory"]
    assert memory["answers"] == 1 and memory["answers_to_measured_prompts"] == 1  # it answered "abc" itself
    assert sorted(path.name for path in directory.iterdir()) == before
    missing = invoke(*args, "--memory", str(tmp_path / "nowhere"), env_extra=env)
    assert missing.returncode != 0 and "no such directory" in missing.stderr


def test_export_replaces_only_its_own_unchanged_export(tmp_path, monkeypatch):
    """`memory export PATH` refuses a file it did not write (before the tokenizer loads) unless --force; an
    earlier export, unchanged, is replaced; the same export edited by the user is the user's file again."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app
    from specdec_cli.errors import SpecdecError
    from specdec_cli.texts.memory import check_export_output, export_corpus

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    user_file = tmp_path / "notes.jsonl"
    user_file.write_text('{"text": "mine"}\n')
    result = CliRunner().invoke(app, ["memory", "export", str(user_file)])
    assert result.exit_code != 0 and isinstance(result.exception, SpecdecError), result.exception
    assert "specdec did not write it" in str(result.exception) and "--force" in str(result.exception)
    assert user_file.read_text() == '{"text": "mine"}\n'

    class Tokens:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(token) for token in ids)

    memory = Memory(tmp_path / "memory", FINGERPRINT)
    memory.append([5, 6])
    exported = tmp_path / "answers.jsonl"
    assert export_corpus(memory, Tokens(), check_export_output(exported)) == 1
    memory.append([7])
    assert export_corpus(memory, Tokens(), check_export_output(exported)) == 2  # its own export: replaced
    with open(exported, "a") as handle:
        handle.write('{"text": "added by hand"}\n')
    try:
        check_export_output(exported)
        raise AssertionError("an edited export was not refused")
    except SpecdecError as error:
        assert "--force" in str(error)
    assert check_export_output(exported, force=True) == exported
    assert check_export_output(user_file, force=True) == user_file


def test_importing_nothing_is_an_error(tmp_path):
    """An empty file, folder or stdin was "remembered 0 answers" with exit status 0."""
    import pytest

    from specdec_cli.errors import SpecdecError
    from specdec_cli.texts.memory import import_file

    class Tokens:
        eos_token_id = 2

        def __call__(self, texts, **options):
            return {"input_ids": [[1] * len(text) for text in texts]}

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    (tmp_path / "folder").mkdir()
    memory = Memory(tmp_path / "memory", FINGERPRINT)
    for path in (empty, tmp_path / "folder"):
        with pytest.raises(SpecdecError, match="empty corpus: no text in"):
            import_file(memory, Tokens(), str(path))
    assert memory.info()["answers"] == 0
