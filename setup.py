"""Packaging for composer_replication: everything is read from settings.ini (nbdev 2 layout)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

requirements = cfg.get("requirements", "").split()
extras = {k[len("extras_"):]: v.split() for k, v in cfg.items() if k.startswith("extras_")}
extras["dev"] = cfg.get("dev_requirements", "").split()
extras["all"] = sorted({r for k, reqs in extras.items() if k != "dev" for r in reqs})
licenses = {"apache2": ("Apache-2.0",)}
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable", "6 - Mature", "7 - Inactive"]
py_versions = "3.10 3.11 3.12 3.13".split()
lic = licenses[cfg["license"].lower()]
min_python = cfg["min_python"]

setuptools.setup(
    name=cfg["repo"].replace("-framework", "").replace("_", "-"),
    version=cfg["version"],
    description=cfg["description"],
    long_description=Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license=lic[0],  # an SPDX expression (setuptools deprecates license classifiers)
    keywords=cfg["keywords"].split(),
    url=cfg["git_url"],
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"])],
        "Intended Audience :: " + cfg["audience"],
        "Natural Language :: " + cfg["language"],
    ] + ["Programming Language :: Python :: " + v for v in py_versions[py_versions.index(min_python):]],
    # namespace discovery: the data folders (assets/*, recipes/replaysim) are packages too, so setuptools ships them quietly
    packages=setuptools.find_namespace_packages(include=[cfg["lib_name"], cfg["lib_name"] + ".*"]),
    include_package_data=True,
    package_data={"": ["*.json", "*.jinja", "*.jsonl", "*.yaml"]},
    install_requires=requirements,
    extras_require=extras,
    python_requires=">=" + min_python,
    zip_safe=False,
    entry_points={
        "console_scripts": cfg.get("console_scripts", "").split(),
        "nbdev": [f"{cfg['lib_name']}={cfg['lib_name']}._modidx:d"],
        # the built-in plugins: settings.ini's `plugins_KIND` keys, group composer_replication.KIND (composer_replication.plugins)
        **{f"{cfg['lib_name']}.{k[len('plugins_'):]}": v.split() for k, v in cfg.items() if k.startswith("plugins_")},
    },
)
