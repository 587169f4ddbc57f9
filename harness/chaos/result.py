"""One row of the chaos table per scenario (what it sent, failed, lost, and its recovery against its bound), and
the table. ``Result.problems`` lists every broken promise (empty when the scenario held), so the test asserts
``problems == []`` and shows what it saw."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Result:
    """One row of the chaos table."""

    scenario: str
    sent: int = 0
    failed: int = 0
    lost: int = 0
    recovery_s: float | None = None  # what "recovery" means is in ``recovery_what``
    bound_s: float | None = None
    recovery_what: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def check(self, cond: bool, problem: str) -> None:
        if not cond:
            self.problems.append(problem)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def fmt_table(results: list[Result]) -> str:
    head = ("scenario", "sent", "failed", "lost", "recovery", "bound", "ok")
    rows = [head]
    for x in results:
        rec = "-" if x.recovery_s is None else f"{x.recovery_s:.3f} s"
        bound = "-" if x.bound_s is None else f"{x.bound_s:g} s"
        rows.append((x.scenario, str(x.sent), str(x.failed), str(x.lost), rec, bound, "yes" if x.ok else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for x in results:
        for p in x.problems:
            lines.append(f"! {x.scenario}: {p}")
    return "\n".join(lines)
