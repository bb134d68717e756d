"""``asyngrad compare`` of a real run and the simulation of its own recorded scenario, for
every protocol and backend: the report is complete (the four targets, each side's staleness
and error rate as the trace says), and where the real run's order leaves nothing to chance
(round-robin turns, synchronous rounds, one trainer on a server) the simulation's staleness
is the real run's exactly."""

import json

import numpy as np
import pytest

from simulator.cli import main
from simulator.replay import load_trace

pytestmark = pytest.mark.alone  # real processes: see conftest

TINY = ("problem.dim=20", "problem.n_samples=200", "run.updates=300", "run.lr=0.05")

# (name, the real command's arguments, whether the order leaves nothing to chance)
RUNS = [
    ("lockfree", ["--mode", "lockfree"], False),
    ("locked", ["--mode", "locked"], False),
    ("minibatch", ["--mode", "minibatch"], True),
    ("allreduce", ["--mode", "allreduce"], True),
    ("roundrobin", ["--mode", "roundrobin"], True),
    ("staleness_lr", ["--mode", "staleness_lr"], False),
    ("dcasgd", ["--mode", "dcasgd"], False),
    ("admm", ["--mode", "admm"], False),
    ("paramserver", ["--backend", "ps", "--set", "run.protocol=paramserver"], False),
    ("paramserver, one trainer", ["--backend", "ps", "--workers", "1"], True),
    ("server rule", ["--backend", "ps", "--set", "paramserver.rule=dcasgd"], False),
    ("lock-free server", ["--backend", "ps", "--set", "paramserver.lock_free=true"], False),
    ("server pool", ["--backend", "ps", "--servers", "2"], False),
    ("admm on the server", ["--backend", "ps", "--set", "run.protocol=admm"], False),
]


@pytest.mark.parametrize(("name", "real", "fixed"), RUNS, ids=[r[0] for r in RUNS])
def test_compare_reports_a_real_run_against_its_simulation(tmp_path, capsys, name, real,
                                                           fixed):
    out, sim, cmp = tmp_path / "real", tmp_path / "sim", tmp_path / "cmp"
    tiny = [a for o in TINY for a in ("--set", o)]
    assert main(["real", *real, *tiny, "--dtype", "float64", "--quiet", "--out",
                 str(out)]) == 0, name
    assert main(["simulate", str(out / "scenario.toml"), "--quiet", "--out", str(sim)]) == 0
    capsys.readouterr()
    assert main(["compare", str(out), str(sim), "--out", str(cmp)]) == 0
    report = json.loads((cmp / "compare.json").read_text())
    a, b = load_trace(out), load_trace(sim)
    assert report["a"]["updates"] == len(a) and report["b"]["updates"] == len(b)
    assert [t["metric"] for t in report["targets"]] == [
        "mean staleness", "staleness distribution", "gradient error rate",
        "final suboptimality"]
    assert report["staleness"]["mean_a"] == pytest.approx(float(a["staleness"].mean()))
    assert report["staleness"]["mean_b"] == pytest.approx(float(b["staleness"].mean()))
    assert report["loss"]["final_ratio"] is not None
    if fixed:
        assert np.array_equal(np.sort(a["staleness"]), np.sort(b["staleness"]))
        assert report["staleness"]["ks_distance"] == 0
