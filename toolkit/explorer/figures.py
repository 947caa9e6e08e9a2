"""The figures of the results on screen: a load's (collision matrix, timeline, memory), drawn as PNGs
once by the load, and a comparison's (policy trade-off, memory by policy).

A mixin of :class:`toolkit.explorer.state.ExplorerState`.  matplotlib is imported when a figure is drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolkit.core.verdict import Verdict
from toolkit.explorer.loading import DRAW_SPAN

if TYPE_CHECKING:
    from toolkit.engine.session import Session

SESSION_FIGURES = ("collision matrix", "timeline", "memory")  # a load's figures, drawn in this order


class FigureMixin:
    """The state's figures, and the PNGs the view shows."""

    @staticmethod
    def _figure(name: str, session: "Session", verdict: Verdict, label: str):
        """One of :data:`SESSION_FIGURES` of a load (matplotlib), its program called ``label``."""
        from toolkit import plots

        if name == "collision matrix":
            return plots.collision_matrix(session, wrong_methods=verdict.wrong_methods, name=label)
        if name == "timeline":
            return plots.event_timeline(session)
        return plots.memory_by_policy(session)

    def _draw(self, session: "Session", verdict: Verdict, label: str) -> dict[str, bytes]:
        """The PNGs of a load's figures, the bar moving over :data:`DRAW_SPAN` as each is drawn
        (a large program's take a while); {} when one cannot be drawn (the view says why)."""
        from toolkit.plots import figure_png

        pngs: dict[str, bytes] = {}
        try:
            for i, name in enumerate(SESSION_FIGURES):
                self._step(
                    "draw",
                    DRAW_SPAN[0] + (DRAW_SPAN[1] - DRAW_SPAN[0]) * i / len(SESSION_FIGURES),
                    f"drawing the {name} ({i + 1} of {len(SESSION_FIGURES)})",
                )
                pngs[name] = figure_png(self._figure(name, session, verdict, label))
        except Exception:  # noqa: BLE001 - drawn again by the view, which shows the error
            return {}
        return pngs

    def session_pngs(self) -> dict[str, bytes]:
        """The PNGs of :data:`SESSION_FIGURES` of the load on screen (drawn once, by the load)."""
        from toolkit.plots import figure_png

        if self.session is None:
            return {}
        held, pngs = self._pngs
        if held is not self.session or set(pngs) != set(SESSION_FIGURES):
            pngs = {name: figure_png(fig) for name, fig in self.figures(comparison=False).items()}
            self._pngs = (self.session, pngs)
        return pngs

    def figures(self, *, session: bool = True, comparison: bool = True) -> dict[str, Any]:
        """Matplotlib figures of the results on screen (of the load, of the comparison), by name."""
        from toolkit import plots

        figs: dict[str, Any] = {}
        if session and self.session is not None:
            for name in SESSION_FIGURES:
                figs[name] = self._figure(name, self.session, self.verdict, self.program_label)
        if comparison and self.comparison is not None and self.program is not None:
            floor = plots.minimum_device_bytes(self.program)
            label = self.program_label or self.program.name
            figs["policy trade-off"] = plots.policy_tradeoff(
                self.comparison, minimum=floor, title=f"{label}: correctness vs memory"
            )
            title = f"{label}: device memory per method and policy"
            figs["memory by policy"] = plots.memory_by_policy(self.comparison.memory(), minimum=floor, title=title)
        return figs
