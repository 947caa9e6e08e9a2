"""ExecuTorch programs of the CUDA backend: a ``.pte`` and the ``.ptd`` beside it, as the program model.

Our own bounds-checked FlatBuffer reader reads the files' layout (:mod:`.layout`; ExecuTorch's
own reader, the optional extra, as a cross-check: :mod:`.upstream_reader`); every malformed byte
is a :class:`~toolkit.core.errors.ProgramError` naming the file, field and offset.  Methods are
the execution plans with one CUDA delegate (:mod:`.methods`), whose payload (:mod:`.payload`)
says where its ``.so`` and weights lie; its constants come from a per-FQN manifest
(:mod:`.fqn_constants`) or a constant table over a dense blob (:mod:`.constant_table`).
:func:`open_pte` puts it together (:mod:`.program`).  The payload generations, how each field of
the model is filled, and why our own reader: ``docs/upstream.md``.
"""

from toolkit.sources.executorch.constant_table import AotiConstant
from toolkit.sources.executorch.fqn_constants import aoti_internal_names
from toolkit.sources.executorch.layout import PTE_IDENTIFIER
from toolkit.sources.executorch.methods import PteLocation
from toolkit.sources.executorch.program import open_pte

__all__ = ["PTE_IDENTIFIER", "AotiConstant", "PteLocation", "aoti_internal_names", "open_pte"]
