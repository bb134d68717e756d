"""The one report printer: fidelity records as fixed-width tables, and a calibration's fit
report as the comments of the calibrated scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.fidelity.convoys import forms_convoys
from simulator.fidelity.rhythm import RHYTHM_HIGH, RHYTHM_NOTE
from simulator.rundir import latency_line, placement
from simulator.scenario import Scenario


def cell(value: Any, spec: str = ".4g") -> str:
    """One value of a record as a table shows it: ``—`` for none, yes / no, 4 significant
    digits (a list: its values to 3, joined by ``/``)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return "/".join(cell(v, ".3g") for v in value)
    return value if isinstance(value, str) else format(value, spec)


def records_table(rows: list[dict[str, Any]],
                  columns: list[tuple[str, Callable[[dict[str, Any]], str]]]) -> str:
    """Records as a fixed-width text table: one line per record, ``columns`` the header and
    how each record's cell is written."""
    body = [tuple(header for header, _ in columns)]
    body += [tuple(write(row) for _, write in columns) for row in rows]
    widths = [max(len(line[i]) for line in body) for i in range(len(columns))]
    return "\n".join("  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True))
                     .rstrip() for line in body)


def _gap(row: dict[str, Any]) -> str:
    return cell(row["gap"]) + (f" ({row['measure']})" if row["measure"] else "")


def _limit(row: dict[str, Any]) -> str:
    target = row["target"]
    return f"{1 / target:g}–{target:g}" if row["measure"] == "ratio B/A" else f"≤ {target:g}"


_SIDES: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("metric", lambda r: r["metric"]), ("run A", lambda r: cell(r["a"])),
    ("run B", lambda r: cell(r["b"])), ("gap", _gap)]


def targets_table(rows: list[dict[str, Any]]) -> str:
    """``targets`` as a table: metric, run A, run B, gap, target, met."""
    return records_table(rows, [*_SIDES, ("target", _limit), ("met", lambda r: cell(r["met"]))])


def details_table(rows: list[dict[str, Any]]) -> str:
    """``details`` as a table: metric, run A, run B, gap, note."""
    return records_table(rows, [*_SIDES, ("note", lambda r: r["note"])])


def compare_text(report: dict[str, Any]) -> str:
    """A comparison as ``compare`` prints it: the two runs, the targets, the details."""
    return "\n".join((f"A: {report['a']['label']}", f"B: {report['b']['label']}",
                      targets_table(report["targets"]), "details:",
                      details_table(report["details"])))


MARKER = "# asyngrad-lab calibrated scenario"


def calibrated_toml(scenario: Scenario, report: dict[str, Any]) -> str:
    """The calibrated scenario as TOML, the fit report in comments above it."""
    from simulator.scenario import scenario_to_toml

    lines = [MARKER, f"# fitted from {report['run']} ({report['source']} run; "
             f"{report['rows_fitted']} of {report['rows']} updates, those made while every "
             "worker was running)"]
    lines += [f"#   {worker} {op}: {text}" for worker, fits in report["fits"].items()
              for op, text in fits.items()]
    if "time_slice" in report:
        lines.append(f"#   time slice: {report['time_slice']}")
    if "migrate" in report:
        lines.append(f"#   load balancer: {report['migrate']}")
    lines += [f"#   contention, {phase}: {_describe_contention(fit)}"
              for phase, fit in report["contention"].items()]
    lines += [f"#   {what}: {text}" for what, text in _models(report)]
    lines += _placement_lines(report.get("cpu_latency", {}))
    body = scenario_to_toml(scenario).split("\n", 1)[1]  # its own header line replaced
    return "\n".join(lines) + "\n" + body


def _models(report: dict[str, Any]) -> list[tuple[str, str]]:
    """Each hardware model the report has: its name and one line on its fit."""
    found = [("write convoys", _describe_convoys(report["convoys"])),
             ("common factors", _describe_common(report["common"])),
             ("interference", _describe_interference(report["interference"]))]
    if "shared" in report:
        found.append(("lines another worker read last", _describe_shared(report["shared"])))
    if "stores" in report:
        found.append(("stores in a write's window", _describe_stores(report["stores"])))
    found.append(("rhythm", _describe_rhythm(report["rhythm"], report["common"])))
    if "speeds" in report:
        found.append(("core speeds", _describe_speeds(report["speeds"])))
    if "episodes" in report:
        found.append(("speed episodes", _describe_episodes(report["episodes"])))
    return found


def _describe_contention(fit: dict[str, Any] | None) -> str:
    """One line on a phase's contention: per thread (several worker counts) or the slope
    against the others in the same phase (one)."""
    if fit is not None and "per_thread" in fit:
        means = ", ".join(f"k = {k}: {m:.4g} ns" for k, m in fit["means_ns"].items())
        return (f"×(1 + {fit['per_thread']:.4g}·(k − 1)), alone {fit['alone_ns']:.4g} ns "
                f"(means {means})")
    if fit is None:
        return "no variation in concurrency"
    return (f"{fit['ns_per_concurrent']:.4g} ns per other worker in the same phase "
            f"(base {fit['base_ns']:.4g} ns, mean {fit['mean_concurrent']:.3g} others)")


def _placement_lines(latencies: dict[str, Any]) -> list[str]:
    """Where the host had each real run's CPUs, and a warning when the runs differ."""
    lines = [f"#   CPUs of {run}: {latency_line(latency)}: a prediction holds for runs whose "
             "CPUs are placed alike (dense shared writes take many times as long far apart)"
             for run, latency in latencies.items() if latency is not None]
    states = [placement(latency) for latency in latencies.values()]
    if len(set(states) - {None}) > 1:
        counts = ", ".join(f"{state} {states.count(state)}" for state in ("near", "far",
                                                                          "changing")
                           if state in states)
        lines.append(f"#   placements differ between the runs ({counts}): fitted together, "
                     "a rhythm or convoys that hold in one placement are averaged away; "
                     "fit runs of one placement")
    return lines


def _none_fitted(report: dict[str, Any]) -> str:
    """What a model's line says when nothing was fitted: why."""
    return f"none fitted ({report.get('why', '')})"


def _describe_episodes(report: dict[str, Any]) -> str:
    """One line on the cores' speed episodes."""
    if "factor" not in report:
        return f"none ({report['why']})"
    found = (f"slow level {report['factor']:.3g}× the fast one (D = {report['separation']:.3g}),"
             f" {report['slow_share']:.3g} of the updates slow; episodes fast "
             f"{report['fast_ns'] / 1e6:.3g} ms, slow {report['slow_ns'] / 1e6:.3g} ms on "
             f"average ({report['episodes_ended'][0]:.0f} and {report['episodes_ended'][1]:.0f} "
             + ("ended within the run)" if report["runs"] == 1 else
                "ended within the runs); slow share per run "
                + ", ".join(f"{v:.2g}" for v in report["slow_share_per_run"])))
    return found if report["fields"] else f"none fitted: {found}; {report['why']}"


def _describe_speeds(report: dict[str, Any]) -> str:
    if "speeds" not in report:
        return f"none ({report['why']})"
    speeds = ", ".join(f"{v:.3g}" for v in report["speeds"])
    return (f"{speeds} (worker r's median gradient against all workers'; the slowest "
            f"{report['spread']:.3g}× the fastest)" + (
                "; thread j simulated on core j mod cores at its speed" if report["kept"]
                else f"; not kept: {report['why']}"))


def _describe_rhythm(report: dict[str, dict[str, Any]], common: dict[str, Any]) -> str:
    found = {k: r for k, r in report.items() if r["coupling"] is not None}
    if not found:
        return "one worker at a time: nothing to say"
    parts = ", ".join(f"k = {k}: staleness {r['staleness']:.3g} = {r['coupling']:.3f} × the "
                      f"independent-phase value {r['independent_staleness']:.3g}"
                      for k, r in found.items())
    low = min(r["coupling"] for r in found.values())
    if low >= RHYTHM_NOTE:
        return f"{parts} (phases independent, as simulated)"
    if common.get("to_rhythm"):  # --common rhythm: fitted, or why not
        return (f"{parts}: the workers kept a common rhythm, " + (
            "modelled by the common factors above" if common["fields"] else
            f"no common factors fitted to it ({common['why']})"))
    expect = ("no update saw another's completion (a lock)" if low == 0 else
              f"expect simulated staleness up to {1 / low:.2f}× the real one")
    return (f"{parts}: the workers kept a common rhythm that the simulator's independent "
            f"draws lack, so {expect} (calibrate --common rhythm models it)")


def _describe_convoys(report: dict[str, Any]) -> str:
    fields = report.get("fields")
    if not fields:
        return _none_fitted(report)
    measured = (f"lost coordinates from {report['classified']} classified pairs"
                if report.get("classified") else "no classified pairs: nothing lost")
    if report.get("probes"):
        measured = f"from {report['classified']} meetings the runs' probes made"
    within = fields.get("convoy_lost_within", 0.0)
    falls = (f" (at lag 0, falling as exp(−f/{within:.3g}) with the share f the leader had "
             "swept)" if within else "")
    spread = fields.get("convoy_lost_spread", 0.0)
    unlike = (f", each meeting at its own rate (spread ρ = {spread:.3g})" if spread else "")
    losses = (f"{fields['convoy_lost_pairs']:.3g} of the pairs lose coordinates{falls}, shares "
              f"then: leader {fields['convoy_lost_leader']:.3g}, joiner "
              f"{fields['convoy_lost_joiner']:.3g}{unlike} ({measured})")
    gap = f"end gap {report['end_gap_over_start_gap']:.3g} × start gap"
    caught, hinge = fields.get("convoy_end_catch_up", 0.0), report.get("end_gap_hinge")
    catch_up = (f" beyond its first {caught:.4g} ns (the end gaps' error "
                f"{hinge['error'] / hinge['proportional_error']:.2f} of the proportional "
                "fit's)" if caught and hinge else "")
    if not forms_convoys(report):
        return (f"none: {report['pairs']} pairs of writes that met ended apart ({gap}), so "
                f"writes pass each other; {losses}")
    return (f"{report['pairs']} pairs of writes that met ended together ({gap}); joiner "
            f"ends after {fields['convoy_join']:.3g} × its write + "
            f"{fields['convoy_rest']:.3g} × the leader's rest (a write alone: "
            f"{report['alone_write_ns']:.4g} ns, "
            + ("in the probe" if report.get("probes") else "met writes censored at the meeting")
            + ") and "
            "trails the leader's end by "
            f"{fields['convoy_end_gap']:.3g} × its start lag{catch_up}; {losses}")


def _describe_common(report: dict[str, Any]) -> str:
    fields = report.get("fields")
    if not fields:
        return _none_fitted(report)
    if "goal" in report:
        last = min(report["steps"], key=lambda step: abs(step[1] - report["goal"]))
        bound = " (the largest tried)" if fields["read_common"] == RHYTHM_HIGH else ""
        return (f"fitted to the rhythm: c = {fields['read_common']:.4g}{bound} for every phase, "
                f"τ = {fields['common_ns']:.4g} ns (from the pair bins): simulated, staleness "
                f"{last[1]:.3f} × the independent-phase value at c = {last[0]:.4g}, the run's "
                f"{report['goal']:.3f} ({len(report['steps'])} simulations)")
    near = ", ".join(f"{phase} {bins['correlation'][0]:.2f} ({bins['pairs'][0]} pairs)"
                     for phase, bins in report["bins"].items())
    borrowed = (" (the others' mean: writes that met no other are the short ones)"
                if report.get("write_from_others") else "")
    weights = ", ".join(f"{phase} {fields[phase + '_common']:.3g}"
                        f"{borrowed if phase == 'write' else ''}"
                        for phase in ("read", "grad", "write", "idle"))
    return (f"c·exp(−Δt/τ) with τ = {fields['common_ns']:.4g} ns, c: {weights} (phases "
            f"starting under 250 ns apart alike by {near})")


def _describe_interference(report: dict[str, Any]) -> str:
    fields = report.get("fields")
    if not fields:
        return _none_fitted(report)
    parts = []
    for phase, fit in report["phases"].items():
        noise = fit.get("within_noise", [])
        slowed = ", ".join(f"{q} {value:.3g} ({fit['rows_under'][q]} rows"
                           f"{', within noise' if q in noise else ''})"
                           for q, value in fit["slowdown"].items())
        parts.append(f"{phase} under {slowed}")
    return ("slowdown per other worker in a phase, against "
            f"the others idle: {'; '.join(parts)}")


def _describe_stores(report: dict[str, Any]) -> str:
    if not report.get("fields"):
        return f"the whole window ({report.get('why', '')})"
    return (f"from {report['lead_ns']:.4g} ns after its start to {report['tail_ns']:.4g} ns "
            f"before its end (median write {report['write_median_ns']:.4g} ns), from "
            f"{report['rows']} reads under a write ({report['whole']:.2f} held all of it, "
            f"{report['none']:.2f} none): copied share off by {report['miss']:.3f} on average, "
            f"{report['miss_whole']:.3f} with the whole window")


def _describe_shared(report: dict[str, Any]) -> str:
    measured = ""
    if "factor" in report and "probes" in report:
        line = report.get("line_ns")
        measured = (f"from the runs' probes ({report['probes']}): such a write took "
                    f"{report['extra_ns']:.4g} ns more, on a median write of "
                    f"{report['median_write_ns']:.4g} ns"
                    + (f" (a cache line between the CPUs: {line:.0f} ns)" if line else ""))
    elif "factor" in report:
        measured = (f"{report['rows_shared']} writes on lines another worker read last, "
                    f"median {report['median_shared_ns']:.4g} ns, against "
                    f"{report['median_other_ns']:.4g} ns for the {report['rows_other']} others"
                    + (f" (their ratio {report['median_ratio']:.3g}; the factor is fitted "
                       "with the writes' slowdowns under the others' phases)"
                       if "median_ratio" in report else ""))
    if not report.get("fields"):
        return _none_fitted(report) + (f": {measured}" if measured else "")
    return f"write_shared {report['factor']:.3g}: {measured}"
