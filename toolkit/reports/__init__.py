"""Reports read from a verdict: the collision report (CSV, Excel), the HTML report page, JUnit XML,
the summary frames they show, and the checked, atomic writing of their files."""
