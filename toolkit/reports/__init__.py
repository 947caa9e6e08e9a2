"""Reports read from a verdict: the collision report's CSV and Excel, the HTML report and JUnit XML."""
