"""Workflows over loads: the dry run, the comparison of policies, the isolated load and the scan
of a folder.
"""
