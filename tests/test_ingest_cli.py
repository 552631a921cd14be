"""`composer-replication ingest` never writes over its input (issue 22 point 3), run as a user would: a subprocess."""
import hashlib, os, shutil, subprocess, sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "fixtures" / "claude_code"
CODEX = ROOT / "tests" / "fixtures" / "codex"
EXE = Path(sys.executable).parent / "composer-replication"

def ingest(*args):
    cmd = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "composer_replication.cli"]
    return subprocess.run(cmd + ["ingest", *map(str, args)], capture_output=True, text=True, timeout=120)

def digest(p): return hashlib.sha256(Path(p).read_bytes()).hexdigest()

@pytest.fixture
def session(tmp_path):
    src = SHARED / "01_spotter_short_v2.1.38.jsonl"
    if not src.exists(): pytest.skip("shared fixtures missing")
    d = tmp_path / "proj"; d.mkdir()
    f = d / "s.jsonl"; shutil.copy(src, f)
    return f

def _refused(r, f, before):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "refusing to overwrite" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert digest(f) == before  # the session log is byte-identical
    assert not list(f.parent.rglob(".*.tmp"))  # and nothing was written beside it

def test_out_is_the_input(session):
    before = digest(session)
    _refused(ingest(session, "--out", session), session, before)

def test_out_is_the_input_by_another_spelling(session, tmp_path):
    before = digest(session)
    other = session.parent / ".." / session.parent.name / "." / session.name
    _refused(ingest(session, "--out", other), session, before)
    os.chdir(session.parent)
    try: _refused(ingest("s.jsonl", "--out", "./s.jsonl"), session, before)
    finally: os.chdir(ROOT)

def test_out_is_a_symlink_to_the_input(session, tmp_path):
    before = digest(session)
    link = tmp_path / "link.jsonl"; link.symlink_to(session)
    _refused(ingest(session, "--out", link), session, before)
    _refused(ingest(link, "--out", session), session, before)
    hard = tmp_path / "hard.jsonl"; os.link(session, hard)
    _refused(ingest(session, "--out", hard), session, before)

def test_out_is_a_session_inside_the_folder(session):
    before = digest(session)
    _refused(ingest(session.parent, "--out", session), session, before)

def test_codex_rollout_is_refused_too(tmp_path):
    src = CODEX / "rollout-01-yoavf-pomodoro-v0.47.0-excerpt.jsonl"
    f = tmp_path / src.name; shutil.copy(src, f)
    before = digest(f)
    _refused(ingest(f, "--out", f, "--source", "codex"), f, before)

def test_a_new_out_still_works(session, tmp_path):
    out = tmp_path / "states.jsonl"
    r = ingest(session.parent, "--out", out)
    assert r.returncode == 0, r.stderr
    rows = [orjson.loads(l) for l in out.read_bytes().splitlines()]
    assert rows and all(r["state_id"].startswith("s::") for r in rows)
    again = ingest(session.parent, "--out", out)  # writing over an earlier output (not an input) is fine
    assert again.returncode == 0 and [orjson.loads(l) for l in out.read_bytes().splitlines()] == rows

def test_a_lone_surrogate_in_a_tool_result_gives_valid_utf8(session, tmp_path):
    "A `\\ud800` escape in a real session's tool result: states.jsonl is valid UTF-8, the repair counted on stdout."
    src = SHARED / "06_ccviewer_1af7fc5e_v1.0.98.jsonl"   # tool results followed by more assistant turns
    if not src.exists(): pytest.skip("shared fixtures missing")
    lines = src.read_text(encoding="utf-8").splitlines()
    i = next(k for k, l in enumerate(lines) if '"tool_result"' in l)
    rec = orjson.loads(lines[i])
    for blk in rec["message"]["content"]:
        if blk.get("type") == "tool_result":
            blk["content"] = "half an emoji: \ud83d" if isinstance(blk["content"], str) else [{"type": "text", "text": "half an emoji: \ud83d"}]
    import json
    lines[i] = json.dumps(rec)                     # ASCII with a \ud83d escape: valid JSON, a lone surrogate once parsed
    session.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "states.jsonl"
    r = ingest(session, "--out", out)
    assert r.returncode == 0, r.stderr
    text = out.read_bytes().decode("utf-8")        # strict: raises on any surrogate written as bytes
    assert "half an emoji: \ufffd" in text
    assert "lone surrogates replaced: " in r.stdout, r.stdout     # once per state whose history holds it
