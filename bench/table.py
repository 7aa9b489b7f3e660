"""Figures of the peer suite (bench/suite.py): samples per row, interleaved reps, tables, targets.

Every row of a scenario is measured once per rep, the rows in a fixed order inside the rep, so
a burst of load on the shared machine hits every row alike. A ratio is computed pair by pair
(rep i of raysaga with rep i of the peer) and printed as its median (min-max), like the figures.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """``median (min-max)``, or the one value when there is one."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(med(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def pair_ratios(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Rep i of ours over rep i of theirs, for every rep both have."""
    return [a / b for a, b in zip(ours, theirs, strict=False) if b]


class TimedOut(Exception):
    """A measurement that did not end within ``limit`` seconds (its process was killed)."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"did not finish within {limit:.0f}s")
        self.limit = limit


@dataclass
class Samples:
    """label -> one value per rep (seconds, or what the scenario says); rows that timed out."""

    values: dict[str, list[float]] = field(default_factory=dict)
    timed_out: dict[str, float] = field(default_factory=dict)  # label -> the limit it exceeded

    def add(self, label: str, value: float) -> None:
        self.values.setdefault(label, []).append(value)

    def __getitem__(self, label: str) -> list[float]:
        return self.values.get(label, [])

    def __contains__(self, label: str) -> bool:
        return bool(self.values.get(label))


Runner = Callable[[], float]


def interleave(rows: Sequence[tuple[str, Runner]], reps: int, samples: Samples,
               log: Callable[[str], None], what: str) -> None:
    """Each rep runs every row once, in order; a row that raises is reported and left out of that rep."""
    for rep in range(reps):
        log(f"{what}: rep {rep + 1}/{reps} (load {loadavg()})")
        for label, run in rows:
            if label in samples.timed_out:
                continue  # timed out in an earlier rep: not run again
            try:
                samples.add(label, run())
            except TimedOut as exc:
                samples.timed_out[label] = exc.limit
                log(f"{what}: {label} timed out in rep {rep + 1} ({exc}); left out of the later reps")
            except Exception as exc:  # a peer's failure must not hide the others' figures
                log(f"{what}: {label} failed in rep {rep + 1}: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Target:
    title: str
    ok: bool
    value: str


def ratio_target(title: str, ratios: Sequence[float], *, at_most: float | None = None,
                 at_least: float | None = None) -> Target | None:
    """PASS when the median of the pair-by-pair ratios is within the bound; None without figures."""
    if not ratios:
        return None
    m = med(ratios)
    ok = (at_most is None or m <= at_most) and (at_least is None or m >= at_least)
    return Target(title, ok, f"{spread(ratios, '{:.2f}')}x")


@dataclass
class Report:
    """The lines printed for one scenario, and its targets."""

    lines: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    def p(self, line: str = "") -> None:
        self.lines.append(line)

    def heading(self, title: str) -> None:
        self.p(f"== {title} ==")
        self.p(f"  ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {loadavg()})")

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int]) -> None:
        """First column left-aligned, the others right-aligned."""
        def fmt(cells: Sequence[str]) -> str:
            out = [f"{cells[0]:<{widths[0]}}"]
            out += [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=False)]
            return "  " + "  ".join(out).rstrip()
        self.p(fmt(header))
        for row in rows:
            self.p(fmt(row))

    def target(self, t: Target | None) -> None:
        if t is not None:
            self.targets.append(t)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def target_lines(targets: Sequence[Target]) -> list[str]:
    return [f"  {'PASS' if t.ok else 'MISS'}  {t.title}: {t.value}" for t in targets]
