"""Where a model comes from: a factory in a Python file, or a saved `torch.export` program."""

from __future__ import annotations

from pathlib import Path

import torch

from tensorgen.errors import SpecError
from tensorgen.frontend.export import module_from_exported
from tensorgen.frontend.quantize import ModelAndInputs, load_factory


def load_model(spec: str, params: dict[str, int] | None = None) -> ModelAndInputs:
    """`file.py[:factory]` -> what the factory returns; `file.pt2` -> the exported float program
    as a module, with the example inputs it was exported with."""
    if spec.endswith(".pt2"):
        if params:
            raise SpecError(f"{spec}: --param applies to a factory, not to an exported program")
        return from_exported(spec)
    return load_factory(spec, params)


def from_exported(path: str | Path) -> ModelAndInputs:
    try:
        ep = torch.export.load(str(path))
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except Exception as err:  # torch raises many types for a file that is not an exported program
        raise SpecError(f"{path}: not a torch.export program ({type(err).__name__}: {str(err).splitlines()[0]})") \
            from None
    return exported_module(ep, str(path))


def exported_module(ep: torch.export.ExportedProgram, where: str = "exported program") -> ModelAndInputs:
    """The exported graph rebuilt as a module the quantization flow takes (see
    tensorgen/frontend/export.py), with its example inputs; refuses dynamic shapes."""
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and any(not isinstance(d, int) for d in val.shape):
            raise SpecError(f"{where}: input {node.name} has a dynamic shape {list(val.shape)}; "
                            "export with static shapes")
    args, kwargs = ep.example_inputs or ((), {})
    if kwargs:
        raise SpecError(f"{where}: keyword inputs are not supported")
    if not args:
        raise SpecError(f"{where}: the program carries no example inputs; export it with example inputs")
    try:
        module = module_from_exported(ep)
    except SpecError as err:
        raise SpecError(f"{where}: {err}", err.detail) from None
    return module, tuple(args)
