"""Evidence (issue 23): does self-distillation at the error (SDPO) and teacher-replay DPO, on top of SFT on the teachers'
corrections, make a real student prefer the right recovery after a tool error? A paired, pre-registered experiment.

    python experiments/evidence.py                     # every stage not yet done: data, gates, tuning, final (resumable)
    python experiments/evidence.py --stage tune        # only the gates and the dev-split tuning
    python experiments/evidence.py --stage final       # only the pre-registered final run on the held-out split
    python experiments/evidence.py --check-repro sft:0 # train and evaluate one (config, seed) again; compare with the record
    python experiments/evidence.py --quick --model tiny --out /tmp/ev   # the smoke test (~2 min): tiny sizes, the same code

The primary metric is `evaluation.evaluate_agent`'s `margin_repeat`: at every error-recovery state, the mean per-token
log-probability of the right call minus that of the failing call repeated verbatim (`margin_recorded`: minus that of the
recorded wrong action). Configs are compared paired on the same states (`evaluation.paired_difference`), with a
bootstrap interval over states. Every choice is made on the train and dev splits; the held-out split is read once, by
the final stage, for the configs and seeds `experiments/preregistration.json` names (committed before any run).
See experiments/README.md for the design, the sizes and what was cut.
"""
from __future__ import annotations

import asyncio, copy, json, math, sys, tempfile, time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ablation import (REPO, _StepTimer, _commit, _quiet, _versions, freeze_to_top, load, say, set_determinism,  # noqa: E402
                      write_json)

DEFAULT_OUT = HERE/"results"
PREREG = HERE/"preregistration.json"

# data: "traces" = the recorded traces; "corrected" = the teachers' corrections (`corrected_states`)
CONFIGS: dict[str, dict] = {
    "base":              dict(train=False, desc="the pretrained student, not trained"),
    "ce":                dict(data="traces", sdpo=False, dpo=False, wrapper="none", desc="CE on the recorded traces (imitation)"),
    "sft":               dict(data="corrected", sdpo=False, dpo=False, wrapper="none", desc="SFT on the teachers' corrections (the positive control)"),
    "sft_dpo":           dict(data="corrected", sdpo=False, dpo=True, wrapper="none", desc="SFT + teacher-replay DPO"),
    "sft_sdpo":          dict(data="corrected", sdpo=True, dpo=False, wrapper="none", desc="SFT + SDPO at the errors (JSD)"),
    "sft_sdpo_dpo":      dict(data="corrected", sdpo=True, dpo=True, wrapper="none", desc="SFT + SDPO + DPO"),
    "sft_sdpo_dpo_taid": dict(data="corrected", sdpo=True, dpo=True, wrapper="taid", desc="SFT + SDPO (TAID criterion) + DPO"),
}
TRAINED = [k for k, c in CONFIGS.items() if c.get("train", True)]

@dataclass
class Settings:
    "Every size and knob (written into the results)."
    model: str = "smollm2-135m-instruct"
    device: str = "cpu"
    threads: int = 2
    suite_seed: int = 0
    n_train: int = 16            # train sessions (replayed, paired, trained on)
    n_dev: int = 12              # dev sessions: train vocabulary, other seeds; every tuning choice is scored here
    n_heldout: int = 30          # held-out sessions (disjoint names): >= 45 error-recovery states; read once, by the final stage
    train_layers: int = 8        # top decoder layers trained (+ final norm); 0 = every weight
    max_seq_len: int = 1536      # window length of the trace rows (the head of a suite session is ~570 tokens with its tools)
    max_dpo_seq_len: int = 1024  # DPO rows (both sides share one prompt; the head alone is ~570 tokens: at 512 every pair dropped)
    max_prompt_tokens: int = 1536  # evaluation prompts (whole steps kept), = what training saw
    steps: int = 32              # optimizer steps per run, one window each
    warmup_steps: int = 2
    lr: float | None = None      # chosen by tuning (lr_grid) unless given
    alpha_sdpo: float | None = None   # chosen by tuning (alpha_grid)
    beta_replay: float | None = None  # chosen by tuning (beta_grid)
    lr_grid: list = field(default_factory=lambda: [1e-4, 3e-4, 1e-3])
    alpha_grid: list = field(default_factory=lambda: [1.0, 10.0])
    beta_grid: list = field(default_factory=lambda: [0.1, 1.0])
    seeds: list = field(default_factory=lambda: [0, 1])
    max_new_tokens: int = 64     # greedy generation, ended at the first tool call (the longest right recovery call is ~60 tokens)
    eval_batch_size: int = 8
    lora_r: int = 0              # > 0: train LoRA adapters of this rank (attention and MLP projections, alpha 2r) instead of the top layers
    quick: bool = False

QUICK = dict(model="tiny", threads=1, n_train=3, n_dev=3, n_heldout=4, train_layers=0, max_seq_len=2048, max_dpo_seq_len=1536,
             max_prompt_tokens=2048, steps=2, warmup_steps=0, lr_grid=[1e-3, 3e-3], alpha_grid=[1.0], beta_grid=[0.5],
             seeds=[0], max_new_tokens=8, eval_batch_size=4)
GPU = dict(device="cuda", threads=0, n_train=48, n_dev=24, n_heldout=60, train_layers=0, max_seq_len=2048, max_dpo_seq_len=1024,
           max_prompt_tokens=2048, steps=150, seeds=[0, 1, 2], lr_grid=[1e-5, 3e-5, 1e-4], alpha_grid=[1.0, 3.0, 10.0],
           beta_grid=[0.1, 0.3, 1.0], max_new_tokens=96, eval_batch_size=16)

# -- data -----------------------------------------------------------------------------------------------------
def _calls_key(action:str) -> list:
    "The tool calls of an action as comparable (name, canonical arguments) pairs (`trainer.windows._call_key`)."
    from composer_replication.ingestion.core import action_to_message
    from composer_replication.trainer.windows import _call_key
    return [_call_key(c) for c in action_to_message(action).get("tool_calls") or []]

def _traces(states):
    "The states grouped into traces as the collator groups them (`trace_examples_from_states`)."
    from composer_replication.trainer.data_collator import trace_examples_from_states
    by_id = {st["state_id"]: st for st in states}
    return [[by_id[sid] for sid in ex["state_ids"]] for ex in trace_examples_from_states(states)]

def corrected_states(states:list[dict], pairs:list[dict]) -> tuple[list[dict], list[dict], set, dict]:
    """The teachers' corrections of the recorded traces: (states, pairs, ids of states whose recorded action is kept as
    context but not trained, counts). Where the teachers' consensus (a pair's chosen side) disagrees with a reaction to a
    tool error, and the trace's next action is that consensus, the wrong reaction and its tool results are removed: the
    trace goes error -> right recovery, and every later history loses them too. Any other disagreement (a planted mistake,
    a reaction the trace never corrects) keeps the recorded turn as context, not trained. Uses the pairs only, never the
    expected rows."""
    chosen = {p["state_id"]: p["chosen"] for p in pairs}
    out, keep_untrained, n = [], set(), {"reactions_removed": 0, "kept_untrained": 0}
    new_hist = {}
    for g in _traces(states):
        full = g[-1]["messages"]
        drop, skip = set(), set()   # message indices (in the trace's own numbering) removed; states removed
        for k, st in enumerate(g):
            sid = st["state_id"]
            if sid not in chosen or sid in skip: continue
            m = st["messages"]
            reacts = bool(m) and m[-1].get("role") == "tool" and m[-1].get("is_error")
            nxt = g[k + 1] if k + 1 < len(g) else None
            if reacts and nxt is not None and nxt["state_id"] not in chosen and \
               _calls_key(nxt["student_action"]) == _calls_key(chosen[sid]) and _calls_key(chosen[sid]):
                drop.update(range(len(m), len(nxt["messages"])))   # the wrong reaction and its tool results
                skip.add(nxt["state_id"])
                st["_take"] = nxt                                     # this state's action becomes the trace's right one
                n["reactions_removed"] += 1
            else:
                keep_untrained.add(sid); n["kept_untrained"] += 1
        for st in g:
            if st["state_id"] in skip: continue
            take = st.pop("_take", None)
            hist = [x for j, x in enumerate(st["messages"]) if j not in drop]
            new = {**st, "messages": hist}
            if take is not None:
                new["student_action"] = take["student_action"]
                if "action" in take: new["action"] = take["action"]
            new_hist[st["state_id"]] = hist
            out.append(new)
        for st in g: st.pop("_take", None)
    new_pairs = [{**p, "state_messages": new_hist[p["state_id"]]} if p["state_id"] in new_hist else p for p in pairs]
    return out, new_pairs, keep_untrained, n

def build_data(work:Path, s:Settings) -> dict:
    "The three splits, the train split replayed through the local teacher server, its pairs and the corrected traces."
    from composer_replication.task_suite import load_expected, make_task_suite, suite_ingester
    from composer_replication.task_suite_teachers import SUITE_TEACHERS, suite_policies
    from composer_replication.teacher_replay import extract_dpo_pairs, replay_trace
    from composer_replication.teacher_server import TeacherServer
    suite = work/"suite"
    if not (suite/"heldout"/"manifest.json").exists():
        make_task_suite(suite, s.n_train, s.n_heldout, seed=s.suite_seed, n_dev=s.n_dev, overwrite=True)
    states, rows = {}, {}
    for split in ("train", "dev", "heldout"):
        states[split] = list(suite_ingester(suite/split).ingest(suite/split/"sessions"))
        rows[split] = load_expected(suite/split)
    with TeacherServer(suite_policies(states["train"], rows["train"])) as srv:
        results = asyncio.run(replay_trace(states["train"], SUITE_TEACHERS, max_total_usd=1.0, base_url=srv.url, progress=False,
                                           journal=work/"teacher_calls.jsonl"))
    # a teacher answering a tool the state does not have is a teacher's answer (an error row, never a pair), not a failed call
    invalid = sum(r["error"] is not None and r["error"].startswith("invalid action") for r in results)
    failed = [r for r in results if r["error"] is not None and not r["error"].startswith("invalid action")]
    if failed: raise RuntimeError(f"{len(failed)} of {len(results)} teacher calls failed on the local server (first: {failed[0]['error']})")
    pairs = extract_dpo_pairs(states["train"], results, agreement_threshold=2)
    corr, corr_pairs, untrained, counts = corrected_states(copy.deepcopy(states["train"]), pairs)
    by = {k: {r["state_id"]: r for r in v} for k, v in rows.items()}
    split_info = {k: {"sessions": len({st["state_id"].rsplit("::", 1)[0] for st in states[k]}), "states": len(states[k]),
                      "recovery_states": sum(by[k][st["state_id"]]["error_recovery"] for st in states[k])} for k in states}
    split_info["train"].update(pairs=len(pairs), teacher_calls=len(results), teacher_invalid_actions=invalid, corrections=counts,
                               pairs_at_recovery=sum(by["train"][p["state_id"]]["error_recovery"] for p in pairs))
    split_info["heldout"]["vocabulary"] = "disjoint from train and dev (task_suite.VOCAB['heldout'])"
    split_info["dev"]["vocabulary"] = "the train vocabulary, other seeds"
    return dict(states=states, rows=rows, pairs=pairs, corrected=corr, corrected_pairs=corr_pairs, untrained=untrained,
                splits=split_info)

def config_examples(name:str, data:dict) -> list[dict]:
    "The training examples of a config (the same sessions, in the same order, for every config)."
    from composer_replication.trainer.data_collator import trace_examples_from_states
    if CONFIGS[name]["data"] == "traces": return trace_examples_from_states(data["states"]["train"], pairs=data["pairs"])
    exs = trace_examples_from_states(data["corrected"], pairs=data["corrected_pairs"])
    pos = {st["state_id"]: len(st["messages"]) for st in data["corrected"]}
    for ex in exs:   # the recorded turns the teachers disagree with, kept as context: not trained
        for sid in ex["state_ids"]:
            if sid in data["untrained"]:
                t = ex["turns"][pos[sid]]
                assert t["role"] == "assistant", (sid, t["role"])
                t["train"] = False
    return exs

# -- training and evaluation ----------------------------------------------------------------------------------------
def knobs(name:str, p:dict) -> dict:
    c = CONFIGS[name]
    return dict(alpha_sdpo=p["alpha_sdpo"] if c["sdpo"] else 0.0, beta_replay=p["beta_replay"] if c["dpo"] else 0.0,
                sdpo_wrapper=c["wrapper"])

def train(name:str, seed:int, data:dict, s:Settings, p:dict, work:Path):
    "A fresh student trained under config `name` with params `p` (lr, alpha_sdpo, beta_replay); (model, tokenizer, log)."
    from transformers import TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from composer_replication.hint_generator import dispatch
    from composer_replication.trainer.composer_trainer import ComposerOfflineTrainer
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
    set_determinism(seed, s.device)
    model, tok = load(s)
    if s.lora_r:   # adapters only (peft); channel 3's reference is the same model with its adapters off
        from composer_replication.models import add_lora
        model = add_lora(model, {"r": s.lora_r, "lora_alpha": 2 * s.lora_r}, base=s.model)
        counts = {"trainable": sum(p.numel() for p in model.parameters() if p.requires_grad), "lora_r": s.lora_r}
    else: counts = freeze_to_top(model, s.train_layers)
    k = knobs(name, p)
    coll = ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
                                                    hint_generator=dispatch, max_seq_len=s.max_seq_len, max_dpo_seq_len=s.max_dpo_seq_len,
                                                    enable_sdpo=k["alpha_sdpo"] > 0, enable_replay_dpo=k["beta_replay"] > 0))
    args = TrainingArguments(output_dir=str(work/"trainer"), max_steps=s.steps, per_device_train_batch_size=1, learning_rate=p["lr"],
                             lr_scheduler_type="linear", warmup_steps=min(s.warmup_steps, s.steps - 1), weight_decay=0.0,
                             max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=s.device == "cpu",
                             seed=seed, data_seed=seed, disable_tqdm=True, dataloader_num_workers=0)
    tr = ComposerOfflineTrainer(model, args, train_dataset=config_examples(name, data), data_collator=coll, **k)
    tr.remove_callback(PrinterCallback)
    # a channel that is on must have something to train: count its rows in the windows once (the collator caches them)
    rows = [coll([w]) for w in tr.train_dataset]
    used = {"dpo_pairs_in_rows": sum(len(b["dpo_row"]) for b in rows if "dpo_row" in b), "windows": len(rows),
            "sdpo_rows": sum(int(b["sdpo_loss_mask"].sum() > 0) for b in rows if "sdpo_loss_mask" in b)}
    if k["beta_replay"] > 0 and not used["dpo_pairs_in_rows"]:
        raise RuntimeError(f"{name}: DPO is on but no pair fits max_dpo_seq_len={s.max_dpo_seq_len} (collator: {dict(coll.stats)})")
    if k["alpha_sdpo"] > 0 and not used["sdpo_rows"]:
        raise RuntimeError(f"{name}: SDPO is on but no window has a distilled error site (collator: {dict(coll.stats)})")
    t0 = time.perf_counter()
    if k["beta_replay"] > 0: tr.data_collator = _with_cached_reference(tr, coll, rows, work/"dpo_reference.pt", s)
    timer = _StepTimer(); tr.add_callback(timer)
    tr.train(); train_s = time.perf_counter() - t0
    hist = [h for h in tr.state.log_history if "composer/total" in h]
    chans = ("lm_ce", "sdpo_jsd", "trace_replay_dpo", "total")
    log = {"train_s": train_s, "median_step_s": sorted(timer.times)[len(timer.times) // 2] if timer.times else None,
           "windows": len(tr.train_dataset), "channel_rows": used, "counts": counts, "knobs": k, "collator": dict(coll.stats),
           "loss": {c: [h.get(f"composer/{c}") for h in hist] for c in chans}}
    if s.lora_r: model = model.merge_and_unload()   # evaluated as one plain model
    model.eval(); del tr
    return model, tok, log

def _with_cached_reference(tr, coll, rows:list[dict], path:Path, s:Settings):
    """`coll` with channel 3's reference log-probs filled in from a file kept in the work folder. The reference is the
    untrained student, the same in every run that trains channel 3 (2 tuning units, 6 final ones), so each pair's values
    are computed once, by the trainer's own `_with_ref_logprobs` before any step, and read by later runs: the same
    numbers the trainer would compute in each step, without its two extra forward passes per pair and run."""
    import hashlib, torch
    table = torch.load(path) if path.exists() else {}
    def key(b):
        h = hashlib.sha256(f"{s.model}|lora={s.lora_r}|chunk={tr.chunk_size}".encode())
        for n in sorted(k for k in b if k.startswith("dpo_") and not k.endswith("ref_logprobs") and isinstance(b[k], torch.Tensor)):
            h.update(n.encode()); h.update(str(tuple(b[n].shape)).encode()); h.update(b[n].contiguous().numpy().tobytes())
        return h.hexdigest()
    new = 0
    for b in rows:
        if "dpo_chosen_input_ids" not in b or (kb := key(b)) in table: continue
        r = tr._with_ref_logprobs(dict(b))
        table[kb] = (r["dpo_chosen_ref_logprobs"].cpu(), r["dpo_rejected_ref_logprobs"].cpu()); new += 1
    if new: torch.save(table, path)
    def collate(features):
        b = coll(features)
        if "dpo_chosen_input_ids" in b: b = {**b, **dict(zip(("dpo_chosen_ref_logprobs", "dpo_rejected_ref_logprobs"), table[key(b)]))}
        return b
    return collate

def evaluate(model, tok, data:dict, split:str, s:Settings, greedy:bool) -> tuple[list[dict], dict]:
    "Per-state records at the split's error-recovery states (the margins; with `greedy`, the greedy next action too)."
    from composer_replication.evaluation import evaluate_agent
    by = {r["state_id"]: r for r in data["rows"][split]}
    rec = [st for st in data["states"][split] if by[st["state_id"]]["error_recovery"]]
    res = evaluate_agent(model, tok, rec, data["rows"][split], max_new_tokens=s.max_new_tokens, batch_size=s.eval_batch_size,
                         max_prompt_tokens=s.max_prompt_tokens, preference=False, greedy=greedy, stop_at_first_call=True)
    out = [{"state_id": r["state_id"], "scenario": r["scenario"], "attempt": r["attempt"], "margin_repeat": r["margin_repeat"],
            "margin_recorded": r["margin_recorded"], "greedy_right": r["correct"], "well_formed": r["well_formed"],
            "generation": r["generation"], "logp_per_token": r["logp_per_token"]} for r in res.records]
    summ = {k: res.summary[k] for k in ("margin_repeat", "margin_recorded", "margins_by_scenario", "seconds")}
    if greedy: summ.update({k: res.summary[k] for k in ("recovery_accuracy", "well_formed_rate")})
    return out, summ

# -- the results file ------------------------------------------------------------------------------------------------
def _load(path:Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}

def _save(path:Path, res:dict, t0:float):
    res["wall_s"] = res.get("wall_s_before", 0.0) + time.perf_counter() - t0
    write_json(path, res)

def _stage_mark(res:dict, stage:str):
    res.setdefault("stages", {})[stage] = {"commit": _commit(), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

def _log(out:Path, line:str):
    say(line)
    with open(out/"evidence_tuning.log", "a") as f: f.write(line + "\n")

# -- the stages ------------------------------------------------------------------------------------------------
def stage_tune(s:Settings, data:dict, res:dict, out:Path, work:Path, t0:float) -> dict:
    "Gate 0, the tuning on dev (lr on sft, then alpha on sft_sdpo, then beta on sft_dpo), and gate 1; each trial saved as it ends."
    from composer_replication.evaluation import bootstrap_ci, hint_gaps, paired_difference
    path = out/"evidence.json"
    gates = res.setdefault("gates", {})
    if "hint_gap" not in gates:   # gate 0: is there anything for SDPO to distil? (the untrained student, dev split)
        set_determinism(0, s.device); model, tok = load(s)
        g = hint_gaps(model, tok, data["states"]["dev"], data["rows"]["dev"])
        gates["hint_gap"] = {**bootstrap_ci([r["with_solution"] - r["none"] for r in g]), "split": "dev",
                             "what": "mean log p per token of the right call, hint with solution minus no hint, per state",
                             "generic_minus_none": bootstrap_ci([r["generic"] - r["none"] for r in g]),
                             "with_solution_has_solution": sum(r["solution"] is not None for r in g), "records": g}
        _log(out, f"gate 0 (dev, untrained): hint with solution - none = {gates['hint_gap']['mean']:+.3f} {gates['hint_gap']['ci95']} over {gates['hint_gap']['n']} states")
        del model; _save(path, res, t0)
    tuning = res.setdefault("tuning", [])
    def trial(name, params, seed=0):
        key = {"config": name, "params": params, "seed": seed}
        for t in tuning:
            if {k: t[k] for k in key} == key: return t
        model, tok, log = train(name, seed, data, s, params, work)
        recs, summ = evaluate(model, tok, data, "dev", s, greedy=False); del model
        t = {**key, "dev_margin_repeat": summ["margin_repeat"]["mean"], "dev_margin_repeat_ci95": summ["margin_repeat"]["ci95"],
             "dev_margin_recorded": summ["margin_recorded"]["mean"], "train_s": log["train_s"], "median_step_s": log["median_step_s"],
             "windows": log["windows"], "channel_rows": log["channel_rows"], "collator": log["collator"],
             "last_loss": {c: v[-1] for c, v in log["loss"].items() if v}, "records": recs}
        t["commit"] = _commit(); tuning.append(t); _save(path, res, t0)
        _log(out, f"tune {name} {params} seed {seed}: dev margin_repeat {t['dev_margin_repeat']:+.4f} ({log['train_s']:.0f} s training)")
        return t
    if "base_dev" not in gates:
        set_determinism(0, s.device); model, tok = load(s)
        recs, summ = evaluate(model, tok, data, "dev", s, greedy=False); del model
        gates["base_dev"] = {"dev_margin_repeat": summ["margin_repeat"], "records": recs}; _save(path, res, t0)
        _log(out, f"base (dev): margin_repeat {summ['margin_repeat']['mean']:+.4f} {summ['margin_repeat']['ci95']}")
    best = lambda ts: max(ts, key=lambda t: t["dev_margin_repeat"])
    lr = s.lr if s.lr is not None else best([trial("sft", {"lr": x, "alpha_sdpo": 0.0, "beta_replay": 0.0}) for x in s.lr_grid])["params"]["lr"]
    # gate 1: the positive control with a seed the choice did not see, against the untrained student, paired on dev states
    if "positive_control" not in gates:
        t = trial("sft", {"lr": lr, "alpha_sdpo": 0.0, "beta_replay": 0.0}, seed=1)
        d = paired_difference(t["records"], gates["base_dev"]["records"])
        gates["positive_control"] = {"config": "sft", "seed": 1, "lr": lr, "dev_mean_diff": d["mean_diff"], "ci95": d["ci95"],
                                     "n_states": d["n_states"], "passed": d["ci95"][0] is not None and d["ci95"][0] > 0}
        _save(path, res, t0)
        _log(out, f"gate 1 (dev): sft - base = {d['mean_diff']:+.4f} {d['ci95']} over {d['n_states']} states: "
                  f"{'passed' if gates['positive_control']['passed'] else 'NOT passed'}")
    alpha = s.alpha_sdpo if s.alpha_sdpo is not None else best([trial("sft_sdpo", {"lr": lr, "alpha_sdpo": a, "beta_replay": 0.0}) for a in s.alpha_grid])["params"]["alpha_sdpo"]
    beta = s.beta_replay if s.beta_replay is not None else best([trial("sft_dpo", {"lr": lr, "alpha_sdpo": 0.0, "beta_replay": b}) for b in s.beta_grid])["params"]["beta_replay"]
    res["chosen"] = {"lr": lr, "alpha_sdpo": alpha, "beta_replay": beta, "by": "the highest dev margin_repeat of each grid (seed 0)"}
    if "tune" not in res.get("stages", {}):   # a rerun finds the stage done: its record (the commit that finished it) stays
        _stage_mark(res, "tune"); _save(path, res, t0)
        _log(out, f"chosen on dev: lr {lr:g}, alpha {alpha:g}, beta {beta:g}")
    return res["chosen"]

def stage_final(s:Settings, data:dict, res:dict, out:Path, work:Path, t0:float, prereg:dict, force:bool=False):
    "The pre-registered run on the held-out split: every (config, seed) it names, records saved as each one ends."
    from composer_replication.evaluation import bootstrap_ci, paired_difference
    path = out/"evidence.json"
    if not res.get("gates", {}).get("positive_control", {}).get("passed") and not force:
        raise SystemExit("gate 1 did not pass (the positive control does not beat the untrained student on dev): the final "
                         "comparison is not run (--force runs it anyway)")
    p = res["chosen"]
    configs = res.setdefault("configs", {})
    for seed in prereg["seeds"]:   # seeds outermost: a run cut short has every config for the seeds it finished
        for name in prereg["configs"]:
            c = configs.setdefault(name, {"desc": CONFIGS[name]["desc"], "seeds": [], "records": {}, "runs": {}})
            if not CONFIGS[name].get("train", True) and seed != prereg["seeds"][0]: continue
            if str(seed) in c["records"]: continue
            if CONFIGS[name].get("train", True): model, tok, log = train(name, seed, data, s, p, work)
            else: set_determinism(seed, s.device); (model, tok), log = load(s), None
            recs, summ = evaluate(model, tok, data, "heldout", s, greedy=True); del model
            c["seeds"].append(seed); c["records"][str(seed)] = recs
            c["runs"][str(seed)] = {"eval": summ, "train": log, "commit": _commit()}   # a resumed run: which commit ran each unit
            _save(path, res, t0)
            say(f"{name} seed {seed}: held-out margin_repeat {summ['margin_repeat']['mean']:+.4f}, "
                f"greedy recovery {summ['recovery_accuracy']['k']}/{summ['recovery_accuracy']['n']}")
    for name, c in configs.items():
        runs = [c["records"][k] for k in sorted(c["records"])]
        per_state = {}
        for recs in runs:
            for r in recs: per_state.setdefault(r["state_id"], []).append(r)
        avg = lambda key: [sum(r[key] for r in v) / len(v) if all(r[key] is not None for r in v) else None for v in per_state.values()]
        c["summary"] = {"margin_repeat": bootstrap_ci(avg("margin_repeat")), "margin_recorded": bootstrap_ci(avg("margin_recorded")),
                        "greedy_recovery": [sum(bool(r["greedy_right"]) for r in recs) / len(recs) for recs in runs]}
    a, b = prereg["contrast"]
    d = paired_difference([configs[a]["records"][k] for k in sorted(configs[a]["records"])],
                          [configs[b]["records"][k] for k in sorted(configs[b]["records"])], key=prereg["metric"])
    res["contrast"] = {"a": a, "b": b, "metric": prereg["metric"], "mean_diff": d["mean_diff"], "ci95": d["ci95"], "n_states": d["n_states"]}
    res["secondary"] = {f"{n} - {b}": {k: v for k, v in paired_difference(
        [configs[n]["records"][k] for k in sorted(configs[n]["records"])],
        [configs[b]["records"][k] for k in sorted(configs[b]["records"])], key=prereg["metric"]).items() if k != "per_state"}
        for n in configs if n != b}
    if "final" not in res.get("stages", {}): _stage_mark(res, "final")
    _save(path, res, t0)
    say(f"pre-registered contrast {a} - {b} on held-out {prereg['metric']}: {d['mean_diff']:+.4f} {d['ci95']} over {d['n_states']} states")
    plot(res, out/"evidence.png")

def plot(res:dict, path:Path):
    "Left: per held-out state, each config's margin_repeat minus the contrast's baseline (seed-averaged), with mean and interval. Right: the margins."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from composer_replication.evaluation import paired_difference
    configs, b = res["configs"], res["contrast"]["b"]
    names = [n for n in configs if n != b]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=90, gridspec_kw={"width_ratios": [3, 2]})
    recs = lambda n: [configs[n]["records"][k] for k in sorted(configs[n]["records"])]
    for i, n in enumerate(names):
        d = paired_difference(recs(n), recs(b), key=res["contrast"]["metric"])
        xs = [r["diff"] for r in d["per_state"]]
        jitter = [(hash(r["state_id"]) % 1000 / 1000 - 0.5) * 0.35 for r in d["per_state"]]
        ax.plot([i + j for j in jitter], xs, ".", ms=3, alpha=0.45, color="#48a" if n != res["contrast"]["a"] else "#c44")
        lo, hi = d["ci95"]
        ax.errorbar(i, d["mean_diff"], yerr=[[d["mean_diff"] - lo], [hi - d["mean_diff"]]], fmt="D", color="k", ms=5, capsize=4)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(range(len(names))); ax.set_xticklabels([f"{n}\n− {b}" for n in names], fontsize=7)
    ax.set_ylabel(f"{res['contrast']['metric']} difference per state"); ax.set_title("paired per held-out state (dots), mean and 95% bootstrap CI", fontsize=9)
    allnames = list(configs)
    for i, n in enumerate(allnames):
        m = configs[n]["summary"]["margin_repeat"]
        ax2.errorbar(i, m["mean"], yerr=[[m["mean"] - m["ci95"][0]], [m["ci95"][1] - m["mean"]]], fmt="o", capsize=3,
                     color="#c44" if n == res["contrast"]["a"] else "#48a")
    ax2.axhline(0, color="k", lw=0.6)
    ax2.set_xticks(range(len(allnames))); ax2.set_xticklabels(allnames, rotation=50, ha="right", fontsize=7)
    ax2.set_title("margin_repeat (held-out): right call minus repeating the failing one", fontsize=9)
    fig.tight_layout(); fig.savefig(path); plt.close(fig)

def check_repro(s:Settings, data:dict, res:dict, out:Path, work:Path, t0:float, spec:str):
    "Train and evaluate one (config, seed) of the final run again and compare its per-state margins with the record."
    name, seed = spec.split(":")
    old = res["configs"][name]["records"][seed]
    if CONFIGS[name].get("train", True): model, tok, _ = train(name, int(seed), data, s, res["chosen"], work)
    else: set_determinism(int(seed), s.device); model, tok = load(s)
    new, _ = evaluate(model, tok, data, "heldout", s, greedy=True)
    diffs = [abs(a["margin_repeat"] - b["margin_repeat"]) for a, b in zip(old, new) if a["margin_repeat"] is not None]
    flips = sum(a["greedy_right"] != b["greedy_right"] for a, b in zip(old, new))
    res["reproducibility"] = {"config": name, "seed": int(seed), "max_abs_margin_repeat_diff": max(diffs), "greedy_flips": flips,
                              "n_states": len(new), "commit": _commit()}
    _save(out/"evidence.json", res, t0)
    say(f"reproducibility of ({name}, seed {seed}): max |margin_repeat difference| {max(diffs):.2e}, greedy flips {flips}/{len(new)}")

def read_prereg(path:Path=PREREG) -> dict:
    "The pre-registration, with the commit that last changed it (the final stage refuses an uncommitted one)."
    import subprocess
    p = json.loads(path.read_text())
    unknown = [c for c in p["configs"] if c not in CONFIGS]
    if unknown: raise ValueError(f"{path}: unknown configs {unknown}")
    if any(c not in p["configs"] for c in p["contrast"]): raise ValueError(f"{path}: the contrast's configs must be among its configs")
    sha = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%H", "--", str(path)], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", str(path)], capture_output=True, text=True).stdout.strip()
    return {**p, "commit": sha or None, "committed": bool(sha) and not dirty}

def main(argv=None):
    import argparse, torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=["tune", "final", "all"], default="all")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and the tiny model: the smoke test")
    ap.add_argument("--gpu-sizes", action="store_true", help="the larger sizes the README names for a GPU (with --device cuda)")
    ap.add_argument("--model"); ap.add_argument("--device")
    ap.add_argument("--out", help=f"results folder (default {DEFAULT_OUT})")
    ap.add_argument("--work", help="where the suite and the replay journal live (default: a folder under the system temp)")
    ap.add_argument("--force", action="store_true", help="run the final stage even if gate 1 did not pass")
    ap.add_argument("--check-repro", metavar="CONFIG:SEED")
    ap.add_argument("--prereg", help=f"the pre-registration file (default {PREREG})")
    ap.add_argument("--lora", type=int, metavar="R", help="train LoRA adapters of rank R (peft) instead of the top layers (use its own --out)")
    a = ap.parse_args(argv)
    s = Settings()
    for k, v in (QUICK if a.quick else GPU if a.gpu_sizes else {}).items(): setattr(s, k, v)
    s.quick = a.quick
    if a.model: s.model = a.model
    if a.device: s.device = a.device
    if a.lora: s.lora_r = a.lora
    out = Path(a.out) if a.out else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work) if a.work else Path(tempfile.gettempdir())/f"evidence-work-{'quick' if a.quick else 'full'}"
    work.mkdir(parents=True, exist_ok=True)
    _quiet()
    if s.threads: torch.set_num_threads(s.threads)
    path = out/"evidence.json"
    res = _load(path)
    mine = {k: v for k, v in asdict(s).items() if k in res.get("settings", {}) or v != Settings.__dataclass_fields__[k].default}
    if res and res.get("settings") != mine: raise SystemExit(f"{path} was written with other settings; use another --out (or remove it)")
    prereg = read_prereg(Path(a.prereg) if a.prereg else PREREG)
    if s.quick: prereg = {**prereg, "seeds": s.seeds}
    t0 = time.perf_counter(); res["wall_s_before"] = res.get("wall_s", 0.0)
    data = build_data(work, s)
    res.update(model=s.model, settings=asdict(s), versions=_versions(), commit=_commit().get("head"), splits=data["splits"],
               preregistration={k: prereg[k] for k in ("contrast", "metric", "split", "configs", "seeds", "finding", "commit")})
    if not res["splits"]["heldout"]["recovery_states"] >= (45 if not s.quick else 1):
        raise SystemExit(f"the held-out split has {res['splits']['heldout']['recovery_states']} recovery states; it needs >= 45")
    _save(path, res, t0)
    if a.check_repro: return check_repro(s, data, res, out, work, t0, a.check_repro)
    if a.stage in ("tune", "all"): stage_tune(s, data, res, out, work, t0)
    if a.stage in ("final", "all"):
        if not prereg["committed"] and not s.quick: raise SystemExit(f"{PREREG} must be committed before the final run (it is not, or it has changes)")
        if "chosen" not in res: raise SystemExit("run the tuning stage first (--stage tune)")
        stage_final(s, data, res, out, work, t0, prereg, force=a.force)
    res["complete"] = "contrast" in res
    _save(path, res, t0)

if __name__ == "__main__":
    main()
