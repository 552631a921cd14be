"""Write README.md from nbs/index.ipynb (nbdev_readme needs Quarto, which these machines lack).

    python tools/readme.py           # rewrite README.md
    python tools/readme.py --check   # exit 1 if README.md is out of step with the notebook
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def render() -> str:
    "The README text: the index notebook's markdown cells and its shown code cells (as Python blocks), in order."
    nb = json.loads((ROOT / "nbs/index.ipynb").read_text(encoding="utf-8"))
    cells = []
    for c in nb["cells"]:
        src = "".join(c["source"]).strip()
        if c["cell_type"] == "markdown": cells.append(src)
        elif c["cell_type"] == "code" and not src.startswith("#|"): cells.append(f"```python\n{src}\n```")
    head = "<!-- Generated from nbs/index.ipynb by tools/readme.py: edit the notebook, then run the tool. -->\n\n"
    return head + "\n\n".join(cells) + "\n"


def main(argv) -> int:
    want, readme = render(), ROOT / "README.md"
    if "--check" in argv:
        ok = readme.exists() and readme.read_text(encoding="utf-8") == want
        print("README.md is in step with nbs/index.ipynb" if ok else "README.md differs from nbs/index.ipynb: run python tools/readme.py")
        return 0 if ok else 1
    readme.write_text(want, encoding="utf-8")
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
