"""The one part of the build pyproject.toml cannot state: the shipped rule files stay at the repository's top
(``rules/``, where ``xflow generate-rules --out rules/...``, the tests and the docs find them) and go into the
wheel as the package data ``xflow/rules/data/``, which ``xflow.rules.io.default_rules_path`` reads with
importlib.resources; and ``xflow/py.typed`` (PEP 561: xflow's type hints are for its users too). Everything
else is in pyproject.toml."""

from setuptools import find_packages, setup

RULE_DATA = "xflow.rules.data"
# the generator and verifier: top-level folders here, installed in the xflow namespace
NAMESPACED = [f"xflow.{name}" for name in find_packages(include=["generator*", "verifier*"])]

setup(
    packages=[*find_packages(include=["xflow*"]), *NAMESPACED, RULE_DATA],
    package_dir={RULE_DATA: "rules", "xflow.generator": "generator", "xflow.verifier": "verifier"},
    package_data={RULE_DATA: ["*.json"], "xflow": ["py.typed"]},
)
