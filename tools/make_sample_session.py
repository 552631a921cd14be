"""Write the sample Claude Code session the demo ingests (composer_replication/assets/sample_session/).

    python tools/make_sample_session.py           # rewrite the shipped file
    python tools/make_sample_session.py --check   # exit 1 if the shipped file differs

The session was written for this project in the Claude Code 2.1.x format (one line per content block,
lines of one API response sharing `message.id` and `requestId`, `progress` lines in between, tool results
as `user` lines matched by `tool_use_id`). It tells a small, realistic story with what the pipeline must
handle: parallel tool calls, a failing test run, a schema error (`InputValidationError`), a precondition
error (Write before Read), thinking blocks, an `isMeta` line, a hook summary and a file-history snapshot.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "composer_replication/assets/sample_session/demo-calc-fix.jsonl"
SESSION = "0c5e7d2a-demo-4b1f-9a53-5a3f1c2e8d10"
BASE = dict(isSidechain=False, userType="external", cwd="/home/user/calc", sessionId=SESSION, version="2.1.38", gitBranch="main")

TEST_V1 = "from calc.core import add, mul\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
CORE_V1 = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"


class Writer:
    def __init__(self):
        self.lines, self.parent, self.n, self.t = [], None, 0, 0

    def _ids(self, prefix):
        self.n += 1
        return f"{prefix}-{self.n:04d}-0000-4000-8000-{self.n:012d}"

    def _ts(self):
        self.t += 3
        return f"2026-02-10T09:{self.t // 60:02d}:{self.t % 60:02d}.000Z"

    def add(self, rec, chain=True):
        uid = self._ids("u")
        rec = {"parentUuid": self.parent, **BASE, **rec, "uuid": uid, "timestamp": self._ts()}
        self.lines.append(rec)
        if chain:
            self.parent = uid
        return rec

    def user(self, content, **extra):
        return self.add({"type": "user", "message": {"role": "user", "content": content}, **extra})

    def assistant(self, blocks):
        "One API response: one line per content block, shared message id and request id, a progress line between."
        mid, rid = self._ids("msg"), self._ids("req")
        ids = []
        for k, b in enumerate(blocks):
            if b["type"] == "tool_use":
                b = {**b, "id": self._ids("toolu")}
                ids.append(b["id"])
            msg = {"model": "claude-opus-4-6", "id": mid, "type": "message", "role": "assistant", "content": [b],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 3, "output_tokens": 40 + 7 * k, "cache_read_input_tokens": 12000}}
            self.add({"type": "assistant", "message": msg, "requestId": rid})
            if k == 0 and len(blocks) > 1:
                self.add({"type": "progress", "data": {"type": "hook_progress", "hookEvent": "PostToolUse", "hookName": "fmt"},
                          "toolUseID": mid}, chain=False)
        return ids

    def results(self, ids, outputs):
        "Tool results in later user lines, matched by tool_use_id (out of order on purpose when several)."
        for i in reversed(range(len(ids))):
            text, err = outputs[i]
            block = {"tool_use_id": ids[i], "type": "tool_result", "content": text}
            if err is not None:
                block["is_error"] = err
            self.user([block], toolUseResult={"stdout": text} if not err else f"Error: {text}")


def build() -> list[dict]:
    w = Writer()
    w.add({"type": "file-history-snapshot", "messageId": "snap-0001", "snapshot": {"trackedFileBackups": {}}}, chain=False)
    w.user("<command-message>fix-tests</command-message>\n<command-name>/fix-tests</command-name>", isMeta=True)
    w.user("The tests in tests/test_calc.py fail. Please find the bug and fix it.")
    ids = w.assistant([
        {"type": "thinking", "thinking": "Start by reading the failing test and the module it imports.", "signature": "sig-demo-1"},
        {"type": "text", "text": "I'll read the test and the module it tests."},
        {"type": "tool_use", "name": "Read", "input": {"file_path": "/home/user/calc/tests/test_calc.py"}},
        {"type": "tool_use", "name": "Read", "input": {"file_path": "/home/user/calc/calc/core.py"}},
    ])
    w.results(ids, [(TEST_V1, None), (CORE_V1, False)])
    ids = w.assistant([{"type": "tool_use", "name": "Bash", "input": {"command": "python -m pytest -q", "description": "Run the tests"}}])
    w.results(ids, [("Exit code 1\n.F\n=== FAILURES ===\n___ test_add ___\n    def test_add():\n>       assert add(1, 2) == 3\n"
                     "E       assert -1 == 3\nFAILED tests/test_calc.py::test_add - assert -1 == 3\n1 failed, 1 passed in 0.03s", True)])
    ids = w.assistant([
        {"type": "text", "text": "`add` subtracts instead of adding. Fixing it."},
        {"type": "tool_use", "name": "Edit", "input": {"file_path": "/home/user/calc/calc/core.py", "new_string": "    return a + b"}},
    ])
    w.results(ids, [("<tool_use_error>InputValidationError: Edit failed due to the following issue:\n"
                     "The required parameter `old_string` is missing</tool_use_error>", True)])
    ids = w.assistant([{"type": "tool_use", "name": "Edit", "input": {
        "file_path": "/home/user/calc/calc/core.py", "old_string": "    return a - b", "new_string": "    return a + b"}}])
    w.results(ids, [("The file /home/user/calc/calc/core.py has been updated.", None)])
    ids = w.assistant([
        {"type": "tool_use", "name": "Bash", "input": {"command": "python -m pytest -q", "description": "Run the tests"}},
        {"type": "tool_use", "name": "Grep", "input": {"pattern": "a - b", "path": "/home/user/calc"}},
    ])
    w.results(ids, [("..\n2 passed in 0.02s", None), ("No matches found", None)])
    w.assistant([{"type": "text", "text": "Fixed: `add` in calc/core.py returned `a - b`. It now returns `a + b`, and both tests pass."}])
    w.add({"type": "system", "subtype": "stop_hook_summary", "hookCount": 1, "hookInfos": [{"command": "fmt"}],
           "hookErrors": [], "preventedContinuation": False, "level": "suggestion"})
    w.user("Also add a test for negative numbers.")
    ids = w.assistant([
        {"type": "thinking", "thinking": "Append a test_add_negative function to the test file.", "signature": "sig-demo-2"},
        {"type": "tool_use", "name": "Write", "input": {"file_path": "/home/user/calc/tests/test_calc.py",
                                                        "content": TEST_V1 + "\n\ndef test_add_negative():\n    assert add(-1, -2) == -3\n"}},
    ])
    w.results(ids, [("<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>", True)])
    ids = w.assistant([{"type": "tool_use", "name": "Read", "input": {"file_path": "/home/user/calc/tests/test_calc.py"}}])
    w.results(ids, [(TEST_V1, None)])
    ids = w.assistant([{"type": "tool_use", "name": "Edit", "input": {
        "file_path": "/home/user/calc/tests/test_calc.py", "old_string": "def test_mul():",
        "new_string": "def test_add_negative():\n    assert add(-1, -2) == -3\n\n\ndef test_mul():"}}])
    w.results(ids, [("The file /home/user/calc/tests/test_calc.py has been updated.", None)])
    ids = w.assistant([{"type": "tool_use", "name": "Bash", "input": {"command": "python -m pytest -q", "description": "Run the tests"}}])
    w.results(ids, [("...\n3 passed in 0.02s", None)])
    w.assistant([{"type": "text", "text": "Added `test_add_negative`; all 3 tests pass."}])
    return w.lines


def render() -> str:
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in build())


def main(argv) -> int:
    text = render()
    if "--check" in argv:
        ok = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print("sample session reproduces exactly" if ok else f"{OUT} differs from tools/make_sample_session.py")
        return 0 if ok else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
