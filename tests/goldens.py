"""Compare two golden-trace files recorded with ``ASYNGRAD_GOLDEN=FILE pytest ...``.

    ASYNGRAD_GOLDEN=/tmp/before.jsonl pytest -n 2 -m "not alone" --hypothesis-seed=0  # before
    ASYNGRAD_GOLDEN=/tmp/after.jsonl pytest -n 2 -m "not alone" --hypothesis-seed=0   # after
    python tests/goldens.py /tmp/before.jsonl /tmp/after.jsonl

Real runs (``alone``) are not deterministic and are not recorded; a fixed hypothesis seed
makes the property tests draw the same scenarios in both runs.

Traces are matched by test (its file's name without the folder, so a test that moved to a
package's folder still matches) and by their place among the test's traces; the report lists
every trace whose arrays differ (and which arrays), the traces whose scenario text changed
(a format change: the run must still be the same), and the traces found in only one file.
Exit 1 when any recorded trace differs, else 0.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

Golden = dict[tuple[str, int], tuple[str, dict[str, str]]]


def load(path: str | Path) -> Golden:
    """Each trace's (scenario hash, array hashes) by (test, index within the test)."""
    traces = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        test = row["test"].rsplit("/", 1)[-1]
        traces[(test, row["index"])] = (row["scenario"], row["arrays"])
    return traces


def compare(before: Golden, after: Golden) -> dict[str, object]:
    """Traces in both files that differ (with the arrays that do), the number whose scenario
    text changed, and the unmatched ones."""
    changed: dict[str, list[str]] = defaultdict(list)
    both = sorted(before.keys() & after.keys())
    for key in both:
        (_, old), (_, new) = before[key], after[key]
        names = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))
        if names:
            changed[f"{key[0]} #{key[1]}"] = names
    return {"compared": len(both), "changed": dict(changed),
            "scenario_text": sum(before[k][0] != after[k][0] for k in both),
            "only_before": len(before.keys() - after.keys()),
            "only_after": len(after.keys() - before.keys())}


def main(argv: list[str]) -> int:
    result = compare(load(argv[0]), load(argv[1]))
    changed = result["changed"]
    assert isinstance(changed, dict)
    print(f"{result['compared']} traces compared, {len(changed)} differ; "
          f"{result['only_before']} only before, {result['only_after']} only after; "
          f"{result['scenario_text']} with a changed scenario text")
    for where, names in changed.items():
        print(f"  {where}: {', '.join(names)}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
