"""The bounds' command line (``simulator/cli/bounds.py``): options a bound does not use,
printing results with missing values, the progress total."""

from __future__ import annotations

import contextlib

import pytest

import simulator.cli.bounds
from simulator.cli import main

SERIAL = ("problem.name=quadratic", "problem.dim=10", "problem.n_samples=100",
          "run.protocol=serial", "run.threads=1", "run.updates=300")
SETS = tuple(f"--set={o}" for o in SERIAL)
THEOREM = ("--c", "0.1", "--q", "2", "--kappa", "3", "--tau", "1e-4", "--eps", "1e-2", "--a0",
           "4")
LANGFORD = ("--bound", "langford", "--L", "4", "--F", "3", "--tau", "3", "--T", "1000")


@pytest.mark.parametrize(("args", "needle"), [
    (("check", "--bound", "langford", "--eps", "1"), "--eps = 1.0: applies to --bound "
                                                     "asyngrad or hogwild only (not langford)"),
    (("check", "--bound", "langford", "--max-updates", "10"), "--max-updates = 10"),
    (("check", "--bound", "langford", "--rounds", "2"), "--rounds = 2"),
    (("check", "--bound", "langford", "--beta", "1"), "--beta = 1.0"),
    (("check", "--bound", "langford", "--theta", "0.5"), "--theta = 0.5"),
    (("check", "--bound", "hogwild", "--eps", "1", "--beta", "1"),
     "--beta = 1.0: applies to --bound asyngrad only (not hogwild)"),
    (("check", "--eps", "1", "--theta", "0.5"),
     "--theta = 0.5: applies to --bound hogwild only (not asyngrad)"),
    (("tausweep", "--eps", "1", "--bounds", "1,2", "--points", "9"), "--points = 9"),
    (("theorem", *THEOREM, "--sigma", "0.1"), "--sigma = 0.1: applies to --bound langford"),
    (("theorem", *THEOREM, "--lambda", "0.1"), "--lambda = 0.1: applies to --bound langford"),
    (("theorem", *THEOREM, "--theta", "0.5"), "--theta = 0.5"),
    (("theorem", *LANGFORD, "--kappa", "3"), "--kappa = 3.0: applies to --bound asyngrad"),
    (("theorem", *LANGFORD, "--beta", "1"), "--beta = 1.0"),
])
def test_options_a_bound_does_not_use_are_refused(args, needle, tmp_path, capsys):
    """An option the bound (or --bounds) would ignore, given even at its default value: one
    line naming it, exit 2, before any run or file."""
    out = tmp_path / "out"
    command = (*args, "--out", str(out), *SETS) if args[0] != "theorem" else args
    assert main(list(command)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_options_left_out_take_their_defaults(capsys):
    """Defaults refuse nothing: each bound's theorem runs with only its own options."""
    assert main(["theorem", *THEOREM]) == 0
    assert "β=1" in capsys.readouterr().out
    assert main(["theorem", *LANGFORD, "--sigma", "0.5", "--lambda", "0.1"]) == 0
    assert "σ = 0.5" in capsys.readouterr().out


def test_check_of_a_start_within_eps_prints_no_validation(tmp_path, capsys):
    """ε above L·D_0: (4.2) asks for no update and nothing runs; the printout and the figure
    do without a validation. The same for AsynGrad's check at such an ε."""
    assert main(["check", "--bound", "hogwild", "--eps", "5", "--seeds", "2",
                 "--pilot-seeds", "1", "--out", str(tmp_path / "hog"), *SETS]) == 0
    out = capsys.readouterr().out
    assert "holds: L·D_0" in out and "round" not in out and "tightness" not in out
    assert (tmp_path / "hog" / "check.png").stat().st_size > 0
    assert main(["check", "--eps", "5", "--seeds", "2", "--pilot-seeds", "1", "--out",
                 str(tmp_path / "asyn"), *SETS]) == 0
    out = capsys.readouterr().out
    assert "holds: (q/2)·a_0" in out and "round" not in out
    assert (tmp_path / "asyn" / "check.png").stat().st_size > 0


def test_langford_progress_counts_its_runs(tmp_path, monkeypatch):
    """The progress total of the delayed-SGD check is its pilot runs and the runs of its two
    theorems, not --rounds validations."""
    seen: dict[str, int] = {"total": 0, "done": 0}

    class Bar:
        def update(self, n: int) -> None:
            seen["done"] += n

    @contextlib.contextmanager
    def progress(total: int, quiet: bool):
        seen["total"] = total
        yield Bar()

    monkeypatch.setattr(simulator.cli.bounds, "progress", progress)
    assert main(["check", "--bound", "langford", "--seeds", "2", "--pilot-seeds", "1",
                 "--quiet", "--out", str(tmp_path / "lang"), "--set=problem.dim=10",
                 "--set=problem.n_samples=200", "--set=run.threads=4",
                 "--set=run.updates=300", "--set=run.lr=0.1"]) == 0
    assert seen == {"total": 5, "done": 5}


@pytest.mark.parametrize(("args", "needle"), [
    (("--out", ""), "--out = '': must not be empty"),  # (it wrote runs/check-NAME)
    (("--set", 'name="../../escaped"'), "name = '../../escaped': cannot name the default"),
    (("--set", 'name=""'), "name = '': cannot name the default")])
def test_check_writes_only_where_it_is_told(tmp_path, monkeypatch, capsys, args, needle):
    """An empty --out, or a scenario name that is not a plain file name, is refused before
    any run (they wrote the default directory, or one outside runs/)."""
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--eps", "1", "--quiet", *SETS, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not any(tmp_path.iterdir())
