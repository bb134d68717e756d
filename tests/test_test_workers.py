"""The test suite's own sharing of the machine under pytest-xdist (tests/conftest.py): a test
marked ``alone`` runs with no other test beside it, the others run side by side."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

SPANS = '''
import os, time, pytest

def _span(kind, i):
    start = time.monotonic()
    time.sleep(0.2)
    with open(os.environ["SPANS"], "a") as log:
        log.write(f"{kind} {i} {os.environ['PYTEST_XDIST_WORKER']} {start} {time.monotonic()} "
                  f"{os.environ['ASYNGRAD_TEST_LOCKS']}\\n")

@pytest.mark.parametrize("i", range(10))
def test_beside(i):
    _span("beside", i)

@pytest.mark.alone
@pytest.mark.parametrize("i", range(4))
def test_alone(i):
    _span("alone", i)
'''


def test_alone_tests_have_the_machine_and_the_others_share_it(pytester, tmp_path, monkeypatch):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    alone: no other test beside it\n")
    pytester.makepyfile(test_spans=SPANS)
    spans, temp = tmp_path / "spans.txt", tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("SPANS", str(spans))
    monkeypatch.setenv("TMPDIR", str(temp))  # where the run's lock folder is made
    result = pytester.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=14)
    rows = [line.split() for line in spans.read_text().splitlines()]
    runs = [(kind, worker, float(start), float(end)) for kind, _, worker, start, end, _ in rows]
    assert {Path(row[5]).parent for row in rows} == {temp}
    together = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
                if a[2] < b[3] and b[2] < a[3]]
    assert not [pair for pair in together if "alone" in (pair[0][0], pair[1][0])]
    assert together  # the others did run side by side
    assert {worker for _, worker, _, _ in runs} == {"gw0", "gw1"}
    assert not list(temp.glob("asyngrad-tests-*"))  # the lock folder is gone
