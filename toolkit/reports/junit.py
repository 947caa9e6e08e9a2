"""JUnit XML read from verdicts, so that a CI shows each method as a test case.

A ``<testsuite>`` per program and policy, a ``<testcase>`` per method (``classname`` the program
and policy); a method that runs wrong, is not runnable, failed or was refused is a ``<failure>``
whose message names the constants it runs on other data for; a method without a reference is
``<skipped>``; a program that cannot be read is an ``<error>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from typing import Mapping, Sequence

from toolkit.core.verdict import BAD_OUTCOMES, Verdict
from toolkit.core.vocab import UNREADABLE, MethodOutcome
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
    root = ET.Element("testsuites", name=name)
    totals = Counter()
    for path, error in (unreadable or {}).items():
        suite = ET.SubElement(root, "testsuite", name=path, tests="1", failures="0", errors="1", skipped="0")
        case = ET.SubElement(suite, "testcase", name="open", classname=path)
        ET.SubElement(case, "error", message=f"cannot be read: {error}", type=UNREADABLE).text = error
        totals.update(tests=1, errors=1)
    for label, v in labelled(verdicts, labels):
        suite = ET.SubElement(root, "testsuite", name=f"{label} under {v.policy}")
        counts = Counter(tests=len(v.methods))
        for m in v.methods:
            case = ET.SubElement(suite, "testcase", name=m.method, classname=f"{label} under {v.policy}")
            if m.outcome in BAD_OUTCOMES:
                message = failure_message(v, m.method)
                ET.SubElement(case, "failure", message=message, type=m.outcome.value).text = message
                counts.update(failures=1)
            elif m.outcome is MethodOutcome.NO_REFERENCE:
                ET.SubElement(case, "skipped", message=f"no reference: {m.reason}" if m.reason else "no reference")
                counts.update(skipped=1)
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
        totals.update(counts)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals[key]))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
