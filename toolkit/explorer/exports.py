"""Exporting a load's collision report, all of it (the Export tab) or the rows the Decisions tab
shows, as CSV or an Excel workbook.

File names are sanitised from the (maybe untrusted) program and policy names; relative paths are
taken from the state's ``export_dir``; nothing is overwritten unless asked.  A mixin of
:class:`toolkit.explorer.state.ExplorerState`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd

from toolkit.core.errors import ToolkitError
from toolkit.explorer.loading import DRY_RUN_REASON
from toolkit.explorer.text import plural

EXPORT_SUFFIX = "-collisions.csv"
EXPORT_SCOPES = ("export", "rows")  # errors of the Export tab's report and of the Decisions tab's rows
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_file_name(text: str, *, fallback: str = "program", max_len: int = 80) -> str:
    """``text`` as a plain file name: letters, digits, ``.``, ``_`` and ``-`` only (every other
    run of characters, path separators included, becomes ``_``), no leading dot or dash,
    at most ``max_len`` characters; ``fallback`` when nothing is left."""
    name = re.sub(r"\.{2,}", ".", _UNSAFE.sub("_", str(text))).strip("._-")
    name = name[:max_len].rstrip("._-")
    return name or fallback


class ExportMixin:
    """The state's exports; each outcome in its traits, or an error of its scope (:data:`EXPORT_SCOPES`)."""

    def default_export_name(self) -> str:
        """A plain file name for the report of the current load: program and policy names
        sanitised (:func:`safe_file_name`), never a path."""
        if self.session is None:
            return "collision_report.csv"
        dry = "-dry-run" if self.is_dry_run else ""
        return (
            f"{safe_file_name(self.program_label)}-{safe_file_name(self.session.policy.name.value)}{dry}{EXPORT_SUFFIX}"
        )

    def default_export_path(self, name: str | None = None) -> str:
        """Where the report goes when no path is given: :meth:`default_export_name` (or ``name``) in
        :attr:`export_dir`, numbered (``-2``, ``-3`` ...) past files that already exist."""
        first = self.export_dir / (name or self.default_export_name())
        if not first.exists():
            return str(first)
        suffix = first.suffix
        stem = first.name[: -len(suffix)] if suffix else first.name
        for i in range(2, 10_000):
            candidate = self.export_dir / f"{stem}-{i}{suffix}"
            if not candidate.exists():
                return str(candidate)
        raise ToolkitError(f"{self.export_dir}: too many reports named {stem}-N{suffix}")

    def export_rows(self, path: str | Path | None = None, *, overwrite: bool = False, excel: bool = False) -> bool:
        """Write the collision report's rows of the decisions the Decisions tab shows (:attr:`rows`:
        after its filters, in its order) as CSV, or as an Excel workbook with ``excel`` (one sheet,
        :func:`toolkit.reports.collision.write_xlsx`), through the report's writers (text cells neutralised);
        default name ``<program>-<policy>-decisions[-filtered].csv`` (``.xlsx``).  The outcome is in
        :attr:`rows_exported` and :attr:`rows_export_file`, or :attr:`error` (scope ``"rows"``)."""
        self.clear_error()
        if self.report is None:
            return self.fail("nothing to export", ToolkitError("load a program first"), scope="rows")
        keys = pd.DataFrame({"method": self.rows["method"].tolist(), "name": self.rows["name"].tolist()})
        frame = keys.merge(self.report.frame, on=["method", "name"], how="inner", validate="one_to_many")
        name = self.default_export_name().replace(
            EXPORT_SUFFIX, "-decisions" + ("-filtered" if self.filtered else "") + (".xlsx" if excel else ".csv")
        )
        target = self._write(
            path, overwrite, frame, self.default_export_path(name) if not path else None, "rows", excel=excel
        )
        if target is None:
            return False
        with self.hold_trait_notifications():
            self.rows_export_file = target
            self.rows_exported = f"wrote {plural(len(frame), 'row')} to {target}"
        return True

    def export_csv(self, path: str | Path | None = None, *, overwrite: bool = False) -> bool:
        """Write the collision report of the current load; False (and :attr:`error`) on failure.

        ``path``: a file name or path (relative ones are taken from :attr:`export_dir`); none:
        :meth:`default_export_path`.  An existing file is replaced only with ``overwrite``.
        The outcome, with the absolute path written, is in :attr:`export_message`."""
        self.clear_error()
        if self.report is None:
            return self.fail("nothing to export", ToolkitError("load a program first"), scope="export")
        target = self._write(path, overwrite, self.report.frame, None, "export")
        if target is None:
            return False
        dry = f" (a dry run: predicted decisions, verification {DRY_RUN_REASON!r})" if self.is_dry_run else ""
        with self.hold_trait_notifications():
            self.exported, self.export_ok = target, True
            self.export_message = f"wrote {len(self.report.frame)} rows to {target}{dry}"
        return True

    def _write(
        self,
        path: str | Path | None,
        overwrite: bool,
        frame: pd.DataFrame,
        default: str | None,
        scope: str,
        *,
        excel: bool = False,
    ) -> Path | None:
        """Write report rows to ``path`` (relative: in :attr:`export_dir`; none: ``default`` or
        :meth:`default_export_path`), as CSV or (``excel``) a workbook; the absolute path written,
        None (and :attr:`error`) on failure."""
        from toolkit.reports.collision import write_csv, write_xlsx

        try:
            target = Path(path).expanduser() if path not in (None, "") else Path(default or self.default_export_path())
            if not target.is_absolute():
                target = self.export_dir / target
            target = Path(os.path.abspath(target))
        except Exception as e:  # noqa: BLE001
            self.fail("could not choose the file", e, scope=scope)
            return None
        try:
            if target.is_dir():
                raise ToolkitError(f"{str(target)!r} is a folder: give a file name")
            if not target.parent.is_dir():
                raise ToolkitError(f"folder {str(target.parent)!r} does not exist")
            if target.exists() and not overwrite:
                raise ToolkitError(f"{str(target)!r} already exists: choose another name, or allow overwriting")
            # written atomically, never through a symbolic link, and without ``overwrite`` never over a
            # file that appeared since the check above
            (write_xlsx if excel else write_csv)(frame, target, overwrite=overwrite)
        except Exception as e:  # noqa: BLE001
            self.fail(f"could not write {str(target)!r}", e, scope=scope)
            return None
        return target
