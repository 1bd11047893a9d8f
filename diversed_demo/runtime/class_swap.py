"""The one way this package changes how a module of someone else's model runs: in place, by its class.

A layer this package makes faster (a 4-bit, 8-bit or few-row product, a lean decoder layer) or that records
what vLLM does not hand out (a layer's hidden state) is a subclass of the module's own class, given the
few tensors it needs and then swapped in as that module's class. A module replaced through torch's
`set_submodule` would be a new object: the ties between parameters (the embedding and the LM head), the
hooks others registered on the old one (an EAGLE-3 draft's feature capture), and whatever holds a reference
to it would stay with the object no longer run. In place, all are kept, and `stock.stock_layers` swaps the
class back for comparisons. The tests that compare each swapped layer with the library's own
(tests/runtime, tests/vllm) fail when a library changes the class under it.
"""

from __future__ import annotations

import torch


def swap_class(module: torch.nn.Module, cls: type, **state) -> None:
    """Give `module` the tensors or values `state` names, then run it as `cls`: a subclass of its class, or
    the class it was swapped from (back to the library's own)."""
    if not (issubclass(cls, type(module)) or issubclass(type(module), cls)):
        raise TypeError(f"{cls.__name__} neither extends nor underlies {type(module).__name__}")
    for name, value in state.items():
        setattr(module, name, value)
    module.__class__ = cls
