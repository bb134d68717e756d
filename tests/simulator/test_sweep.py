"""Sweeps: grid planning, executors, resuming, and bad input."""

import json
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from simulator.engine import Engine
from simulator.errors import AsyngradError, ScenarioError
from simulator.metrics import summarize
from simulator.sweep import Axis, parse_axis, plan_sweep, run_sweep

BASE = ["run.updates=200"]
AXES = [Axis("run.threads", ("1", "4")), Axis("run.write_mode", ("load_store", "atomic_add"))]


def test_axis_syntax():
    """Comma lists and TOML arrays both work; strings in arrays keep their quotes."""
    assert parse_axis("run.threads=1, 2,8") == Axis("run.threads", ("1", "2", "8"))
    assert parse_axis("run.protocol=['locked', 'lockfree']").values == ('"locked"',
                                                                         '"lockfree"')
    for bad in ("run.threads", "=1,2", "run.threads=", "run.threads=1,,2", "x=[1,"):
        with pytest.raises(ScenarioError):
            parse_axis(bad)


def test_plan_is_the_row_major_product():
    """Cells enumerate the grid's product, last axis fastest, each with its scenario."""
    cells = plan_sweep(None, BASE, AXES)
    assert [c.values for c in cells] == [("1", "load_store"), ("1", "atomic_add"),
                                        ("4", "load_store"), ("4", "atomic_add")]
    assert [(c.scenario.run.threads, c.scenario.run.write_mode) for c in cells] == [
        (1, "load_store"), (1, "atomic_add"), (4, "load_store"), (4, "atomic_add")]


def test_a_bad_cell_fails_the_plan():
    """An invalid value anywhere in the grid is found before anything runs."""
    with pytest.raises(ScenarioError, match=r"run\.threads"):
        plan_sweep(None, BASE, [Axis("run.threads", ("2", "-1"))])
    with pytest.raises(ScenarioError, match="twice"):
        plan_sweep(None, BASE, [Axis("run.seed", ("1",)), Axis("run.seed", ("2",))])


def test_cells_equal_standalone_runs(tmp_path):
    """A cell's summary is exactly the summary of simulating its scenario alone."""
    cells = plan_sweep(None, BASE, AXES)
    rows, ran = run_sweep(cells, AXES, tmp_path)
    assert ran == 4 and len(rows) == 4
    engine = Engine(cells[2].scenario)
    alone = summarize(engine.run(), engine.problem, cells[2].scenario)
    saved = json.loads((tmp_path / "cells" / "0002" / "summary.json").read_text())
    assert saved == json.loads(json.dumps(alone))
    assert rows[2]["lost_blocks"] == alone["overwrites"]["lost_blocks"] > 0
    assert rows[3]["lost_blocks"] == 0  # atomic_add


def test_process_pool_gives_the_same_table(tmp_path):
    """Cells run in worker processes give a byte-identical table."""
    cells = plan_sweep(None, BASE, AXES)
    run_sweep(cells, AXES, tmp_path / "here")
    with ProcessPoolExecutor(max_workers=2) as pool:
        run_sweep(cells, AXES, tmp_path / "pool", pool)
    assert ((tmp_path / "here" / "sweep.csv").read_bytes()
            == (tmp_path / "pool" / "sweep.csv").read_bytes())


def test_rerun_resumes_finished_cells(tmp_path):
    """A rerun runs only cells without a finished directory, and the table is unchanged."""
    cells = plan_sweep(None, BASE, AXES)
    run_sweep(cells, AXES, tmp_path)
    table = (tmp_path / "sweep.csv").read_bytes()
    assert run_sweep(cells, AXES, tmp_path)[1] == 0
    shutil.rmtree(tmp_path / "cells" / "0001")
    assert run_sweep(cells, AXES, tmp_path)[1] == 1
    assert (tmp_path / "sweep.csv").read_bytes() == table


def test_a_diverged_cell_gives_the_same_table_run_or_resumed(tmp_path):
    """A cell whose run diverged has the same row whether it ran now or was resumed from its
    summary.json, where values that are not finite are null (the fresh row said nan)."""
    axes = [Axis("run.threads", ("1", "2"))]
    cells = plan_sweep(None, ["run.updates=200", "problem.dim=10", "run.lr=1e300"], axes)
    rows, ran = run_sweep(cells, axes, tmp_path)
    table = (tmp_path / "sweep.csv").read_bytes()
    assert ran == 2 and rows[0]["final_suboptimality"] is None
    assert run_sweep(cells, axes, tmp_path) == (rows, 0)
    assert (tmp_path / "sweep.csv").read_bytes() == table


def test_resume_refuses_a_different_scenario(tmp_path):
    """Cells of another sweep in the same directory are an error, not silently reused."""
    run_sweep(plan_sweep(None, BASE, AXES), AXES, tmp_path)
    other = plan_sweep(None, ["run.updates=300"], AXES)
    with pytest.raises(AsyngradError, match="different scenario"):
        run_sweep(other, AXES, tmp_path)


def test_cli_sweep_and_bad_grid(tmp_path):
    """`asyngrad sweep` writes the table; a bad grid value is one line, exit 2, no output."""
    ok = subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", "--out",
                         str(tmp_path / "s"), "--grid", "run.threads=1,2", "--seeds", "2",
                         "--jobs", "1", "--set", "run.updates=100"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert len((tmp_path / "s" / "sweep.csv").read_text().splitlines()) == 5
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", "--out",
                          str(tmp_path / "b"), "--grid", "run.blocks=1,0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "run.blocks = 0" in bad.stderr and not (tmp_path / "b").exists()


def test_sweep_out_that_is_a_file_is_refused(tmp_path):
    """A file where the sweep directory should go is an error, and the file is kept."""
    out = tmp_path / "s"
    out.write_text("precious")
    with pytest.raises(AsyngradError, match="exists and is not a directory"):
        run_sweep(plan_sweep(None, BASE, AXES), AXES, out)
    assert out.read_text() == "precious"


SMALL = ["problem.dim=10", "run.updates=50"]
THREADS = [Axis("run.threads", ("1", "2"))]


def _cut(path, size):
    path.write_bytes(path.read_bytes()[:size])


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at:at + 64] = bytes(b ^ 0xFF for b in data[at:at + 64])
    path.write_bytes(bytes(data))


def _edit(path, old, new):
    path.write_text(path.read_text().replace(old, new))


@pytest.mark.parametrize("damage", [
    lambda cell: (cell / "summary.json").write_text("garbage"),
    lambda cell: (cell / "summary.json").write_text("{}"),
    lambda cell: (cell / "summary.json").write_text("[1]"),
    lambda cell: _edit(cell / "summary.json", '"lost_blocks": ', '"lost_blocks": "x", "_": '),
    lambda cell: (cell / "scenario.toml").unlink(),
    lambda cell: (cell / "scenario.toml").write_bytes(b"\xff garbage ["),
    lambda cell: _cut(cell / "curve.csv", 50),
    lambda cell: _cut(cell / "curve.csv", 120),
    lambda cell: (cell / "curve.csv").write_text("a,b\n1,2\n"),
    lambda cell: (cell / "trace.npz").unlink(),
    lambda cell: _cut(cell / "trace.npz", 200),
    lambda cell: (cell / "trace.npz").write_bytes(b""),
    lambda cell: _flip(cell / "trace.npz", 600),
], ids=["summary-garbage", "summary-empty", "summary-list", "summary-metric-text",
        "scenario-missing", "scenario-garbage", "curve-header-only", "curve-cut-mid-row",
        "curve-other-columns", "trace-missing", "trace-cut", "trace-empty",
        "trace-bytes-changed"])
def test_resume_reruns_a_cell_whose_files_do_not_load(tmp_path, damage):
    """A resumed cell with a file missing or damaged is run again; the table is unchanged."""
    cells = plan_sweep(None, SMALL, THREADS)
    run_sweep(cells, THREADS, tmp_path)
    cell = tmp_path / "cells" / "0001"
    files = {p.name: p.read_bytes() for p in cell.iterdir()}
    table = (tmp_path / "sweep.csv").read_bytes()
    damage(cell)
    assert run_sweep(cells, THREADS, tmp_path)[1] == 1
    assert {p.name: p.read_bytes() for p in cell.iterdir()} == files
    assert (tmp_path / "sweep.csv").read_bytes() == table
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells", "sweep.csv", "sweep.png"]


def test_cli_resume_of_a_damaged_sweep(tmp_path):
    """`asyngrad sweep` rerun on a sweep with damaged cells runs them again, exit 0."""
    from simulator.cli import main

    args = ["sweep", "--out", str(tmp_path / "s"), "--grid", "run.threads=1,2", "--jobs", "1",
            "--quiet", *(x for s in SMALL for x in ("--set", s))]
    assert main(args) == 0
    (tmp_path / "s" / "cells" / "0000" / "summary.json").write_text("garbage")
    _cut(tmp_path / "s" / "cells" / "0001" / "curve.csv", 50)
    assert main(args) == 0
    assert len((tmp_path / "s" / "sweep.csv").read_text().splitlines()) == 3


def test_resume_refuses_a_cell_holding_other_files(tmp_path):
    """A cell directory holding a file a run does not write is refused before anything runs."""
    cells = plan_sweep(None, SMALL, THREADS)
    run_sweep(cells, THREADS, tmp_path)
    shutil.rmtree(tmp_path / "cells" / "0000")
    (tmp_path / "cells" / "0001" / "summary.json").unlink()
    (tmp_path / "cells" / "0001" / "notes.txt").write_text("mine")
    with pytest.raises(AsyngradError, match=r"0001': is a directory with other files \(notes"):
        run_sweep(cells, THREADS, tmp_path)
    assert (tmp_path / "cells" / "0001" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "cells" / "0000").exists()


@pytest.mark.parametrize("other", ["keep.txt", "run"])
def test_cli_sweep_refuses_a_directory_that_is_not_a_sweep(tmp_path, capsys, other):
    """--out holding anything but a sweep's own files (cells/, sweep.csv, sweep.png): one
    line, exit 2, nothing added; a run directory is not a sweep either."""
    from simulator.cli import main

    out = tmp_path / "s"
    if other == "run":
        run_sweep(plan_sweep(None, SMALL, THREADS), THREADS, tmp_path / "sweep")
        shutil.copytree(tmp_path / "sweep" / "cells" / "0000", out)
    else:
        out.mkdir()
        (out / other).write_text("precious")
    before = sorted(p.name for p in out.iterdir())
    code = main(["sweep", "--out", str(out), "--grid", "run.threads=1,2", "--jobs", "1",
                 "--quiet", *(x for s in SMALL for x in ("--set", s))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"--out = '{out}': is a directory with other files" in err[0]
    assert sorted(p.name for p in out.iterdir()) == before


def test_dask_empty_address_is_refused(tmp_path, capsys):
    """`--dask ''` is one line naming --dask, not a silent local run."""
    from simulator.cli import main

    code = main(["sweep", "--out", str(tmp_path / "s"), "--seeds", "1", "--quiet",
                 "--dask", "", *(x for s in SMALL for x in ("--set", s))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dask = ''" in err[0]
    assert not (tmp_path / "s").exists()


def test_a_value_given_twice_fails_the_plan(tmp_path, capsys):
    """A grid value that repeats another of its axis (as text, or as the same scenario) is
    one line naming the key and the value, before anything is written."""
    with pytest.raises(ScenarioError, match=r"--grid run\.threads = '2': repeats '2'"):
        plan_sweep(None, SMALL, [Axis("run.threads", ("2", "2"))])
    with pytest.raises(ScenarioError, match=r"--grid run\.lr = '0\.50': repeats '0\.5'"):
        plan_sweep(None, SMALL, [*THREADS, Axis("run.lr", ("0.5", "0.50"))])
    from simulator.cli import main

    code = main(["sweep", "--out", str(tmp_path / "s"), "--grid", "run.threads=2,2",
                 "--quiet", *(x for s in SMALL for x in ("--set", s))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "run.threads = '2'" in err[0]
    assert not (tmp_path / "s").exists()


def test_dask_scheduler_gives_the_same_table_and_figure(tmp_path):
    """`--dask ADDRESS` runs the cells on a real Dask scheduler (an in-process one here)."""
    distributed = pytest.importorskip("distributed")
    from simulator.cli import main

    grid = ["--grid", "run.protocol=lockfree,minibatch", "--seeds", "2",
            "--set", "run.updates=150", "--quiet"]
    assert main(["sweep", "--out", str(tmp_path / "local"), "--jobs", "1", *grid]) == 0
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        assert main(["sweep", "--out", str(tmp_path / "dask"), "--dask",
                     cluster.scheduler_address, *grid]) == 0
    local, dask = tmp_path / "local", tmp_path / "dask"
    assert (local / "sweep.csv").read_bytes() == (dask / "sweep.csv").read_bytes()
    assert (dask / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dask_bad_address_is_one_line(tmp_path, capsys):
    pytest.importorskip("distributed")
    from simulator.cli import main

    code = main(["sweep", "--out", str(tmp_path / "s"), "--seeds", "1", "--quiet",
                 "--dask", "tcp://127.0.0.1:9"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dask = 'tcp://127.0.0.1:9'" in err[0]


def test_sweep_figure_has_a_line_per_protocol_and_thread_count(tmp_path):
    cells = plan_sweep(None, ["run.updates=120", "metrics.curve_points=10"],
                       [Axis("run.protocol", ("lockfree", "roundrobin")),
                        Axis("run.threads", ("2", "4")), Axis("run.seed", ("0", "1"))])
    run_sweep(cells, [Axis("run.protocol", ("lockfree", "roundrobin")),
                      Axis("run.threads", ("2", "4")), Axis("run.seed", ("0", "1"))],
              tmp_path)
    from simulator.plots import sweep_figure
    from simulator.sweep import _curve

    groups: dict = {}
    for cell in cells:
        groups.setdefault(cell.values[:2], []).append(_curve(tmp_path / "cells" / cell.name))
    fig = sweep_figure(groups, ["run.protocol", "run.threads"])
    axes = fig.axes
    assert len(axes) == 4  # (time, gradients) × (threads 2, threads 4)
    assert all(len(ax.get_lines()) == 2 for ax in axes)  # one per protocol
    # The gradients axis ends at the run's 120 gradients for every line.
    bottom = [line for ax in axes[2:] for line in ax.get_lines()]
    assert [line.get_xdata()[-1] for line in bottom] == [120] * 4
    assert (tmp_path / "sweep.png").is_file()
