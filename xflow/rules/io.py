"""Reading and writing rule files, and finding the shipped rule set."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from xflow.errors import XflowError, one_line
from xflow.rules.model import Rule, RuleError, parse_rule

FORMAT = "xflow.rules/1"


DEFAULT_RULE_FILE = "default.json"


def default_rules_path() -> Path:
    """The shipped rule file ``default.json``: the installed package's copy (``xflow/rules/data/``, which the wheel
    maps from the repository's ``rules/``), read with importlib.resources; in a checkout (an editable install, the
    tree on PYTHONPATH), where the package has no ``data/``, the repository's ``rules/``."""
    installed = resources.files("xflow.rules").joinpath("data", DEFAULT_RULE_FILE)
    if isinstance(installed, Path) and installed.is_file():  # pip installs wheels unpacked: a real file
        return installed
    return Path(__file__).resolve().parents[2] / "rules" / DEFAULT_RULE_FILE


def load_rules(path: str | os.PathLike[str] | None = None, only: Collection[str] | None = None) -> list[Rule]:
    """Parse and check every rule of a file (None: the shipped one); XflowError naming the file on any problem.
    The shipped file missing or holding no rules is such a problem: optimizing with no rules would only copy
    the model. ``only``: parse and check just the rules of these names (``xflow check`` needs those its
    certificate applies; parsing the shipped file's 1,468 is seconds); every name is still checked unique."""
    if path is None:
        shipped = default_rules_path()
        if not shipped.is_file():
            raise XflowError(str(shipped), "the shipped rule file is missing (a broken install?); "
                             "reinstall xflow or pass --rules FILE")
        rules = load_rules(shipped, only)
        if not rules and only is None:
            raise XflowError(str(shipped), "the shipped rule file holds no rules; pass --rules FILE")
        return rules
    path = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise XflowError(path, "no such rule file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise XflowError(path, f"cannot read rule file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise XflowError(path, f"not a JSON rule file: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("rules"), list):
        raise XflowError(path, f"not an xflow rule file (expected {{\"format\": \"{FORMAT}\", \"rules\": [...]}})")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, raw in enumerate(data["rules"]):
        if only is not None and isinstance(raw, dict) and isinstance(raw.get("name"), str) and \
                raw["name"] not in only:
            if raw["name"] in seen:
                raise XflowError(path, f"rule name {raw['name']!r} appears twice")
            seen.add(raw["name"])
            continue
        try:
            rule = parse_rule(raw)
        except (RuleError, TypeError, ValueError) as exc:  # the last two: a value of the wrong kind, said in one line
            where = "" if isinstance(raw, dict) and isinstance(raw.get("name"), str) else f"rules[{index}]: "
            raise XflowError(path, f"{where}{one_line(exc)}") from None
        if rule.name in seen:
            raise XflowError(path, f"rule name {rule.name!r} appears twice")
        seen.add(rule.name)
        rules.append(rule)
    return rules


def dump_rules(rules: Iterable[Rule], path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
    """Write rules as a rule file (deterministic order and formatting)."""
    data = {"format": FORMAT, **(meta or {}), "rules": [r.to_json() for r in rules]}
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def rules_from_json(items: list[dict[str, Any]]) -> list[Rule]:
    """Parse rules given as JSON-like dicts (tests, embedded rule sets)."""
    return [parse_rule(item) for item in items]


__all__ = ["DEFAULT_RULE_FILE", "FORMAT", "Rule", "RuleError", "default_rules_path", "dump_rules", "load_rules",
           "rules_from_json"]
