"""The CLI in-process: --help for every subcommand, generate --json, and user errors printed
as one line without a traceback."""
from __future__ import annotations

import json

import pytest

from tightfit.cli.main import SUBCOMMANDS, build_parser, main


def test_every_subcommand_has_help(capsys):
    parser = build_parser()
    names = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"generate", "chat", "predict", "check"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        assert "usage: tightfit " + name in capsys.readouterr().out


def test_generate_json_reports_timings(capsys):
    code = main(["generate", "The capital of France is", "--max-tokens", "6", "--json",
                 "--threads", "2"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(out["token_ids"]) == out["completion_tokens"] <= 6
    assert out["ttft_s"] > 0 and out["peak_rss_mb"] > 0 and "Paris" in out["text"]


@pytest.mark.parametrize("argv, needle", [
    (["generate", "hi", "--model", "/nope/model.gguf"], "/nope/model.gguf"),
    (["generate", "hi", "--temperature", "-3"], "temperature"),
    (["generate", "hi", "--quant", "int5"], "int5"),
    (["generate", "hi", "--kv-tiers", "short:512:1.5"], "share must be in (0, 1], got 1.5"),
    (["generate", "hi", "--kv-tiers", "short:0:0.5"], "max_len must be >= 1, got 0"),
    (["generate", "hi", "--kv-tiers", "short:abc"], "cannot read KV tier 'short:abc'"),
    (["generate", "hi", "--kv-tiers", "a:512:0.6,b:2048:0.6"], "add up to 1.2"),
])
def test_user_errors_are_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_kv_tiers_parse():
    from tightfit.cli.common import parse_tiers

    assert parse_tiers("short:512:0.3, long:2048:0.7") == (("short", 512, 0.3),
                                                            ("long", 2048, 0.7))
    assert parse_tiers(None) is None


def test_kv_tiers_reach_the_engine(monkeypatch):
    import argparse

    import tightfit
    from tightfit.cli.common import add_model_args, build_llm

    seen = {}
    monkeypatch.setattr(tightfit, "LLM", lambda **kw: seen.update(kw))
    p = argparse.ArgumentParser()
    add_model_args(p)
    build_llm(p.parse_args(["--kv-tiers", "s:256:0.25,l:2048:0.75"]))
    assert seen["tiers"] == (("s", 256, 0.25), ("l", 2048, 0.75))
