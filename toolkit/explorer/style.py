"""The explorer's stylesheet: the grid's sticky header and bounded box, the selected row, the
banners and boxes, the verdict of a constant and the decision colours.

It travels in the view's title widget, so every class a panel uses is styled wherever the view is shown.
"""

from __future__ import annotations

from toolkit.display.palette import (
    CAUGHT_COLOUR,
    CULPRIT_STYLE,
    CULPRIT_TEXT,
    DECISION_COLOURS,
    ERROR_TEXT,
    NOT_RUN_COLOUR,
    OK_COLOUR,
    WARNING_TEXT,
    WRONG_COLOUR,
)
from toolkit.explorer.grid import GRID_HEIGHT

CSS = (
    """<style>
.constshare-explorer table { border-collapse: collapse; font-size: 12px; }
.constshare-explorer th, .constshare-explorer td { border: 1px solid #ccc; padding: 2px 6px; text-align: left;
  line-height: 1.4; }
.constshare-explorer th { background: #f3f3f3; }
.constshare-explorer .constshare-grid table.dataTable td, .constshare-explorer .constshare-grid table.dataTable th {
  border: none; border-bottom: 1px solid #e4e4e4; white-space: nowrap; text-align: left; }
.constshare-explorer .constshare-grid table.dataTable tbody tr { cursor: pointer; }
.constshare-explorer .constshare-grid table.dataTable > tbody > tr.selected > * {
  box-shadow: inset 0 0 0 9999px #e3edfb !important; color: #222 !important; }
.constshare-explorer .constshare-grid table.dataTable > tbody > tr.selected > td:first-child {
  box-shadow: inset 4px 0 0 #1a73e8, inset 0 0 0 9999px #e3edfb !important; }
.constshare-explorer .constshare-grid table.dataTable > tbody > tr.selected a { color: #0b3d91 !important; }
.constshare-explorer .cs-wrap { display: inline-block; white-space: normal; overflow-wrap: break-word;
  max-width: 30em; vertical-align: top; }
.constshare-explorer .cs-internal { display: block; color: #666; font-size: 11px; max-width: 26em; }
.constshare-explorer .constshare-grid table.dataTable thead th { white-space: normal; }
.constshare-explorer .constshare-grid .cs-tag.cs-wrap { display: inline-block; }
.constshare-explorer .cs-fqn { max-width: 30em; }
.constshare-explorer .constshare-grid { max-width: 100%; }
.constshare-explorer .constshare-grid .dt-layout-table > .dt-layout-cell {
  display: block; max-height: """
    + GRID_HEIGHT
    + """; overflow: auto; }
.constshare-explorer .constshare-grid table.dataTable thead th {
  position: sticky; top: 0; z-index: 1; background: #f3f3f3; }
.constshare-error { color: """
    + ERROR_TEXT
    + """; background: #fdecea; border: 1px solid #f5c2c0; padding: 4px 8px; }
.constshare-ok { color: #274e13; }
.constshare-stale-banner { color: """
    + WARNING_TEXT
    + """; background: #fff8e1; border: 1px solid #f1c232; padding: 4px 8px; }
.constshare-dry-banner { color: #0b3d91; background: #e8f0fe; border: 1px solid #8ab4f8; padding: 4px 8px; }
.constshare-stale { opacity: 0.45; filter: grayscale(60%); }
.constshare-verdict { padding: 4px 8px; margin: 4px 0; border-radius: 3px; overflow-wrap: anywhere; }
.constshare-explorer .constshare-detail-panel { overflow-x: auto; }
.constshare-verdict-culprit { """
    + CULPRIT_STYLE
    + """; }
.constshare-verdict-not-tested { background: """
    + WRONG_COLOUR
    + """; color: """
    + CULPRIT_TEXT
    + """; }
.constshare-verdict-harmless, .constshare-verdict-caught { background: """
    + CAUGHT_COLOUR
    + """; }
.constshare-verdict-same { background: """
    + OK_COLOUR
    + """; }
.constshare-verdict-none { background: """
    + NOT_RUN_COLOUR
    + """; }
.cs-tag { padding: 0 5px; border-radius: 3px; }
.cs-culprit { """
    + CULPRIT_STYLE
    + """; }
.cs-caught { background: """
    + CAUGHT_COLOUR
    + """; }
.cs-reason { border-bottom: 1px dotted #999; }
"""
    + "".join(f".cs-d-{d} {{ background: {c}; }}\n" for d, c in DECISION_COLOURS.items())
    + "</style>"
)
