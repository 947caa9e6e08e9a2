"""The explorer's device choice: the devices it accepts, whether this machine has CUDA, the device menu.

A CUDA device is offered on every machine: a dry run predicts a CUDA load without one.  Callers
ask :func:`cuda_available` through this module, so a test can stand in for the machine.
"""

from __future__ import annotations

import re

DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")
NO_CUDA = "this machine has no CUDA device: choose device cpu, or tick “dry run” to predict the load"


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (torch is imported on first use)."""
    import torch

    return torch.cuda.is_available()


def device_options(current: str) -> list[tuple[str, str]]:
    """The device menu: cpu and cuda always (a dry run predicts a CUDA load on any machine), the
    current choice too; cuda says so when this machine has none."""
    cuda = "cuda" if cuda_available() else "cuda (none here: dry run only)"
    return [("cpu", "cpu"), (cuda, "cuda")] + ([(current, current)] if current not in ("cpu", "cuda") else [])
