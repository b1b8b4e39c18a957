"""A drafter option the chosen drafter(s) do not use is an error, before the model loads, in chat, bench and
distill generate (`--drafter pld --index /nonexistent.sam` used to exit 0, `--draft-model` was ignored by sam)."""

from __future__ import annotations

import pytest
from conftest import run_cli

from specdec_cli.drafters import DrafterOptions, check_drafter_options
from specdec_cli.errors import SpecdecError


@pytest.mark.parametrize("names, options, needle", [
    ("pld", DrafterOptions(index="/nonexistent.sam"), "index /nonexistent.sam: pld does not use it"),
    ("sam", DrafterOptions(draft_model="/nonexistent"), "draft_model /nonexistent: sam does not use it"),
    ("sam+none", DrafterOptions(draft_model="/nonexistent"), "sam+none does not use it"),
    ("none", DrafterOptions(draft_min_prob=0.2), "draft_min_prob 0.2: none does not use it"),
    ("pld", DrafterOptions(aux="recycle"), "aux recycle: pld does not use it"),
    ("sam+pld", DrafterOptions(aux="recycle"), "names its own"),
    ("recycle", DrafterOptions(memory="/tmp"), "memory /tmp: recycle does not use it"),
    ("aded", DrafterOptions(l_threshold=3), "l_threshold 3: aded does not use it"),
    (["none", "pld", "recycle"], DrafterOptions(index="x.sam"), "none, pld, recycle does not use it"),
])
def test_an_option_no_drafter_uses_is_an_error(names, options, needle):
    with pytest.raises(SpecdecError, match="does not use it") as raised:
        check_drafter_options(names, options)
    assert needle in str(raised.value)


@pytest.mark.parametrize("names, options", [  # as bench gives them: all its drafters at once
    (["none", "sam"], DrafterOptions(aux="recycle", l_threshold=3)),
    (["none", "sam+model"], DrafterOptions(draft_min_prob=0.1)),
    (["none", "pld", "sam+none"], DrafterOptions(l_threshold=2)),
    (["none", "pld"], DrafterOptions()),
])
def test_options_one_of_the_drafters_uses_pass(names, options):
    try:
        check_drafter_options(names, options)
    except SpecdecError as exc:  # only the files behind them may be missing here, not the option unused
        assert "does not use it" not in str(exc)


@pytest.mark.parametrize("args, needle", [
    (["chat", "-p", "hi", "--drafter", "pld", "--index", "/nonexistent.sam"], "--index /nonexistent.sam: pld does"),
    (["chat", "-p", "hi", "--drafter", "sam", "--draft-model", "/nonexistent"], "--draft-model /nonexistent: sam"),
    (["chat", "-p", "hi", "--drafter", "pld", "--aux", "recycle"], "--aux recycle: pld does not use it"),
    (["bench", "--drafters", "none,pld", "--index", "/nonexistent.sam"], "--index /nonexistent.sam: none, pld"),
    (["bench", "--drafters", "none,sam", "--draft-model", "/nonexistent"], "--draft-model /nonexistent: none, sam"),
    (["distill", "generate", "--suite", "builtin", "-o", "a.jsonl", "--drafter", "pld", "--index", "/nonexistent.sam"],
     "--index /nonexistent.sam: pld does not use it"),
])
def test_the_commands_refuse_them_before_the_model_loads(tmp_path, args, needle):
    result = run_cli(*args, env_extra={"SPECDEC_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error:") and needle in lines[0], result.stderr
    assert not (tmp_path / "home" / "models").exists()  # the model was never loaded


def test_bench_in_vllm_refuses_an_index_no_proposer_reads():
    from specdec_cli.bench.vllm_bench import VllmBenchSettings

    with pytest.raises(SpecdecError, match="index /nonexistent.sam: pld does not use it"):
        VllmBenchSettings(methods=["none", "pld"], index="/nonexistent.sam").check()
    with pytest.raises(SpecdecError, match="index file not found"):  # sam reads it: so it must exist
        VllmBenchSettings(methods=["none", "sam", "pld"], index="/nonexistent.sam").check()
