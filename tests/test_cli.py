"""The `composer-replication` console script from fresh processes: bad input is exit status 2 and one line on stderr.

The flag checks themselves (DemoConfig, parse_teachers, the argument parser, a hypothesis property over `main`) are
lesson cells in nbs/40_demo.ipynb and nbs/42_cli.ipynb; here are the cases that need the run's preflight (a file that
holds no session, a model folder that does not load, OpenRouter without a key, a run folder that cannot be made),
`ingest`, and one real run with `--model` pointing at a saved model folder.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXE = shutil.which("composer-replication") or str(Path(sys.executable).parent/"composer-replication")
SAMPLE = Path(__file__).resolve().parents[1]/"composer_replication"/"assets"/"sample_session"/"demo-calc-fix.jsonl"


def cli(*args, env=None, timeout=120, wrap=()):
    "Run the console script (under the command `wrap`, if given); (exit status, stdout, stderr)."
    e = {k: v for k, v in os.environ.items() if not k.startswith("OPENROUTER_")}
    e.update(env or {})
    r = subprocess.run([*map(str, wrap), EXE, *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def assert_one_line(rc, err, *needles):
    assert rc == 2, (rc, err)
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    for n in needles: assert n in err, (n, err)


@pytest.fixture
def bad(tmp_path):
    "A folder of bad inputs."
    (tmp_path/"empty.jsonl").write_text("")
    (tmp_path/"other.jsonl").write_text('{"a": 1}\n[1, 2]\nnot json\n')           # JSON, but no Claude Code record
    (tmp_path/"nojson.jsonl").write_text('[1, 2]\nnot json\n')                      # no line is a JSON object
    (tmp_path/"binary.jsonl").write_bytes(bytes(range(256)) * 8)
    (tmp_path/"notes").mkdir(); (tmp_path/"notes"/"a.txt").write_text("x")        # a folder with no .jsonl
    (tmp_path/"file").write_text("a regular file")
    m = tmp_path/"model"; m.mkdir()                                                 # looks like a model folder, is none
    (m/"config.json").write_text('{"x": 1}'); (m/"tokenizer_config.json").write_text("{}")
    (tmp_path/"runs").mkdir(); (tmp_path/"runs"/"taken").write_text("a file where the run folder would go")
    return tmp_path


@pytest.mark.parametrize("args, needles", [
    (["--session", "{d}/empty.jsonl"], ["session (--session)", "empty"]),
    (["--session", "{d}/other.jsonl", "--source", "claude-code"], ["session (--session)", "no assistant turns"]),
    (["--session", "{d}/binary.jsonl", "--source", "claude-code"], ["session (--session)", "no assistant turns"]),
    (["--source", "cursor"], ["source (--source)", "must be auto, one of"]),
    (["--session", "{d}/notes"], ["session (--session)", "no .jsonl"]),
    (["--session", "{d}/nope.jsonl"], ["session (--session)", "not found"]),
    (["--model", "{d}/model"], ["model (--model)", "cannot load"]),
    (["--model", "{d}/notes"], ["model (--model)", "config.json"]),
    (["--model", "{d}/file"], ["model (--model)", "not found"]),
    (["--out", "{d}/file/sub"], ["out (--out)", "not a folder"]),
    (["--out", "{d}/runs", "--name", "taken"], ["out (--out)", "is not a folder"]),
    (["--teachers", "openai/gpt-5,x/y@1/2"], ["teachers (--teachers)", "OPENROUTER_API_KEY"]),
    (["--teachers", "http://127.0.0.1:1/v1,a"], ["teachers (--teachers)", "1 teacher named"]),
    (["--teachers", "a/b@1/2,a/b@1/2"], ["teachers (--teachers)", "named twice"]),
    (["--teachers", "x@1/2/3"], ["teachers (--teachers)", "@in/out"]),
    (["--max-usd", "nan"], ["--max-usd"]),
    (["--seed", "-5"], ["--seed"]),
    (["--name", "../up"], ["--name"]),
])
def test_demo_bad_input_is_one_line_and_exit_2(bad, args, needles):
    rc, out, err = cli("demo", "--quiet", "--model", "tiny", "--out", bad/"runs", *[a.format(d=bad) for a in args])  # a later --model wins
    assert_one_line(rc, err, *needles)
    assert sorted(p.name for p in (bad/"runs").iterdir()) == ["taken"]    # nothing was written


def test_demo_unwritable_out(tmp_path):
    ro = tmp_path/"ro"; ro.mkdir(); ro.chmod(0o500)
    wrap = ()
    if hasattr(os, "geteuid") and os.geteuid() == 0:   # root writes through permission bits: the folder is a read-only mount instead
        if not shutil.which("bwrap"): pytest.skip("as root the folder must be a read-only mount, and bubblewrap is not installed")
        wrap = ("bwrap", "--dev-bind", "/", "/", "--ro-bind", ro, ro, "--")
    try:
        rc, out, err = cli("demo", "--quiet", "--model", "tiny", "--out", ro/"runs", wrap=wrap)
        assert_one_line(rc, err, "out (--out)", "no write permission")
        assert not (ro/"runs").exists()
    finally: ro.chmod(0o700)


@pytest.mark.parametrize("args, needles", [
    (["{d}/nope.jsonl", "--out", "{d}/o.jsonl"], ["does not exist"]),
    (["{d}/empty.jsonl", "--out", "{d}/o.jsonl"], []),
    (["{d}/nojson.jsonl", "--out", "{d}/o.jsonl"], ["not Claude Code session JSONL"]),
    (["{d}/notes", "--out", "{d}/o.jsonl"], [".jsonl"]),
    (["{d}/file", "--out", "{d}/o.jsonl"], [".jsonl"]),
    ([str(SAMPLE), "--out", "{d}/file/o.jsonl"], ["--out"]),
    ([str(SAMPLE), "--out", "{d}"], ["--out"]),
])
def test_ingest_bad_input_is_one_line_and_exit_2(bad, args, needles):
    rc, out, err = cli("ingest", "--quiet", *[a.format(d=bad) for a in args])
    assert_one_line(rc, err, *needles)
    assert not (bad/"o.jsonl").exists()


def test_usage_errors_are_one_line():
    for args in (["demo", "--model", "tiny", "--steps", "x"], ["demo", "--model", "tiny", "--teachers"], ["nope"], ["ingest"]):
        rc, out, err = cli(*args)
        assert rc == 2 and len(err.splitlines()) == 1 and "error:" in err, (args, err)


@pytest.mark.slow
def test_demo_with_a_model_folder(tmp_path):
    "`--model` with a saved causal LM folder runs the whole job (the tiny Llama and its tokenizer, saved)."
    from composer_replication.tiny import tiny_causal_lm, tiny_tokenizer
    tiny_causal_lm(seed=1).save_pretrained(tmp_path/"m"); tiny_tokenizer().save_pretrained(tmp_path/"m")
    rc, out, err = cli("demo", "--model", tmp_path/"m", "--steps", "2", "--out", tmp_path/"runs", "--name", "r", timeout=300)
    assert rc == 0, err[-2000:]
    s = json.loads((tmp_path/"runs"/"r"/"summary.json").read_text())
    assert (s["pairs"], s["steps"], s["config"]["model"]) == (2, 2, str(tmp_path/"m"))
    assert 0 < s["timings"]["train_s"] < s["timings"]["total_s"]
    last = out.strip().splitlines()[-1]          # the last line reports training and total time apart
    assert f"training {s['timings']['train_s']:.1f}s" in last and f"whole run {s['timings']['total_s']:.1f}s" in last, last
