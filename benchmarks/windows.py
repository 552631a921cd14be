"""Benchmark: how much of a real agent session is trained, with and without windows (issue 21, point 2; issue 35, point 7).

Real public Claude Code sessions (../shared/fixtures/claude_code and tests/fixtures/claude_code) and one long task-suite
session (12 suite sessions run back to back as one trace: one system prompt, one task, then every session's steps) are
collated at max_seq_len 2,048 and 4,096 with SmolLM2-135M-Instruct's tokenizer (the tiny one with --tiny), SDPO hints on:

- one row: one row per trace, cut from the left (`CollatorConfig(windows=False)`);
- dropped: `ComposerDataCollator.windows` with `cut_turns=False`: a turn too long for a window alone is not trained;
- parts: `ComposerDataCollator.windows` (the trainers' default): such a turn is trained in parts (a prefix window, then
  continuation windows), then the same collation of every window.

It reports the share of assistant tokens trained (response-mask tokens over the assistant tokens of the whole trace), the
windows, the turns cut into parts (and too long even for that), and the collation time per trained assistant token,
parts vs one row (the ratio is the figure; 2 shared cores make the seconds noisy). Writes benchmarks/results/windows.json.

    python benchmarks/windows.py [--tiny] [--repeat 3]
"""
import argparse, json, sys, time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXES = [ROOT.parent/"shared"/"fixtures"/"claude_code", ROOT/"tests"/"fixtures"/"claude_code"]


def tokenizer(tiny: bool):
    if tiny:
        from composer_replication.tiny import tiny_tokenizer
        return tiny_tokenizer(), "tiny"
    from transformers import AutoTokenizer
    from composer_replication.models import smollm2_chat_template, smollm2_dir
    tok = AutoTokenizer.from_pretrained(smollm2_dir()); tok.chat_template = smollm2_chat_template()
    return tok, "smollm2-135m-instruct"


def fixture_examples():
    from composer_replication.trainer.data_collator import trace_examples_from_session
    out = []
    for fix in FIXES:
        if not fix.exists(): print(f"fixtures missing: {fix} (skipped)", file=sys.stderr); continue
        for p in sorted(fix.iterdir()):
            if p.name == "SOURCES.md" or p.name.startswith("07_"): continue   # 07 is 01 with its last line cut
            out += trace_examples_from_session(p)
    return out


def long_suite_session(tmp: Path, n: int = 12):
    "One trace of n task-suite sessions back to back: the first one's system prompt and task, then every session's steps."
    from composer_replication.task_suite import make_task_suite, suite_ingester
    from composer_replication.trainer.data_collator import trace_examples_from_states
    make_task_suite(tmp, n, 0, seed=7)
    states = list(suite_ingester(tmp/"train").ingest(tmp/"train"/"sessions"))
    exs = trace_examples_from_states(states)
    turns = list(exs[0]["turns"])
    for ex in exs[1:]: turns += ex["turns"][2:]      # each session's steps (its system prompt and task dropped)
    return {"trace_id": "suite-long", "turns": turns, "tools": exs[0].get("tools"), "dpo_pairs": []}


def measure(tok, examples, L, windows, repeat, cut_turns=True):
    from composer_replication.hint_generator import dispatch
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
    best, stats = None, None
    for _ in range(repeat):
        c = ComposerDataCollator(tok, CollatorConfig(max_seq_len=L, max_dpo_seq_len=L // 2, hint_generator=dispatch, cache_size=0,
                                                     pad_token_id=tok.pad_token_id or 0, windows=windows, cut_turns=cut_turns))
        t0 = time.perf_counter()
        rows = c.windows(examples) if windows else list(examples)
        for ex in rows: c([ex])
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt); stats = c.stats
    return best, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny tokenizer instead of SmolLM2's")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT/"benchmarks"/"results"/"windows.json"))
    a = ap.parse_args()
    import tempfile
    from composer_replication.trainer.messages import messages_from_turns, tokenize_conversation
    tok, name = tokenizer(a.tiny)
    sets = {"fixtures": fixture_examples()}
    with tempfile.TemporaryDirectory() as d: sets["suite_long"] = [long_suite_session(Path(d))]
    res = {"tokenizer": name, "sets": {}}
    for key, exs in sets.items():
        total = sum(sum(o >= 0 for o in tokenize_conversation(tok, messages_from_turns(e["turns"]), e.get("tools"))[1]) for e in exs)
        lens = [len(tokenize_conversation(tok, messages_from_turns(e["turns"]), e.get("tools"))[0]) for e in exs]
        res["sets"][key] = {"traces": len(exs), "tokens": sorted(lens), "assistant_tokens": total, "by_len": {}}
        for L in (2048, 4096):
            row = {}
            for mode, w, cut in (("one_row", False, True), ("dropped", True, False), ("parts", True, True)):
                secs, st = measure(tok, exs, L, w, a.repeat, cut)
                row[mode] = {"trained": st["assistant_tokens_trained"], "share": st["assistant_tokens_trained"] / total, "seconds": secs,
                             "windows": st.get("windows", len(exs)), "turns_too_long": st.get("turns_too_long", 0), "turns_cut": st.get("turns_cut", 0),
                             "windows_cut_inside_message": st.get("windows_cut_inside_message", 0),
                             "sdpo_targets": st.get("sdpo_targets", 0), "sdpo_targets_lost": st.get("sdpo_targets_lost", 0)}
            b, f = row["one_row"], row["parts"]
            row["time_per_trained_token_ratio"] = (f["seconds"] / f["trained"]) / (b["seconds"] / b["trained"])
            res["sets"][key]["by_len"][L] = row
    print(f"tokenizer {name}")
    print(f"{'set':12} {'L':>5} {'one row':>8} {'dropped':>8} {'parts':>8} {'windows':>8} {'turns cut':>9} {'too long':>9} {'cut in msg':>10} {'s/trained tok parts/one row':>28}")
    for key, r in res["sets"].items():
        for L, row in r["by_len"].items():
            f = row["parts"]
            print(f"{key:12} {L:>5} {row['one_row']['share']:8.1%} {row['dropped']['share']:8.1%} {f['share']:8.1%} {f['windows']:>8} "
                  f"{f['turns_cut']:>9} {f['turns_too_long']:>9} {f['windows_cut_inside_message']:>10} {row['time_per_trained_token_ratio']:>28.2f}")
        print(f"{'':12} ({r['traces']} traces, {r['assistant_tokens']} assistant tokens, lengths {r['tokens'][0]}..{r['tokens'][-1]})")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
