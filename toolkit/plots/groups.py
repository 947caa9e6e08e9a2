"""How a matrix of many names groups them: by layer (``model.layers.3``), else by what they are a
layer of (``model.layers.<i>``), so a long matrix reads as one block per group.

Both collision matrices use it: the interactive one groups its columns, the long ones (a row per
name) put a header row above each group.
"""

from __future__ import annotations

import re
from typing import Sequence

from toolkit.plots.figure import short_key

GROUP_COLUMNS = 24  # a matrix of more names than this is grouped by layer
_LAYER = re.compile(r"^(.*?[._]\d+)[._](.+)$")  # the name up to its first index ("model.layers.3"), the rest


def layer_groups(keys: Sequence[str]) -> tuple[list[int], list[str], list[str]] | None:
    """Matrix columns grouped by layer: (the column order, contiguous by group in order of first
    appearance; each column's group; each column's label within it), from each name up to its
    first numeric part (``model.layers.3`` of ``model.layers.3.mlp.up.weight``, label
    ``mlp.up.weight``); names without one are grouped as "other".  None when grouping would not
    help (fewer than 2 groups, or nearly one name per group)."""
    parts = [(m.group(1), m.group(2)) if (m := _LAYER.match(k)) else ("other", k) for k in keys]
    first: dict[str, int] = {}
    for g, _leaf in parts:
        first.setdefault(g, len(first))
    if not 2 <= len(first) <= len(keys) / 2:
        return None
    order = sorted(range(len(keys)), key=lambda j: first[parts[j][0]])
    return order, [parts[j][0] for j in order], [parts[j][1] for j in order]


_FIRST_INDEX = re.compile(r"^(\D*?)(\d+)(.*)$")  # a name's text before its first number, the number, the rest


def stem_groups(keys: Sequence[str]) -> tuple[list[int], list[str], list[str]] | None:
    """Matrix names grouped by what they are a layer of, every layer together: the group the name
    with its first number as ``<i>`` up to it (``model.layers.<i>`` of ``model.layers.3.mlp.weight``,
    ``_tensor_constant<i>`` of ``_tensor_constant7``), the label the name from that number on
    (``3.mlp.weight``; a name ending in its number keeps its whole name); names without a number
    are "other".  The same shape as :func:`layer_groups`; None when fewer than 2 groups."""
    parts = []
    for k in keys:
        m = _FIRST_INDEX.match(k)
        if m is None:
            parts.append(("other", k))
        else:
            head, number, rest = m.groups()
            parts.append((f"{head}<i>", f"{number}{rest}" if rest else k))
    first: dict[str, int] = {}
    for g, _leaf in parts:
        first.setdefault(g, len(first))
    if len(first) < 2:
        return None
    order = sorted(range(len(keys)), key=lambda j: first[parts[j][0]])
    return order, [parts[j][0] for j in order], [parts[j][1] for j in order]


def matrix_groups(keys: Sequence[str]) -> tuple[list[int], list[str], list[str]] | None:
    """How a long matrix groups its names: by layer (:func:`layer_groups`) where that helps, else by
    the layers' stem (:func:`stem_groups`), else None."""
    return layer_groups(keys) or stem_groups(keys)


def long_rows(keys: Sequence[str]) -> list[tuple[str, int | None]]:
    """The rows of a long matrix (a row per name): per group (:func:`matrix_groups`) a header row
    ``(group, None)``, then its names ``(label, index of the name in keys)``, the label what follows
    the group (never cut: a name is shortened only past 48 characters, from its start)."""
    grouped = matrix_groups(keys)
    if grouped is None:
        return [(short_key(k), j) for j, k in enumerate(keys)]
    order, groups, leaves = grouped
    rows: list[tuple[str, int | None]] = []
    for g in dict.fromkeys(groups):
        rows.append((g, None))
        rows += [(short_key(leaf), order[i]) for i, (gg, leaf) in enumerate(zip(groups, leaves)) if gg == g]
    return rows
