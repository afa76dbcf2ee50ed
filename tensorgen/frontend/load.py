"""Where a model comes from: a factory in a Python file, or a saved `torch.export` program.

A factory file is trusted Python (it is imported and run, like any model code). A `.pt2` file
is data and is never allowed to run code. torch 2.13's `torch.export.load` does not promise
that: it unpickles weights and constants marked `use_pickle` (`torch.load(weights_only=False)`),
custom and opaque objects (`pickle.loads`), falls back to the unsafe unpickler for example
inputs the weights-only one refuses, loads AOTInductor shared libraries, evaluates symbolic
shape expressions with `sympy.sympify` (Python `eval`) and turns `guards_code` into Python
with `exec`. So `load_exported` first reads the archive with the same reader torch uses and
accepts only what `torch.export.save` writes for a static-shape program -- the program's JSON,
weights and constants as raw tensor bytes, example inputs that PyTorch's weights-only
unpickler loads -- and refuses anything else with one line. Only then does it call torch's
archive loader (`load_pt2`, which is `torch.export.load` without its legacy-format fallback),
on the same bytes, where every path left is the weights-only one.
"""

from __future__ import annotations

import io
import json
import logging
import re
from contextlib import contextmanager
from pathlib import Path

import torch

from tensorgen.errors import SpecError
from tensorgen.frontend.export import module_from_exported
from tensorgen.frontend.quantize import ModelAndInputs, load_factory, quiet_torch_warnings
from tensorgen.inputs import LIMITS, one_line, read_bytes

MODEL = "model"  # torch.export.save names its one program so
_RECORDS = re.compile(  # every record torch.export.save writes for a program without AOTInductor code
    r"archive_format|archive_version|byteorder|\.data/\w+|\.\w+|extra/[\w.-]+|models/model\.json"
    r"|data/weights/model_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/model_constants_config\.json|data/constants/tensor_\d+|data/sample_inputs/model\.pt"
)
WHAT_A_PT2_MAY_HOLD = (
    "tensorgen loads a .pt2 that torch.export.save wrote for a program with static shapes: "
    "its graph, weights and constants as plain tensors and example inputs; never pickled "
    "objects, compiled code or symbolic shapes"
)


def load_model(spec: str, params: dict[str, int] | None = None) -> ModelAndInputs:
    """`file.py[:factory]` -> what the factory returns; `file.pt2` -> the exported float program
    as a module, with the example inputs it was exported with. PyTorch's warnings are silenced
    (they would precede a refusal's one line)."""
    with quiet_torch_warnings():
        if spec.endswith(".pt2"):
            if params:
                raise SpecError(f"{spec}: --param applies to a factory, not to an exported program")
            return from_exported(spec)
        return load_factory(spec, params)


def from_exported(path: str | Path) -> ModelAndInputs:
    data = read_bytes(path, "a torch.export program (.pt2)", SpecError)
    return exported_module(load_exported(data, str(path)), str(path))


def load_exported(data: bytes, where: str) -> torch.export.ExportedProgram:
    """The exported program in the .pt2 archive `data`, loaded without running any code from it
    (see the module docstring); SpecError naming `where` for anything else."""
    # a PT2E-quantized program holds quantized_decomposed ops: registering them runs no file code
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    from torch.export.pt2_archive._package import PT2ArchiveReader, load_pt2

    with quiet_torch_warnings(), _quiet_torch_logs():
        try:
            reader = PT2ArchiveReader(io.BytesIO(data))
        except Exception as err:  # torch raises many types for a file that is not a PT2 archive
            raise SpecError(f"{where}: not a torch.export program ({_brief(err)})") from None
        _check_archive(reader, where)
        try:
            return load_pt2(io.BytesIO(data)).exported_programs[MODEL]
        except Exception as err:  # a malformed program that passed the checks above
            raise SpecError(f"{where}: not a torch.export program ({_brief(err)})") from None


def _check_archive(reader, where: str) -> None:
    names = list(reader.get_file_names())
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: the archive names a record twice; {WHAT_A_PT2_MAY_HOLD}")
    for name in names:
        if not _RECORDS.fullmatch(name):
            raise SpecError(
                f"{where}: unexpected record {one_line(name, 80)!r}; {WHAT_A_PT2_MAY_HOLD}"
            )
    if f"models/{MODEL}.json" not in names:
        raise SpecError(f"{where}: the archive holds no exported program ({WHAT_A_PT2_MAY_HOLD})")
    total = sum(reader.archive_file.get_record_size(n) for n in names)
    if total > LIMITS.binary_bytes:
        raise SpecError(
            f"{where}: the archive unpacks to {total:,} bytes, over the limit of "
            f"{LIMITS.binary_bytes:,} bytes (InputLimits)"
        )
    try:
        for config, prefix in (
            ("data/weights/model_weights_config.json", "weight_"),
            ("data/constants/model_constants_config.json", "tensor_"),
        ):
            _check_payloads(json.loads(reader.read_string(config)), prefix, where)
        program = json.loads(reader.read_string(f"models/{MODEL}.json"))
        samples = reader.read_bytes(f"data/sample_inputs/{MODEL}.pt")
    except SpecError:
        raise
    except Exception as err:  # a missing record, bad JSON, nesting too deep, not UTF-8
        raise SpecError(f"{where}: not a torch.export program ({_brief(err)})") from None
    _check_static(program, where)
    try:
        if samples:  # (none: exported_module says the program carries no example inputs)
            torch.load(io.BytesIO(samples), weights_only=True)
    except Exception as err:  # torch.export.load would retry with the unsafe unpickler
        raise SpecError(
            f"{where}: its example inputs are not plain tensors (the weights-only unpickler "
            f"refuses them: {_brief(err)}); {WHAT_A_PT2_MAY_HOLD}"
        ) from None


def _check_payloads(config: object, prefix: str, where: str) -> None:
    """Weights or constants: raw tensor bytes only, none pickled, no custom or opaque object."""
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise SpecError(f"{where}: not a torch.export program (a payload table is not a mapping)")
    for fqn, meta in entries.items():
        pickled = not isinstance(meta, dict) or meta.get("use_pickle") is not False
        if pickled or not re.fullmatch(prefix + r"\d+", str(meta.get("path_name"))):
            raise SpecError(
                f"{where}: {one_line(fqn, 80)} is stored as a pickled object, which loading "
                f"would run; {WHAT_A_PT2_MAY_HOLD}"
            )


def _check_static(program: object, where: str) -> None:
    """No symbolic expression (torch parses them with sympy's eval) and no guards (exec'd)."""
    if not isinstance(program, dict):
        raise SpecError(f"{where}: not a torch.export program (its program is not a mapping)")
    graph = (
        program.get("graph_module", {}).get("graph", {})
        if isinstance(program.get("graph_module"), dict)
        else {}
    )
    values = graph.get("tensor_values", {}) if isinstance(graph, dict) else {}
    for arg in graph.get("inputs", []) if isinstance(graph, dict) else []:
        name = arg.get("as_tensor", {}).get("name") if isinstance(arg, dict) else None
        sizes = (
            values.get(name, {}).get("sizes", [])
            if isinstance(values, dict) and name in values
            else []
        )
        if any(isinstance(d, dict) and "as_int" not in d for d in sizes):
            shape = ", ".join(str(d["as_int"]) if "as_int" in d else "?" for d in sizes)
            raise SpecError(
                f"{where}: input {one_line(name, 80)} has a dynamic shape [{shape}]; "
                "export with static shapes"
            )
    if (
        program.get("guards_code")
        or program.get("range_constraints")
        or _has_key(program, "expr_str")
    ):
        raise SpecError(
            f"{where}: the program has symbolic shapes or guards, which loading would evaluate "
            f"as Python; export with static shapes"
        )


def _has_key(tree: object, key: str) -> bool:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if key in node:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


@contextmanager
def _quiet_torch_logs():
    """torch's loader logs warnings, tracebacks included, through `logging`; with no handler
    configured they reach stderr (logging's last resort). A null handler keeps them off it."""
    logger, handler = logging.getLogger("torch"), logging.NullHandler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _brief(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {one_line(lines[0], 160)}" if lines else type(err).__name__


def exported_module(
    ep: torch.export.ExportedProgram, where: str = "exported program"
) -> ModelAndInputs:
    """The exported graph rebuilt as a module the quantization flow takes (see
    tensorgen/frontend/export.py), with its example inputs; refuses dynamic shapes. A program
    quantized by PT2E (`convert_pt2e`, then `torch.export.export` and `save`) is returned as
    its GraphModule, which tensorgen lowers as it is."""
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and any(not isinstance(d, int) for d in val.shape):
            raise SpecError(
                f"{where}: input {node.name} has a dynamic shape {list(val.shape)}; "
                "export with static shapes"
            )
    args, kwargs = ep.example_inputs or ((), {})
    if kwargs:
        raise SpecError(f"{where}: keyword inputs are not supported")
    if not args:
        raise SpecError(
            f"{where}: the program carries no example inputs; export it with example inputs"
        )
    if any(str(n.target).startswith("quantized_decomposed.") for n in ep.graph.nodes):
        return ep.module(), tuple(args)  # already quantized by PT2E: lowered as it is
    try:
        module = module_from_exported(ep)
    except SpecError as err:
        raise SpecError(f"{where}: {err}", err.detail) from None
    return module, tuple(args)
