"""JUnit XML read from verdicts, so that a CI shows each method as a test case.

A ``<testsuite>`` per program and policy, a ``<testcase>`` per method (``classname`` the program
and policy); a method that runs wrong, is not runnable, failed or was refused is a ``<failure>``
whose message names the constants it runs on other data for; a method without a reference is
``<skipped>``, and so is each thing the verdict could not check (a case named ``not checked: <subject>``,
the reason and how to check it in its message); a program that cannot be read is an ``<error>``.

Names, paths and errors may hold what XML 1.0 cannot (controls, U+FFFE, lone surrogates) or what
nobody can see (a newline, a zero-width space): names are written as
:func:`~toolkit.display.cells.escape_text` shows them (look-alikes spelled out), messages one line
each (:func:`~toolkit.display.cells.one_line`), so the file stays well-formed whatever a name holds.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from typing import Mapping, Sequence

from toolkit.core.verdict import BAD_OUTCOMES, Verdict
from toolkit.core.vocab import UNREADABLE, BlindSpot, MethodOutcome
from toolkit.display.cells import escape_text, lookalikes, one_line
from toolkit.reports.summary import failure_message, labelled


def junit_xml(
    verdicts: Sequence[Verdict],
    *,
    labels: Sequence[str] | None = None,
    unreadable: Mapping[str, str] | None = None,
    name: str = "constshare",
) -> str:
    """JUnit XML (the ``testsuites/testsuite/testcase`` shape CI systems read): see the module
    docstring; ``labels`` as :func:`~toolkit.reports.html.html_report`'s; ``unreadable``: path -> error."""
    unreadable = dict(unreadable or {})
    pairs = labelled(verdicts, labels)
    looks = lookalikes([*unreadable, *(x for label, v in pairs for x in (label, *(m.method for m in v.methods)))])

    def shown(text: str) -> str:
        return escape_text(text, spell_out=text in looks)

    root = ET.Element("testsuites", name=one_line(name))
    totals = Counter()
    for path, error in unreadable.items():
        path, error = shown(path), one_line(error)
        suite = ET.SubElement(root, "testsuite", name=path, tests="1", failures="0", errors="1", skipped="0")
        case = ET.SubElement(suite, "testcase", name="open", classname=path)
        ET.SubElement(case, "error", message=f"cannot be read: {error}", type=UNREADABLE).text = error
        totals.update(tests=1, errors=1)
    for label, v in pairs:
        suite_name = f"{shown(label)} under {one_line(v.policy)}"
        suite = ET.SubElement(root, "testsuite", name=suite_name)
        counts = Counter(tests=len(v.methods))
        for m in v.methods:
            case = ET.SubElement(suite, "testcase", name=shown(m.method), classname=suite_name)
            if m.outcome in BAD_OUTCOMES:
                message = one_line(failure_message(v, m.method))
                ET.SubElement(case, "failure", message=message, type=m.outcome.value).text = message
                counts.update(failures=1)
            elif m.outcome is MethodOutcome.NO_REFERENCE:
                reason = f"no reference: {one_line(m.reason)}" if m.reason else "no reference"
                ET.SubElement(case, "skipped", message=reason)
                counts.update(skipped=1)
        for n in v.not_checked:
            if n.gap is BlindSpot.NO_REFERENCE:
                continue  # the method's own case is skipped already, with this reason
            case = ET.SubElement(suite, "testcase", name=f"not checked: {shown(n.subject)}", classname=suite_name)
            ET.SubElement(
                case, "skipped", message=one_line(f"{n.gap.value}: {n.reason}" + (f"; how: {n.how}" if n.how else ""))
            )
            counts.update(tests=1, skipped=1)
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
        totals.update(counts)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals[key]))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
