"""Confirmation (issue 37): does teacher-replay DPO on top of SFT make a real student prefer the right recovery, on a
held-out split nobody has read? The evidence run's one suggestive secondary difference (`sft_dpo` - `sft` = +0.023
[+0.002, +0.045], uncorrected) tested once, pre-registered, with nothing tuned.

    python experiments/confirm.py                       # the whole run (resumable: a rerun skips the units it holds)
    python experiments/confirm.py --quick --out /tmp/cf # the smoke test: tiny model and sizes, the same code

Everything but the held-out split is `evidence.py`'s: the same train split (suite seed 0, 16 sessions, replayed against
the scripted teachers, its pairs and corrected traces), the same training code and the settings the evidence run chose
(lr 1e-3, alpha 10, beta 1, 32 steps, top 8 layers, 1,536 / 1,024 tokens). The held-out split is new: the held-out
vocabulary drawn with suite seed 1, checked to share no error-recovery state with the evidence run's. What is run and
what counts as a finding are in `confirm_preregistration.json`, committed before this script ran.
"""
from __future__ import annotations

import hashlib, json, sys, tempfile, time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ablation import _commit, _quiet, _versions, say  # noqa: E402
from evidence import CONFIGS, QUICK, Settings, _load, _save, build_data, evaluate, train  # noqa: E402

PREREG = HERE/"confirm_preregistration.json"
DEFAULT_OUT = HERE/"results"

def read_prereg(path:Path) -> dict:
    "The pre-registration, with the commit that last changed it (a run refuses an uncommitted one)."
    import subprocess
    p = json.loads(path.read_text())
    unknown = [c for c in p["configs"] if c not in CONFIGS]
    if unknown: raise ValueError(f"{path}: unknown configs {unknown}")
    if any(c not in p["configs"] for c in p["contrast"]): raise ValueError(f"{path}: the contrast's configs must be among its configs")
    repo = HERE.parent
    sha = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%H", "--", str(path)], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", str(path)], capture_output=True, text=True).stdout.strip()
    return {**p, "commit": sha or None, "committed": bool(sha) and not dirty}

def _state_key(st:dict) -> str:
    "What a model is shown at a state (its messages), hashed: two states with equal keys are the same test item."
    return hashlib.sha256(json.dumps(st["messages"], sort_keys=True, ensure_ascii=False).encode()).hexdigest()

def new_heldout(work:Path, data:dict, n_sessions:int, suite_seed:int) -> dict:
    "Replace `data`'s held-out split by a fresh one (held-out vocabulary, `suite_seed`); count its overlap with the old one."
    from composer_replication.task_suite import load_expected, make_task_suite, suite_ingester
    root = work/f"confirm_suite_{suite_seed}"
    if not (root/"heldout"/"manifest.json").exists(): make_task_suite(root, 0, n_sessions, seed=suite_seed, overwrite=True)
    states = list(suite_ingester(root/"heldout").ingest(root/"heldout"/"sessions"))
    rows = load_expected(root/"heldout")
    rec = lambda sts, rs: [st for st in sts if {r["state_id"]: r for r in rs}[st["state_id"]]["error_recovery"]]
    seen = {_state_key(st) for st in rec(data["states"]["heldout"], data["rows"]["heldout"])}
    mine = rec(states, rows)
    overlap = sum(_state_key(st) in seen for st in mine)
    info = {"suite_seed": suite_seed, "sessions": n_sessions, "states": len(states), "recovery_states": len(mine),
            "recovery_states_seen_by_the_evidence_run": overlap, "vocabulary": "task_suite.VOCAB['heldout'], drawn with a new suite seed"}
    data["states"]["heldout"], data["rows"]["heldout"] = states, rows
    return info

def summarize(res:dict, prereg:dict):
    "Per-config summaries, the primary contrast and the secondary differences (evidence.py's schema)."
    from composer_replication.evaluation import bootstrap_ci, paired_difference
    configs = res["configs"]
    recs = lambda n: [configs[n]["records"][k] for k in sorted(configs[n]["records"])]
    for name, c in configs.items():
        per_state = {}
        for rs in recs(name):
            for r in rs: per_state.setdefault(r["state_id"], []).append(r)
        avg = lambda key: [sum(r[key] for r in v) / len(v) if all(r[key] is not None for r in v) else None for v in per_state.values()]
        c["summary"] = {"margin_repeat": bootstrap_ci(avg("margin_repeat")), "margin_recorded": bootstrap_ci(avg("margin_recorded")),
                        "greedy_recovery": [sum(bool(r["greedy_right"]) for r in rs) / len(rs) for rs in recs(name)]}
    a, b = prereg["contrast"]
    d = paired_difference(recs(a), recs(b), key=prereg["metric"])
    lo, hi = d["ci95"]
    res["contrast"] = {"a": a, "b": b, "metric": prereg["metric"], "mean_diff": d["mean_diff"], "ci95": d["ci95"], "n_states": d["n_states"],
                       "finding": None if lo is None else ("A better" if lo > 0 else "A worse" if hi < 0 else "no difference this experiment can resolve")}
    res["secondary"] = {f"{n} - {b}": {k: v for k, v in paired_difference(recs(n), recs(b), key=prereg["metric"]).items() if k != "per_state"}
                        for n in configs if n != b and n != a}
    res["secondary"]["greedy_recovery"] = {n: {"per_seed": configs[n]["summary"]["greedy_recovery"]} for n in configs}

def main(argv=None):
    import argparse, torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and the tiny model: the smoke test")
    ap.add_argument("--out", help=f"results folder (default {DEFAULT_OUT})")
    ap.add_argument("--work", help="where the suites and the replay journal live (default: a folder under the system temp)")
    ap.add_argument("--prereg", help=f"the pre-registration file (default {PREREG})")
    a = ap.parse_args(argv)
    prereg = read_prereg(Path(a.prereg) if a.prereg else PREREG)
    s = Settings()
    for k, v in (QUICK if a.quick else {}).items(): setattr(s, k, v)
    s.quick = a.quick
    for k, v in prereg["settings"].items():
        if not a.quick or k in ("lr", "alpha_sdpo", "beta_replay"): setattr(s, k, v)
    if not prereg["committed"] and not a.quick: raise SystemExit(f"{PREREG} must be committed before the run (it is not, or it has changes)")
    seeds = prereg["seeds"] if not a.quick else prereg["seeds"][:1]
    s.seeds = list(seeds)
    n_sessions = prereg["heldout"]["sessions"] if not a.quick else 4
    out = Path(a.out) if a.out else DEFAULT_OUT; out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work) if a.work else Path(tempfile.gettempdir())/f"confirm-work-{'quick' if a.quick else 'full'}"
    work.mkdir(parents=True, exist_ok=True)
    _quiet()
    if s.threads: torch.set_num_threads(s.threads)
    path = out/"confirm.json"
    res = _load(path)
    if res and res.get("settings") != asdict(s): raise SystemExit(f"{path} was written with other settings; use another --out (or remove it)")
    t0 = time.perf_counter(); res["wall_s_before"] = res.get("wall_s", 0.0)
    data = build_data(work, s)   # evidence.py's splits: its train split (replayed, paired, corrected) is what every config trains on
    heldout = new_heldout(work, data, n_sessions, prereg["heldout"]["suite_seed"])
    if heldout["recovery_states_seen_by_the_evidence_run"]:
        raise SystemExit(f"{heldout['recovery_states_seen_by_the_evidence_run']} held-out states were in the evidence run's split")
    need = prereg["heldout"]["min_recovery_states"] if not a.quick else 1
    if heldout["recovery_states"] < need: raise SystemExit(f"the new held-out split has {heldout['recovery_states']} recovery states; it needs >= {need}")
    data["splits"]["heldout"] = heldout
    res.update(model=s.model, settings=asdict(s), versions=_versions(), commit=_commit().get("head"), splits=data["splits"],
               preregistration={k: prereg[k] for k in ("contrast", "metric", "split", "configs", "seeds", "finding", "commit")})
    _save(path, res, t0)
    p = {"lr": s.lr, "alpha_sdpo": s.alpha_sdpo, "beta_replay": s.beta_replay}
    configs = res.setdefault("configs", {})
    for seed in seeds:   # seeds outermost: a run cut short has every config for the seeds it finished
        for name in prereg["configs"]:
            c = configs.setdefault(name, {"desc": CONFIGS[name]["desc"], "seeds": [], "records": {}, "runs": {}})
            if str(seed) in c["records"]: continue
            model, tok, log = train(name, seed, data, s, p, work)
            recs, summ = evaluate(model, tok, data, "heldout", s, greedy=True); del model
            c["seeds"].append(seed); c["records"][str(seed)] = recs
            c["runs"][str(seed)] = {"eval": summ, "train": log, "commit": _commit()}
            _save(path, res, t0)
            say(f"{name} seed {seed}: held-out margin_repeat {summ['margin_repeat']['mean']:+.4f}, "
                f"greedy recovery {summ['recovery_accuracy']['k']}/{summ['recovery_accuracy']['n']} ({log['train_s']:.0f} s training)")
    summarize(res, prereg)
    res["complete"] = all(len(configs[n]["records"]) == len(seeds) for n in prereg["configs"])
    _save(path, res, t0)
    c = res["contrast"]
    say(f"pre-registered contrast {c['a']} - {c['b']} on held-out {c['metric']}: {c['mean_diff']:+.4f} {c['ci95']} "
        f"over {c['n_states']} states: {c['finding']}")

if __name__ == "__main__":
    main()
