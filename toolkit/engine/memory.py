"""Device memory during a load: bytes in use sampled around each method, and the peak while it loads.

The runtime measures what it can (``Runtime.bytes_in_use``: cudaMemGetInfo for AOTInductor);
where it measures nothing (the dry run, the CPU) the loader's own accounting stands in: the
constant bytes its loaded methods hold, plus those of the method being loaded.
"""

from __future__ import annotations

from toolkit.core import events as ev
from toolkit.runtimes import Device, Runtime


class MemoryGauge:
    """The bytes a load holds (``held``, kept by the loader as methods come and go) and the peak of one method's load.

    Samples are recorded in the log given with each call: a load's log can be replaced before it loads."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.held = 0  # sum of device_bytes over the loaded methods
        self.peak = 0  # highest bytes in use seen during the method being loaded

    def sample(self, log: ev.EventLog, method: str, device: Device, phase: str, pending_bytes: int = 0) -> bool:
        """Record the bytes in use on ``device``; True when the runtime measured them (not the accounting).

        ``pending_bytes``: what the method being loaded holds so far (it is not among the loaded ones yet)."""
        measured = self.runtime.bytes_in_use(device, sync=True)
        used, measure = (
            measured if measured is not None else (self.held + pending_bytes, "constant bytes held by the loader")
        )
        self.peak = max(self.peak, used)
        log.record(ev.MemorySampled, method, device=str(device), phase=phase, bytes_in_use=used, measure=measure)
        return measured is not None

    def probe(self, log: ev.EventLog, device: Device, pending_bytes: int) -> None:
        """Note bytes in use after a step that allocates (a blob, one constant, the pairs).

        Read after each such step rather than from a sampling thread: AOTI's blob upload
        holds the GIL, so a Python thread could not sample inside it anyway.  No sync is
        needed: allocations are visible to cudaMemGetInfo when they return.
        """
        if log.enabled:
            measured = self.runtime.bytes_in_use(device, sync=False)
            self.peak = max(self.peak, measured[0] if measured is not None else self.held + pending_bytes)

    def record_peak(self, log: ev.EventLog, method: str, device: Device, measured: bool) -> None:
        """Record the peak of the method just loaded (``measured``: whether its samples were)."""
        log.record(
            ev.MemorySampled,
            method,
            device=str(device),
            phase="peak",
            bytes_in_use=self.peak,
            measure="max of cudaMemGetInfo after each allocating step"
            if measured
            else "max of constant bytes held by the loader",
        )
