"""Small helpers shared by the sample programs."""

import torch


def randn(*shape: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


class MatmulConstant(torch.nn.Module):
    """Multiplies by a plain tensor attribute: torch.export lifts it as a tensor constant,
    which AOTInductor names by position (``_tensor_constant0``)."""

    def __init__(self, table: torch.Tensor, head: torch.nn.Module | None = None):
        super().__init__()
        self.table = table  # not a parameter, not a buffer
        self.head = head

    def forward(self, x):
        y = x @ self.table
        return self.head(y) if self.head is not None else y


class ProjectionWithCache(torch.nn.Module):
    """A 16x16 projection and a 4x16 buffer ``kv`` that a method can write: the state samples' core."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(randn(16, 16, seed=1))
        self.register_buffer("kv", torch.zeros(4, 16))
