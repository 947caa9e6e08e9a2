"""One load: the orchestrator (loader), the session users hold, the frames built from its events,
verification against references, blame, and the inputs the oracle generates.
"""
