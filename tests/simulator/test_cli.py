"""The asyngrad command: outputs of a run and one-line errors for bad input."""

import argparse
import json
import subprocess
import sys

import pytest

from simulator.cli import main
from simulator.rundir import FILES


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_default_simulation_writes_every_output(tmp_path):
    """`asyngrad simulate --out DIR` with no file runs the default scenario and writes all."""
    result = _cli("simulate", "--out", str(tmp_path / "demo"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == sorted(FILES)
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert (summary["protocol"], summary["threads"], summary["write_mode"]) == (
        "lockfree", 8, "load_store")
    assert "gradient error rate" in result.stdout
    for png in ("timeline.png", "loss.png", "error_hist.png"):
        assert (tmp_path / "demo" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curve = (tmp_path / "demo" / "curve.csv").read_text().splitlines()
    assert curve[0] == "update,time_ns,loss,suboptimality,dist2,gradients" and len(curve) == 102


def test_replay_command_reproduces_the_trace(tmp_path):
    """`asyngrad replay RUN` writes a run whose trace has the same arrays as the original."""
    assert main(["simulate", "--out", str(tmp_path / "a"), "--quiet",
                 "--set", "run.updates=300"]) == 0
    assert main(["replay", str(tmp_path / "a"), "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert (tmp_path / "a" / "curve.csv").read_bytes() == (tmp_path / "b" / "curve.csv"
                                                             ).read_bytes()


def test_scenario_command_prints_resolved_toml(tmp_path, capsys):
    """`asyngrad scenario` prints a file that `simulate` accepts back."""
    assert main(["scenario", "--set", "run.threads=3"]) == 0
    text = capsys.readouterr().out
    assert "threads = 3" in text
    (tmp_path / "s.toml").write_text(text)
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / "r"), "--quiet",
                 "--set", "run.updates=50"]) == 0
    assert "threads = 3" in (tmp_path / "r" / "scenario.toml").read_text()


def test_scenario_reference_prints_the_generated_reference(capsys):
    """`asyngrad scenario --reference` prints docs/scenario.md's text; with a scenario, exit 2."""
    from simulator.scenario_reference import reference

    assert main(["scenario", "--reference"]) == 0
    assert capsys.readouterr().out == reference()
    assert main(["scenario", "--reference", "--set", "run.threads=2"]) == 2
    assert "--reference = 'run.threads=2'" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "run.threads=-1"], "run.threads = -1"),
    (["--set", "run.blocks=0"], "run.blocks = 0"),
    (["--set", "run.lr=0"], "run.lr = 0"),
    (["--set", "run.nope=1"], "run.nope = 1: unknown key"),
    (["--set", "timing.read.dist=weibull"], "timing.read.dist = 'weibull'"),
    (["--set", "problem.dim"], "--set = 'problem.dim'"),
    (["missing.toml"], "scenario = 'missing.toml'"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, needle):
    """Bad values: exit 2, one line on stderr naming field and value, no output directory."""
    out = tmp_path / "out"
    result = _cli("simulate", *args, "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["simulate", "replay missing.npz", "sweep", "check",
                                  "tausweep --eps 0.1", "explore", "table",
                                  "calibrate missing", "compare a b", "real"])
def test_an_empty_out_is_refused_by_every_command(tmp_path, monkeypatch, capsys, name):
    """``--out ''`` is one line naming --out, before the command's own inputs are read (it
    was taken as '.', and named '.' in the error)."""
    monkeypatch.chdir(tmp_path)
    assert main([*name.split(), "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["asyngrad: error: --out = '': must not be empty"]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "name"), [
    (["simulate", "", "--out", "x"], "scenario"), (["replay", "", "--out", "x"], "trace"),
    (["calibrate", "run", "", "--out", "x"], "RUN"), (["compare", "", "b"], "run_a"),
    (["compare", "a", " "], "run_b")])
def test_an_empty_path_is_refused(tmp_path, monkeypatch, capsys, args, name):
    """A path given as '' is one line naming it, before anything is read (compare and
    calibrate read '.' and named it so; replay looked for trace.npz there)."""
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"asyngrad: error: {name} = '"), err
    assert err[0].endswith("': must not be empty")
    assert not any(tmp_path.iterdir())


def test_corrupt_trace_is_one_line_exit_2(tmp_path):
    """A corrupt trace given to replay is reported in one line with exit 2."""
    bad = tmp_path / "trace.npz"
    bad.write_bytes(b"PK\x03\x04 definitely not a zip")
    result = _cli("replay", str(bad), "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "trace" in result.stderr and not (tmp_path / "r").exists()


def test_unknown_subcommand_is_one_line_exit_2():
    """argparse errors are one line too."""
    result = _cli("frobnicate")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_every_subcommand_prints_its_help():
    """`asyngrad X --help` renders for every subcommand (argparse expands % in help texts)."""
    from simulator.cli import _parser

    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == {"simulate", "replay", "sweep", "scenario", "theorem",
                                     "check", "tausweep", "explore", "table", "calibrate",
                                     "compare", "real"}
    for name, sub in commands.choices.items():
        text = sub.format_help()
        assert text.startswith(f"usage: asyngrad {name}"), name


def test_rerun_replaces_an_earlier_run_whole(tmp_path):
    """Writing into an earlier run directory replaces it; nothing else is left behind."""
    out = tmp_path / "run"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.updates=20"]) == 0
    (out / "loss.png").unlink()
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.updates=30"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


@pytest.mark.parametrize("kind", ["file", "foreign_dir"])
def test_nothing_of_the_users_is_replaced(tmp_path, kind):
    """--out naming a file, or a directory with other files, is refused before running."""
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("precious")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("precious")
    result = _cli("simulate", "--out", str(out), "--set", "run.updates=20")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--out" in result.stderr
    precious = out if kind == "file" else out / "notes.txt"
    assert precious.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unwritable_out_is_one_line(tmp_path):
    """A location that cannot be created is one line, exit 2."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result = _cli("simulate", "--out", str(blocker / "run"), "--set", "run.updates=20")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "cannot be written" in result.stderr
