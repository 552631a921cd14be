"""Run the whole test suite: every notebook's cells (nbdev's `test_nb`), then pytest under tests/.

    python tools/run_tests.py               # everything, slow cells included (what CI runs)
    python tools/run_tests.py --fast        # skip cells flagged `#| slow`
    python tools/run_tests.py --path nbs/01_opsd.ipynb --no-pytest

Each notebook counts as one test, each pytest test as one. The last line is always
`N passed, M failed`; the exit status is non-zero if anything failed or nothing ran.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_notebooks(path: str | None, fast: bool, n_workers: int) -> tuple[int, int, list[str]]:
    "Test notebooks in parallel with nbdev's own `test_nb`; returns (passed, failed, failed names)."
    from fastcore.parallel import parallel
    from nbdev.config import get_config
    from nbdev.doclinks import nbglob
    from nbdev.test import _keep_file, test_nb

    cfg = get_config()
    if path and any(c in path for c in "*?["):  # a glob such as nbs/0*.ipynb
        files = [p for p in ROOT.glob(path) if p.suffix == ".ipynb"]
    else:
        files = nbglob(path, as_path=True)
    files = sorted(f.absolute() for f in files if _keep_file(f, ".notest"))
    if not fast: files.sort(key=lambda f: not has_slow_cells(f))   # the long ones first, so no worker is left alone with one at the end
    skip = cfg.tst_flags.split()
    force = [] if fast else [f for f in skip if f != "notest"]
    workers = min(n_workers, len(files)) if len(files) > 1 else 1
    os.environ["OMP_NUM_THREADS"] = share_cores(workers)   # read by torch when a worker imports it
    print(f"notebooks: {len(files)} on {workers} worker(s), {os.environ['OMP_NUM_THREADS']} torch thread(s) each", flush=True)
    t0 = time.time()
    os.chdir(cfg.nbs_path)
    results = parallel(test_nb, files, skip_flags=skip, force_flags=force, n_workers=min(n_workers, len(files)) if len(files) > 1 else 0,
                       basepath=cfg.config_path, pause=0.01)
    os.chdir(ROOT)
    failed = [f.relative_to(ROOT).as_posix() for f, (ok, _) in zip(files, results) if not ok]
    for f, (ok, secs) in sorted(zip(files, results), key=lambda o: -o[1][1]):
        print(f"  {'ok  ' if ok else 'FAIL'} {secs:6.1f}s  {f.relative_to(ROOT).as_posix()}")
    print(f"notebooks: {len(files) - len(failed)} passed, {len(failed)} failed in {time.time() - t0:.0f}s")
    return len(files) - len(failed), len(failed), failed


def has_slow_cells(nb: Path) -> bool:
    "Whether a notebook has a `#| slow` cell (the notebooks that train real models: the suite's longest)."
    import json
    cells = json.loads(nb.read_text(encoding="utf-8")).get("cells", [])
    return any(c.get("cell_type") == "code" and "".join(c.get("source", [])).lstrip().startswith("#| slow") for c in cells)


def run_pytest(fast: bool, n_workers: int = 1) -> tuple[int, int]:
    "Run pytest on tests/ (a file's tests together, on `n_workers` pytest-xdist workers) and count its results from a JUnit report."
    if not any((ROOT / "tests").glob("test_*.py")):
        return 0, 0
    with tempfile.TemporaryDirectory() as d:
        xml = Path(d) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "--durations=30", f"--junitxml={xml}"]
        if fast:
            cmd += ["-m", "not slow"]
        if n_workers > 1:   # many tests wait on subprocesses, servers and sandboxes: two workers keep both cores busy
            cmd += ["-n", str(n_workers), "--dist", "loadfile"]
        env = {**os.environ, "OMP_NUM_THREADS": share_cores(n_workers)}
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        if not xml.exists():
            print(f"pytest produced no report (exit {rc})")
            return 0, 1
        suites = ET.parse(xml).getroot()
        suites = [suites] if suites.tag == "testsuite" else list(suites)
        total = sum(int(s.get("tests", 0)) for s in suites)
        bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
        skipped = sum(int(s.get("skipped", 0)) for s in suites)
    print(f"pytest: {total - bad - skipped} passed, {bad} failed, {skipped} skipped")
    return total - bad - skipped, bad + (1 if rc not in (0, 5) and bad == 0 else 0)


USER_THREADS = os.environ.get("OMP_NUM_THREADS")   # a value the caller set is kept


def share_cores(n_workers: int) -> str:
    """OMP_NUM_THREADS for `n_workers` parallel workers: each its share of the cores for torch's intra-op threads
    (unless the caller set it). Two workers each running torch on both of two cores wait on each other at every
    parallel region: measured here (a 4-layer Llama's forward + backward, two processes side by side on 2 cores,
    load ~8), one thread each ran the same loop in 26-32 s of wall time and 5.5-6.3 s of CPU, two each in 90-120 s
    and 18-20 s."""
    return USER_THREADS or str(max(1, (os.cpu_count() or 1) // max(1, n_workers)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="skip `#| slow` cells and pytest tests marked slow")
    ap.add_argument("--path", default=None, help="a notebook or glob (default: all of nbs/)")
    ap.add_argument("--no-pytest", action="store_true")
    ap.add_argument("--n-workers", type=int, default=min(os.cpu_count() or 1, 2))
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tmp = suite_tempdir()
    print(f"temporary folder: {tmp} (removed after a passing run, kept otherwise)", flush=True)   # a run cut short keeps it too
    np_, nf, failed = run_notebooks(args.path, args.fast, args.n_workers)
    pp, pf = (0, 0) if args.no_pytest else run_pytest(args.fast, args.n_workers)
    if failed:
        print("failed notebooks: " + ", ".join(failed))
    passed, nfail = np_ + pp, nf + pf
    left = sorted(p.name for p in tmp.iterdir())
    if not nfail: shutil.rmtree(tmp, ignore_errors=True)
    print(f"temporary folder: {len(left)} entries left by the suite's processes" + (f", e.g. {', '.join(left[:5])}" if left else "")
          + ("" if not nfail else f"; kept for a look: {tmp}"))
    print(f"{passed} passed, {nfail} failed")
    return 1 if nfail or passed == 0 else 0


def suite_tempdir() -> Path:
    """A temporary folder for everything the suite's processes make (TMPDIR, inherited by every notebook worker, pytest
    and the launchers they start): removed after a passing run, kept after a failing one. Some of what the suite starts
    cannot clean up after itself: torchrun leaves its `torchelastic_*` folders, and the notebook workers end with
    `os._exit`, which runs no finalizer (before this folder, a day of suite runs on one machine had left 88 `torchelastic_*`
    and 197 `composer-replicas-*` folders in /tmp)."""
    tmp = Path(tempfile.mkdtemp(prefix="composer-suite-"))
    tmp.chmod(0o1777)   # as /tmp is: the sandbox's tests run a Sandbox as nobody in a folder made here
    os.environ["TMPDIR"] = str(tmp); tempfile.tempdir = None   # this process too, from its next temporary file on
    return tmp


if __name__ == "__main__":
    sys.exit(main())
