"""Sample multi-method programs; each module states its expected outcome per policy."""
