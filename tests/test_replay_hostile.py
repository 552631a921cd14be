"""Teacher replay against hostile servers: malformed replies, lying usage, slow drips, torn or foreign journals, bad pairs files.

The servers here are written for the tests (a raw HTTP/1.1 server on 127.0.0.1, port 0, in a background thread, stopped
by each test) so that they can answer what no honest server would: bodies of the wrong shape, usage that lies, a
reply that arrives one byte every 0.1 s. Requests are counted *at the server*.
"""
import asyncio
import hashlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from composer_replication.teacher_replay import (TeacherReplayError, scan_journal, extract_dpo_pairs, load_pairs, read_journal,
                                                 replay_trace, save_pairs, worst_case_usd)
from composer_replication.teacher_server import ModelPolicy, TeacherServer
from composer_replication.ingestion.core import render_action

SYS = {"role": "system", "content": "You are a coding agent."}
RESULT_KEYS = {"state_id", "teacher_slug", "response_text", "action", "latency_s", "prompt_tokens", "completion_tokens", "cost_usd", "error"}


def make_states(n, size=100, prefix="s"):
    return [{"state_id": f"{prefix}::{i:04d}", "messages": [SYS, {"role": "user", "content": f"task {i} " + "x" * size}],
             "student_action": "ok"} for i in range(n)]


def teachers(*slugs, price=(1.0, 2.0)):
    return [{"slug": s, "input_per_mtok": price[0], "output_per_mtok": price[1]} for s in slugs]


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- a raw, scriptable HTTP server


@dataclass
class Answer:
    "What the raw server sends back for one request."
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    drip_s: float | None = None      # send the head at once, then the body one byte every drip_s seconds
    no_head: bool = False            # read the request, then never answer
    chunked: bool = False            # send the body chunked (no Content-Length), 1,000 bytes a chunk


def completion(content="ok", usage=None, **msg):
    "A well-formed chat.completion body (bytes) with the given usage."
    u = {"prompt_tokens": 10, "completion_tokens": 2} if usage is None else usage
    return orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content, **msg}}], "usage": u})


class RawServer:
    "HTTP/1.1 on 127.0.0.1 in a background thread; `handler(request) -> Answer` scripts every answer."
    def __init__(self, handler):
        self.handler, self.requests, self._lock = handler, [], threading.Lock()

    def __enter__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True); self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        return self

    def __exit__(self, *exc):
        async def shutdown():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks: t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop); self.thread.join(10); self.loop.close()

    def count(self, model=None):
        return sum(1 for r in self.requests if model is None or r["model"] == model)

    async def _handle(self, reader, writer):
        try:
            while True:
                try: head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError): return
                hdrs = dict(l.split(":", 1) for l in head.decode("latin-1").split("\r\n")[1:] if ":" in l)
                hdrs = {k.strip().lower(): v.strip() for k, v in hdrs.items()}
                raw = await reader.readexactly(int(hdrs.get("content-length") or 0))
                body = orjson.loads(raw)
                req = {"model": body.get("model"), "body": body, "raw": raw, "t": time.monotonic(), "headers": hdrs}
                with self._lock:
                    req["n"] = sum(1 for r in self.requests if r["model"] == req["model"])
                    self.requests.append(req)
                a = self.handler(req)
                if a.no_head: await asyncio.sleep(3600); return
                extra = "".join(f"{k}: {v}\r\n" for k, v in a.headers.items())
                if a.chunked:
                    writer.write(f"HTTP/1.1 {a.status} X\r\nTransfer-Encoding: chunked\r\n{extra}\r\n".encode("latin-1"))
                    for i in range(0, len(a.body), 1000):
                        part = a.body[i:i + 1000]; writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    writer.write(b"0\r\n\r\n"); await writer.drain(); continue
                writer.write(f"HTTP/1.1 {a.status} X\r\nContent-Length: {len(a.body)}\r\n{extra}\r\n".encode("latin-1"))
                if a.drip_s is None: writer.write(a.body)
                else:
                    for i in range(len(a.body)):
                        if writer.is_closing() or reader.at_eof(): return
                        writer.write(a.body[i:i + 1]); await writer.drain(); await asyncio.sleep(a.drip_s)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError): return
        finally: writer.close()


def need_of(req, t, max_tokens):
    "The client's reserved worst case for this request (its body is exactly what the client serialised)."
    return worst_case_usd(len(req["raw"]), t, max_tokens)


# --------------------------------------------------------------------------- A. malformed replies


MALFORMED = [   # (id, 200 body, what the error row must say)
    ("message-str", orjson.dumps({"choices": [{"message": "ok"}]}), "choices[0]['message'] must be a dict, got str"),
    ("message-null", orjson.dumps({"choices": [{"message": None}]}), "choices[0]['message'] must be a dict, got null"),
    ("no-message", orjson.dumps({"choices": [{"text": "ok"}]}), "choices[0] has no message"),
    ("choices-missing", orjson.dumps({"id": "x"}), "the body has no choices"),
    ("choices-empty", orjson.dumps({"choices": []}), "choices must be a non-empty list, got an empty list"),
    ("choices-dict", orjson.dumps({"choices": {"message": {}}}), "choices must be a non-empty list, got dict"),
    ("choices-str", orjson.dumps({"choices": "ok"}), "choices must be a non-empty list, got str"),
    ("choice-int", orjson.dumps({"choices": [3]}), "choices[0] must be a dict, got int"),
    ("content-int", completion(7), "message['content'] must be a str, a list of parts or null, got int"),
    ("tool_calls-str", completion(None, tool_calls="Bash"), "message['tool_calls'] must be a list, got str"),
    ("tool_calls-dict", completion(None, tool_calls={"function": {"name": "Bash"}}), "message['tool_calls'] must be a list, got dict"),
    ("tool_calls-ints", completion(None, tool_calls=[1, 2]), "message['tool_calls'][0] must be a dict, got int"),
    ("function-str", completion(None, tool_calls=[{"function": "Bash"}]), "message['tool_calls'][0]['function'] must be a dict, got str"),
    ("name-missing", completion(None, tool_calls=[{"function": {"arguments": "{}"}}]), "['function']['name'] must be a non-empty str, got null"),
    ("arguments-int", completion(None, tool_calls=[{"function": {"name": "Bash", "arguments": 5}}]), "['arguments'] must be a JSON str, got int"),
    ("arguments-list", completion(None, tool_calls=[{"function": {"name": "Bash", "arguments": ["ls"]}}]), "['arguments'] must be a JSON str, got list"),
    ("not-json", b"<html>502 Bad Gateway</html>", "the body is not JSON ('<html>502 Bad Gateway</html>')"),
    ("empty", b"", "the body is not JSON"),
    ("json-list", b'[{"choices": []}]', "the body is list, not a JSON object"),
    ("json-null", b"null", "the body is null, not a JSON object"),
    ("infinite-number", b'{"choices": [{"message": {"content": "ok"}}], "usage": {"cost": 1e999}}', "the body is not JSON"),
]


@pytest.mark.parametrize("body,expected", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_200_is_an_error_row_and_the_run_goes_on(body, expected):
    """A 200 of the wrong shape fails that call (retried once, then an error row naming the field); the rest is kept."""
    T = teachers("t/good", "t/bad")
    with RawServer(lambda r: Answer(200, completion("fine") if r["model"] == "t/good" else body)) as srv:
        res = run(replay_trace(make_states(2), T, base_url=srv.url, max_retries=1, backoff_s=0.001, max_tokens=64, progress=False))
        bad_needs = [need_of(r, T[1], 64) for r in srv.requests if r["model"] == "t/bad"]
        assert (srv.count("t/good"), srv.count("t/bad")) == (2, 4)
    assert [r["teacher_slug"] for r in res] == ["t/good", "t/bad"] * 2 and all(set(r) == RESULT_KEYS for r in res)
    assert [r["response_text"] for r in res] == ["fine", None, "fine", None]
    for r in res[1::2]:
        assert r["error"].startswith("HTTP 200 with a malformed reply: ") and expected in r["error"], r["error"]
        assert "after 2 attempt(s)" in r["error"]
    # each attempt is charged its believable usage (10 prompt + 2 completion tokens), else its reserved worst case
    try: usage = orjson.loads(body).get("usage")
    except (orjson.JSONDecodeError, AttributeError): usage = None
    expected = [(10 * 1.0 + 2 * 2.0) / 1e6] * 4 if usage else bad_needs
    assert abs(sum(r["cost_usd"] for r in res[1::2]) - sum(expected)) < 1e-15
    assert abs(res.spent_usd - sum(r["cost_usd"] for r in res)) < 1e-15


@pytest.mark.parametrize("usage", [[1, 2], {"prompt_tokens": "many", "completion_tokens": 2}, "lots"], ids=["list", "many", "str"])
def test_a_good_message_with_unusable_usage_is_kept_at_worst_case(usage, caplog):
    """The reply itself is fine, so it is kept (it has been paid for); its usage cannot be read, so it costs the worst case."""
    T = teachers("t/0")
    with RawServer(lambda r: Answer(200, completion("fine", usage=usage))) as srv:
        res = run(replay_trace(make_states(3), T, base_url=srv.url, max_tokens=64, progress=False))
        needs = [need_of(r, T[0], 64) for r in srv.requests]
    assert [r["response_text"] for r in res] == ["fine"] * 3 and {r["error"] for r in res} == {None}
    assert [r["cost_usd"] for r in res] == needs and [(r["prompt_tokens"], r["completion_tokens"]) for r in res] == [(0, 0)] * 3
    assert sum("usage not trusted" in m for m in caplog.messages) == 1        # warned once per teacher, not per call


# --------------------------------------------------------------------------- B. the cap holds against lying usage


LIES = [
    ("negative-prompt", {"prompt_tokens": -1_000_000_000, "completion_tokens": 5}),
    ("negative-completion", {"prompt_tokens": 10, "completion_tokens": -10**12}),
    ("negative-cost", {"prompt_tokens": 10, "completion_tokens": 5, "cost": -100.0}),
    ("cost-str", {"prompt_tokens": 10, "completion_tokens": 5, "cost": "free"}),
    ("cost-bool", {"prompt_tokens": 10, "completion_tokens": 5, "cost": False}),
    ("cost-above-worst-case", {"prompt_tokens": 10, "completion_tokens": 5, "cost": 1e9}),
    ("absurd-prompt", {"prompt_tokens": 10**15, "completion_tokens": 5}),
    ("more-than-max_tokens", {"prompt_tokens": 10, "completion_tokens": 65}),
    ("fractional", {"prompt_tokens": 10.5, "completion_tokens": 5}),
    ("tokens-missing", {"total_tokens": 15}),
    ("one-count-missing", {"prompt_tokens": 10}),
    ("no-usage", None),
]


@pytest.mark.parametrize("usage", [l[1] for l in LIES], ids=[l[0] for l in LIES])
def test_lying_usage_cannot_break_the_cap(usage):
    """Each call really costs its worst case; the server says otherwise. The client must still stop at the cap."""
    T, max_tokens = teachers("t/0"), 64
    def answer(req):
        body = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
        if usage is not None: body["usage"] = usage
        return Answer(200, orjson.dumps(body))
    states = make_states(40)
    with RawServer(answer) as srv:
        one = worst_case_usd(len(orjson.dumps({"messages": []})) + 400, T[0], max_tokens)   # about one call's worst case
        cap = 5.5 * one
        res = run(replay_trace(states, T, max_total_usd=cap, base_url=srv.url, max_concurrency=4, max_tokens=max_tokens,
                               progress=False))
        billed = sum(need_of(r, T[0], max_tokens) for r in srv.requests)        # what the provider "really" billed
        calls = srv.count()
    assert 1 <= calls < 40 and res.stopped == "budget" and len(res) + len(res.not_attempted) == 40
    assert billed <= cap * (1 + 1e-12), (billed, cap, calls)
    assert res.spent_usd <= cap * (1 + 1e-12) and abs(res.spent_usd - billed) < 1e-12      # every call charged its worst case
    assert {r["response_text"] for r in res} == {"ok"}


def test_believable_usage_is_still_charged_as_reported():
    """The control: honest usage is charged as reported (tokens x prices, or usage.cost), not at the worst case."""
    T = teachers("t/0", "t/1")
    def answer(req):
        u = {"prompt_tokens": 100, "completion_tokens": 7} if req["model"] == "t/0" else {"prompt_tokens": 1, "completion_tokens": 1, "cost": 1.5e-6}
        return Answer(200, completion("ok", usage=u))
    with RawServer(answer) as srv:
        res = run(replay_trace(make_states(1), T, base_url=srv.url, max_tokens=64, progress=False))
    assert [r["cost_usd"] for r in res] == [(100 * 1.0 + 7 * 2.0) / 1e6, 1.5e-6]
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in res] == [(100, 7), (1, 1)]


# --------------------------------------------------------------------------- C. slow drips are cut off


@pytest.fixture(params=["aiohttp", "httpx", "httpx-py310"])
def transport(request, monkeypatch):
    if request.param == "aiohttp": pytest.importorskip("aiohttp")
    if request.param == "httpx-py310":          # the Python 3.10 path: no asyncio.timeout, asyncio.wait_for instead
        monkeypatch.delattr(asyncio, "timeout", raising=False)
        return "httpx"
    return request.param


@pytest.mark.parametrize("mode", ["drip-body", "no-headers"])
def test_slow_drip_is_cut_off_at_timeout_s(transport, mode):
    """Headers, then one byte every 0.1 s (or nothing at all): each attempt is cut off at timeout_s for the whole exchange."""
    T = teachers("t/good", "t/slow")
    body = completion("fine")
    def answer(req):
        if req["model"] == "t/good": return Answer(200, body)
        return Answer(200, body + b" " * 1000, drip_s=0.1) if mode == "drip-body" else Answer(no_head=True)
    with RawServer(answer) as srv:
        t0 = time.perf_counter()
        res = run(replay_trace(make_states(2), T, base_url=srv.url, timeout_s=0.6, max_retries=1, backoff_s=0.01,
                               transport=transport, progress=False))
        wall = time.perf_counter() - t0
        assert (srv.count("t/good"), srv.count("t/slow")) == (2, 4)
    assert wall < 20.0, wall                # 2 attempts x 0.6 s (the states run in parallel); the drip alone would take 100 s (a loaded machine is slower)
    assert [r["response_text"] for r in res] == ["fine", None, "fine", None]
    for r in res[1::2]:
        assert "timed out: no complete answer within timeout_s=0.6 s" in r["error"] and "after 2 attempt(s)" in r["error"], r["error"]
        assert r["cost_usd"] > 0              # sent, fate unknown: charged at worst case


@pytest.mark.parametrize("chunked", [False, True])
def test_a_reply_over_max_reply_bytes_is_an_error_row(transport, chunked):
    """A body over max_reply_bytes (announced by Content-Length, or chunked) fails that call once, at worst case; the rest is kept."""
    T, cap = teachers("t/good", "t/big"), 4096
    small, big = completion("fine"), completion("x" * 10_000)
    with RawServer(lambda req: Answer(200, big if req["model"] == "t/big" else small, chunked=chunked)) as srv:
        res = run(replay_trace(make_states(2), T, base_url=srv.url, max_reply_bytes=cap, max_tokens=64, backoff_s=0.001,
                               transport=transport, progress=False))
        assert (srv.count("t/good"), srv.count("t/big")) == (2, 2)                 # not retried: it would be the same answer
        needs = [need_of(r, T[1], 64) for r in srv.requests if r["model"] == "t/big"]
    assert [r["response_text"] for r in res] == ["fine", None, "fine", None]
    for r in res[1::2]:
        assert "more than max_reply_bytes=4096" in r["error"] and "after 1 attempt(s)" in r["error"], r["error"]
        assert r["action"] is None and r["cost_usd"] in needs                      # answered, maybe billed: its worst case
    with RawServer(lambda req: Answer(200, big, chunked=chunked)) as srv:          # a cap above the body: the reply is kept
        ok = run(replay_trace(make_states(1), T[1:], base_url=srv.url, max_reply_bytes=len(big), transport=transport, progress=False))
    assert ok[0]["response_text"] == "x" * 10_000


# --------------------------------------------------------------------------- 6. journals: torn, foreign, old


def _honest():
    return {f"t/{i}": ModelPolicy(reply="ok", input_per_mtok=1.0, output_per_mtok=2.0) for i in range(3)}


def test_torn_journal_resumes_redoing_only_the_torn_call(tmp_path):
    T, states, j = teachers("t/0", "t/1"), make_states(5), tmp_path / "j.jsonl"
    with TeacherServer(_honest()) as srv:
        first = run(replay_trace(states, T, base_url=srv.url, journal=j, progress=False))
        assert srv.calls == 10 and len(first) == 10
        data = j.read_bytes()
        last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
        j.write_bytes(data[:len(data) - len(last) // 2 - 1])                 # a crash half way through the last line
        torn = orjson.loads(last)
        res = run(replay_trace(states, T, base_url=srv.url, journal=j, progress=False))
        assert srv.calls == 11                                                # the torn call, and nothing else, is redone
        assert [m for (m, _), n in srv.counts.items() if n == 2] == [torn["teacher_slug"]]   # ... for the torn line's teacher
        assert (len(res), res.from_journal, res.bad_journal_lines) == (10, 9, 1) and {r["error"] for r in res} == {None}
        again = run(replay_trace(states, T, base_url=srv.url, journal=j, progress=False))
        assert srv.calls == 11 and again.from_journal == 10                   # the torn line stays skipped, nothing resent
    rows, headers, st = scan_journal(j)
    assert len(rows) == 10 and len(headers) == 1 and st.bad == 1 and "cut mid-write" not in st.report()   # (no longer the last line)


def test_journal_of_another_run_is_refused(tmp_path):
    T, states, j = teachers("t/0", "t/1"), make_states(4), tmp_path / "j.jsonl"
    with TeacherServer(_honest()) as srv:
        run(replay_trace(states, T, base_url=srv.url, journal=j, progress=False))
        before, calls = j.read_bytes(), srv.calls
        with pytest.raises(ValueError, match=r"its teachers are \['t/0', 't/1'\], this run's \['t/0', 't/1', 't/2'\]") as ei:
            run(replay_trace(states, teachers("t/0", "t/1", "t/2"), base_url=srv.url, journal=j, progress=False))
        assert str(j) in str(ei.value) and "another journal path" in str(ei.value)
        with pytest.raises(ValueError, match=r"its trace has 4 states, this one 5; 1 state\(s\) are not in the journal's trace \(first: 's::0004'\)"):
            run(replay_trace(make_states(5), T, base_url=srv.url, journal=j, progress=False))
        with pytest.raises(ValueError, match=r"1 of the journal's states are not in this trace \(first: 's::0003'\)"):
            run(replay_trace(states[:3], T, base_url=srv.url, journal=j, progress=False))
        with pytest.raises(ValueError, match="same state ids but different messages"):
            run(replay_trace(make_states(4, size=101), T, base_url=srv.url, journal=j, progress=False))
        assert srv.calls == calls and j.read_bytes() == before                # refused before anything was sent or written
        res = run(replay_trace(states[::-1], T[::-1], base_url=srv.url, journal=j, progress=False))   # order does not matter
        assert srv.calls == calls and res.from_journal == 8


def test_old_journal_without_header_still_resumes(tmp_path):
    T, states, j = teachers("t/0", "t/1"), make_states(3), tmp_path / "j.jsonl"
    with TeacherServer(_honest()) as srv:
        run(replay_trace(states, T, base_url=srv.url, journal=j, progress=False))
        lines = j.read_bytes().splitlines(keepends=True)
        assert b'"journal"' in lines[0] and len(lines) == 7
        j.write_bytes(b"".join(lines[1:]))                                   # a journal from before headers existed
        assert scan_journal(j)[1] == []
        res = run(replay_trace(states, T, base_url=srv.url, journal=j, progress=False))
        assert srv.calls == 6 and res.from_journal == 6 and res.bad_journal_lines == 0
        assert len(scan_journal(j)[1]) == 1                                 # stamped now: later runs are checked
        with pytest.raises(ValueError, match="its teachers are"):
            run(replay_trace(states, T[:1], base_url=srv.url, journal=j, progress=False))


def test_journal_rows_with_impossible_costs_are_skipped(tmp_path):
    """A row whose cost is negative or not a number would let the budget grow: it is a bad line, and its call is redone."""
    j = tmp_path / "j.jsonl"
    row = {"state_id": "s::0000", "teacher_slug": "t/0", "response_text": "ok", "latency_s": 0.1, "prompt_tokens": 1,
           "completion_tokens": 1, "cost_usd": -5.0, "error": None}
    j.write_text(json.dumps(row) + "\n" + json.dumps({**row, "state_id": "s::0001", "cost_usd": float("nan")}) + "\n"
                 + json.dumps({**row, "state_id": "s::0002", "cost_usd": 1e-6}) + "\n")
    rows, bad = read_journal(j)
    assert [r["state_id"] for r in rows] == ["s::0002"] and bad == 2
    with TeacherServer(_honest()) as srv:
        res = run(replay_trace(make_states(3), teachers("t/0"), base_url=srv.url, journal=j, progress=False))
        assert srv.calls == 2 and res.from_journal == 1 and res.bad_journal_lines == 2
    assert res.spent_usd >= 1e-6 and all(r["cost_usd"] >= 0 for r in res)


# --------------------------------------------------------------------------- 8. pairs files


def _pair(i, **kw):
    return {"state_id": f"p{i}", "state_messages": [SYS, {"role": "user", "content": "hi"}], "chosen": "A", "rejected": "B",
            "n_teachers_agreeing": 2, **kw}


@pytest.mark.parametrize("bad,exc,msg", [
    (_pair(3, chosen=7), TypeError, "pairs[3]['chosen'] must be a str, got int"),
    (_pair(3, rejected=None), TypeError, "pairs[3]['rejected'] must be a str, got null"),
    (_pair(3, state_id=["x"]), TypeError, "pairs[3]['state_id'] must be a str, got list"),
    (_pair(3, state_messages="hi"), TypeError, "pairs[3]['state_messages'] must be a list of messages, got str"),
    (_pair(3, state_messages=[{"content": "x"}]), TypeError, "pairs[3]['state_messages'][0] must be a message dict"),
    (_pair(3, n_teachers_agreeing=True), TypeError, "pairs[3]['n_teachers_agreeing'] must be an int >= 1"),
    ({"chosen": "x"}, ValueError, "pairs[3] is not a DPOPair"),
    (_pair(3, state_messages=[{"role": "user", "content": {1, 2}}]), TypeError, "pairs[3] cannot be written as JSON"),
])
def test_a_refused_save_keeps_the_saved_file(tmp_path, bad, exc, msg):
    path = tmp_path / "pairs.jsonl"
    save_pairs([_pair(i) for i in range(5)], path)
    before = path.read_bytes()
    with pytest.raises(exc) as ei: save_pairs([_pair(0), _pair(1), _pair(2), bad, _pair(4)], path)
    assert msg in str(ei.value), str(ei.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]   # no temp file left
    assert load_pairs(path) == [_pair(i) for i in range(5)]


def test_save_pairs_writes_atomically(tmp_path, monkeypatch):
    """A crash while writing (here: the rename fails) leaves the old file whole and no temp file behind."""
    import os
    path = tmp_path / "pairs.jsonl"
    save_pairs([_pair(0)], path)
    def boom(*a): raise OSError("disk gone")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"): save_pairs([_pair(1), _pair(2)], path)
    monkeypatch.undo()
    assert load_pairs(path) == [_pair(0)] and [p.name for p in tmp_path.iterdir()] == ["pairs.jsonl"]
    save_pairs((p for p in [_pair(1), _pair(2)]), path)                    # any iterable of pairs
    assert [p["state_id"] for p in load_pairs(path)] == ["p1", "p2"]


def test_load_pairs_skips_and_names_bad_records(tmp_path, caplog):
    path = tmp_path / "pairs.jsonl"
    lines = [_pair(0), _pair(1, chosen=5), _pair(2, state_messages="x"), None, _pair(4, n_teachers_agreeing="2"), [1], _pair(6)]
    path.write_text("\n".join("{not json" if p is None else json.dumps(p) for p in lines) + "\n\n")
    with caplog.at_level(logging.WARNING):
        back = load_pairs(path)
    assert [p["state_id"] for p in back] == ["p0", "p6"]
    msg = "\n".join(caplog.messages)
    assert "5 bad line(s) skipped" in msg, msg
    assert "line 2 (['chosen'] must be a str, got int)" in msg and "line 3 (['state_messages'] must be a list" in msg and "line 4 (not JSON" in msg


def test_extract_dpo_pairs_rejects_unhashable_ids_clearly():
    states = make_states(2)
    acts = [{"state_id": "s::0000", "teacher_slug": "t/0", "response_text": "A", "error": None},
            {"state_id": ["s::0001"], "teacher_slug": "t/1", "response_text": "A", "error": None}]
    with pytest.raises(TypeError, match=r"teacher_actions\[1\]\['state_id'\] must be a str, got list"):
        extract_dpo_pairs(states, acts)
    with pytest.raises(ValueError, match=r"states\[0\]\['state_id'\] must be a str"):
        extract_dpo_pairs([{**states[0], "state_id": {"a": 1}}], acts[:1])
    with pytest.raises(TypeError, match="teacher_actions must be a sequence"):
        extract_dpo_pairs(states, None)


# --------------------------------------------------------------------------- 11. property: any reply, no stack trace


scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=8))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                           max_leaves=8)
def either(good): return st.one_of(good, good, json_values)   # mostly the right type, sometimes anything
counts = st.one_of(st.integers(0, 200), st.integers(-10**12, 10**15), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from(["many", "12", None, True, [], {}]))
usages = either(st.fixed_dictionaries({}, optional={"prompt_tokens": counts, "completion_tokens": counts,
                                                    "cost": st.one_of(counts, st.floats(0, 1e-3))}))
arguments = st.one_of(st.text(max_size=12), json_values.map(lambda v: orjson.dumps(v).decode()), json_values)
functions = either(st.fixed_dictionaries({}, optional={"name": either(st.sampled_from(["Bash", "Read", ""])), "arguments": arguments}))
tool_calls = either(st.fixed_dictionaries({"type": st.just("function")}, optional={"id": st.text(max_size=4), "function": functions}))
parts = either(st.fixed_dictionaries({"type": st.sampled_from(["text", "output_text", "image_url"])}, optional={"text": either(st.text(max_size=8))}))
contents = st.one_of(st.none(), st.text(max_size=20), json_values, st.lists(parts, max_size=3))
messages = either(st.fixed_dictionaries({"role": st.just("assistant")}, optional={"content": contents, "tool_calls": either(st.lists(tool_calls, max_size=3))}))
choices = either(st.fixed_dictionaries({}, optional={"message": messages, "finish_reason": st.sampled_from(["stop", "length", None])}))
header_values = st.one_of(st.sampled_from(["0", "0.01", "-5", "nan", "inf", "-inf", "1e400", "Wed, 21 Oct 2015 07:28:00 GMT",
                                           "Mon, 32 Foo 99999 99:99:99", "1700000000000", "99999999999999999999", "gzip", "deflate",
                                           "br", "text/html", ""]),
                          st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=16))
header_dicts = st.dictionaries(st.sampled_from(["Retry-After", "X-RateLimit-Reset", "Content-Type", "Content-Encoding", "X-Junk"]),
                               header_values, max_size=3)
errors = either(st.fixed_dictionaries({"code": st.integers(400, 599)}, optional={
    "message": json_values, "metadata": either(st.fixed_dictionaries({}, optional={
        "headers": either(header_dicts), "raw": json_values, "retry_after_seconds": counts}))}))
replies = st.fixed_dictionaries({}, optional={"choices": either(st.lists(choices, max_size=2)), "usage": usages, "error": errors})
near_valid = st.builds(lambda m, u: orjson.dumps({"choices": [{"index": 0, "message": m}], **({} if u is None else {"usage": u})}),
                       messages, st.one_of(st.none(), usages))
bodies = st.one_of(near_valid, near_valid, near_valid, replies.map(orjson.dumps), json_values.map(orjson.dumps), st.binary(max_size=40),
                   st.sampled_from([b"", b"NaN", b'{"usage": {"cost": 1e999}}', b"[" * 3000, b'{"choices": [{"message": {"content": "\xff"}}]}']))
statuses = st.one_of(st.just(200), st.just(200), st.just(200), st.sampled_from([400, 401, 402, 403, 404, 408, 429, 500, 502, 503]), st.integers(200, 599))
answers = st.builds(Answer, status=statuses, body=bodies, headers=header_dicts)


@pytest.fixture(scope="module")
def scripted_server():
    script = {"answers": [Answer(200, completion())]}
    with RawServer(lambda req: script["answers"][len(script["seen"]) % len(script["answers"])] if not script["seen"].append(1) else None) as srv:
        srv.script = script
        yield srv


def _check_any_replies(srv, script, transport, cap):
    srv.script.update(answers=script, seen=[]); srv.requests.clear()
    T, states = teachers("t/0", "t/1"), make_states(2)
    try:
        res = run(replay_trace(states, T, max_total_usd=cap, base_url=srv.url, max_concurrency=2, max_tokens=64, max_retries=1,
                               backoff_s=0.001, max_wait_s=0.05, timeout_s=5, transport=transport, progress=False))
    except TeacherReplayError as e:          # a 401/402/403 stops the run, as designed; what completed is kept
        assert e.status in (401, 402, 403), e
        res = e.results
    assert len(res) + len(res.not_attempted) == 4
    for r in res:
        assert set(r) == RESULT_KEYS
        assert (r["error"] is None) == isinstance(r["response_text"], str), r            # a valid result xor an error row
        assert (r["error"] is None) == isinstance(r["action"], list), r                   # the blocks too, rendered as the text
        assert r["action"] is None or render_action(r["action"]) == r["response_text"], r
        assert r["error"] is None or (isinstance(r["error"], str) and r["error"] and not r["error"].startswith("internal error")), r
        assert isinstance(r["prompt_tokens"], int) and isinstance(r["completion_tokens"], int) and r["prompt_tokens"] >= 0 <= r["completion_tokens"]
        assert isinstance(r["cost_usd"], float) and 0 <= r["cost_usd"] < math.inf
    assert res.spent_usd <= cap * (1 + 1e-12) + 1e-15, (res.spent_usd, cap)
    assert abs(sum(r["cost_usd"] for r in res) - res.spent_usd) < 1e-12
    assert len(srv.requests) <= 4 * 2                                                     # never more than the retries allow


_TRANSPORTS = st.sampled_from(["aiohttp", "httpx"])
_SCRIPTS = st.lists(answers, min_size=1, max_size=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(script=_SCRIPTS, transport=_TRANSPORTS, cap=st.one_of(st.floats(0.0005, 0.004), st.just(1.0)))
@example(script=[Answer(200, b'{"choices": [{"message": "ok"}], "usage": {"prompt_tokens": -1000000000}}')], transport="aiohttp", cap=0.003)
@example(script=[Answer(429, b"{}", {"Retry-After": "nan"}), Answer(200, completion(usage=[]))], transport="httpx", cap=0.01)
def test_any_reply_gives_a_result_or_an_error_row(scripted_server, script, transport, cap):
    _check_any_replies(scripted_server, script, transport, cap)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(script=_SCRIPTS, transport=_TRANSPORTS, cap=st.one_of(st.floats(0.0005, 0.004), st.just(1.0)))
def test_any_reply_gives_a_result_or_an_error_row_long(scripted_server, script, transport, cap):
    _check_any_replies(scripted_server, script, transport, cap)
