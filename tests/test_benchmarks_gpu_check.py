"""benchmarks/gpu_check.py runs on the CPU at its small sizes: every comparison row and the three-channel step."""
import importlib.util, json, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_gpu_check_small_on_cpu(tmp_path):
    gc = _load()
    out = tmp_path / "gpu_check.json"
    assert gc.main(["--small", "--sizes", "T0", "--rounds", "1", "--device", "cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = {(r["size"], r["impl"]): r for r in res["rows"]}
    for impl in gc.JSD + gc.CE:
        assert ("T0", impl) in rows, impl
    for impl in ("jsd_liger_triton", "ce_liger_triton"):  # no CUDA here: skipped with the reason, not an error
        assert rows[("T0", impl)]["skipped"] == "Triton kernels need CUDA"
    losses = {i: rows[("T0", i)]["loss"] for i in ("jsd_naive", "jsd_ours", "jsd_ours_eager")}
    assert max(losses.values()) - min(losses.values()) < 1e-5 * max(losses.values()), losses  # the same loss
    ce = {i: rows[("T0", i)]["loss"] for i in ("ce_naive", "ce_ours")}
    assert abs(ce["ce_naive"] - ce["ce_ours"]) < 1e-5 * ce["ce_naive"], ce
    for impl in gc.STEPS:
        r = rows[("tiny", impl)]
        assert r["time_s"] > 0 and r["loss"] == r["loss"], r  # timed, finite loss
    assert rows[("tiny", "three_over_sum_alone")]["ratio"] > 0
    assert "three / sum of the channels alone" in res["table"] and "load average" in res["table"]


def test_gpu_check_rejects_unknown_size():
    gc = _load()
    with pytest.raises(SystemExit):
        gc.main(["--small", "--sizes", "S9"])
