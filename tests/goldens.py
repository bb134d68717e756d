"""Compare two golden-trace files recorded with ``ASYNGRAD_GOLDEN=FILE pytest ...``.

    ASYNGRAD_GOLDEN=/tmp/before.jsonl pytest -n 2 -m "not alone" --hypothesis-seed=0  # before
    ASYNGRAD_GOLDEN=/tmp/after.jsonl pytest -n 2 -m "not alone" --hypothesis-seed=0   # after
    python tests/goldens.py /tmp/before.jsonl /tmp/after.jsonl

Real runs (``alone``) are not deterministic and are not recorded; a fixed hypothesis seed
makes the property tests draw the same scenarios in both runs.

Traces are matched by test, by their place among the test's traces and by their scenario;
the report lists every trace whose arrays differ (and which arrays), and the traces found in
only one file. Exit 1 when any recorded trace differs, else 0.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def load(path: str | Path) -> dict[tuple[str, int, str], dict[str, str]]:
    """Each trace's array hashes by (test, index within the test, scenario hash)."""
    traces = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        traces[(row["test"], row["index"], row["scenario"])] = row["arrays"]
    return traces


def compare(before: dict[tuple[str, int, str], dict[str, str]],
            after: dict[tuple[str, int, str], dict[str, str]]) -> dict[str, object]:
    """Traces in both files that differ (with the arrays that do), and the unmatched ones."""
    changed: dict[str, list[str]] = defaultdict(list)
    for key in sorted(before.keys() & after.keys()):
        names = sorted(n for n in before[key].keys() | after[key].keys()
                       if before[key].get(n) != after[key].get(n))
        if names:
            changed[f"{key[0]} #{key[1]}"] = names
    return {"compared": len(before.keys() & after.keys()), "changed": dict(changed),
            "only_before": len(before.keys() - after.keys()),
            "only_after": len(after.keys() - before.keys())}


def main(argv: list[str]) -> int:
    result = compare(load(argv[0]), load(argv[1]))
    changed = result["changed"]
    assert isinstance(changed, dict)
    print(f"{result['compared']} traces compared, {len(changed)} differ; "
          f"{result['only_before']} only before, {result['only_after']} only after")
    for where, names in changed.items():
        print(f"  {where}: {', '.join(names)}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
