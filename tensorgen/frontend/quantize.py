"""From a float PyTorch model to the int8 GraphModule that the model compiler lowers.

Two steps, both plain PyTorch:

- `load_factory` imports a model file by path and calls its factory
  (`build(size=..., seed=...) -> (model, example_inputs)`, see examples/models/).
- `quantize` runs PyTorch's standard FX post-training quantization: `prepare_fx`
  with the engine's default qconfig mapping, calibration on seeded random
  batches, `convert_fx`. Its output is the golden reference that the simulator
  must match bit for bit.

Quantized weights are prepacked for one engine (qnnpack, x86 or fbgemm), and a
model only runs, or runs identically, under the engine it was packed for: run
the result inside `quantized_engine(engine)`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

from tensorgen.errors import SpecError

ENGINES = ("qnnpack", "x86", "fbgemm")
QUANTIZERS = ("fx", "pt2e")  # PyTorch's FX flow, or torch.export + torchao's PT2E flow
DEFAULT_FACTORY = "build"

ModelAndInputs = tuple[nn.Module, tuple[torch.Tensor, ...]]


@contextmanager
def quantized_engine(name: str) -> Iterator[None]:
    """Use quantized engine `name` (`torch.backends.quantized.engine`) inside the block.

    The previous engine is restored on exit, also when the block raises.
    """
    if name not in ENGINES:
        raise SpecError(f"quantized_engine({name!r}): engine must be one of {', '.join(ENGINES)}")
    if name not in torch.backends.quantized.supported_engines:
        raise SpecError(f"quantized_engine({name!r}): this torch build does not support {name}")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        with quiet_torch_warnings():  # every model path of tensorgen runs torch in here
            yield
    finally:
        torch.backends.quantized.engine = previous


def load_factory(spec: str, params: dict[str, int] | None = None) -> ModelAndInputs:
    """Import `path/to/file.py[:function]` and return what `function(**params)` builds.

    `function` defaults to `build`. The file is imported by path under a private
    module name that is registered in `sys.modules` only while the file runs and
    the factory is called (dataclasses and pickling look classes up there), so
    loading leaves neither `sys.path` nor `sys.modules` changed.

    Returns `(model, example_inputs)`: an `nn.Module` and a non-empty tuple of tensors.
    Raises SpecError naming the file and function when the file cannot be imported,
    has no such function, the factory raises, or it returns something else.
    """
    path, function = _split_spec(spec)
    where = f"{path}:{function}"
    factory_file = Path(path)
    try:
        is_file = factory_file.is_file()
    except OSError as err:  # a name too long for the file system, say
        raise SpecError(f"{where}: cannot read ({err.strerror})") from None
    if not is_file:
        raise SpecError(f"{where}: no such file")
    digest = hashlib.sha1(str(factory_file.resolve()).encode()).hexdigest()[:12]
    module_name = f"_tensorgen_model_{digest}"
    import_spec = importlib.util.spec_from_file_location(module_name, factory_file)
    if import_spec is None or import_spec.loader is None:
        raise SpecError(f"{where}: cannot import (not a Python source file?)")
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module
    try:
        try:
            import_spec.loader.exec_module(module)
        except Exception as err:
            raise SpecError(
                f"{where}: importing the file raised {_one_line(err)}", traceback.format_exc()
            ) from err
        factory = getattr(module, function, None)
        if not callable(factory):
            raise SpecError(f"{where}: the file defines no function '{function}'")
        result = _call_factory(factory, where, params or {})
    finally:
        sys.modules.pop(module_name, None)
    return _check_result(result, where)


def _split_spec(spec: str) -> tuple[str, str]:
    # Split on the last colon only when what follows is an identifier, so a path
    # that itself contains a colon still works.
    path, sep, function = spec.rpartition(":")
    if sep and function.isidentifier():
        return path, function
    if sep and not function:
        raise SpecError(f"{spec}: empty function name after ':'")
    return spec, DEFAULT_FACTORY


def _call_factory(factory: Callable[..., object], where: str, params: dict[str, int]) -> object:
    try:
        return factory(**params)
    except Exception as err:
        args = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise SpecError(f"{where}({args}) raised {_one_line(err)}", traceback.format_exc()) from err


def _check_result(result: object, where: str) -> ModelAndInputs:
    expected = "expected (nn.Module, tuple of tensors)"
    if not (isinstance(result, tuple) and len(result) == 2):
        raise SpecError(f"{where}: factory returned {type(result).__name__}; {expected}")
    model, inputs = result
    if not isinstance(model, nn.Module):
        raise SpecError(
            f"{where}: factory returned a {type(model).__name__} as the model; {expected}"
        )
    if not (
        isinstance(inputs, tuple) and inputs and all(isinstance(t, torch.Tensor) for t in inputs)
    ):
        raise SpecError(
            f"{where}: factory's example inputs are not a non-empty tuple of tensors; {expected}"
        )
    return model, inputs


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def quantize(
    model: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    engine: str = "qnnpack",
    calibration_batches: int = 8,
    seed: int = 0,
    quantizer: str = "fx",
) -> torch.fx.GraphModule:
    """PyTorch's standard FX post-training int8 quantization of `model`.

    `quantizer="pt2e"` quantizes through torch.export and torchao's PT2E flow instead, with
    tensorgen's quantizer (`tensorgen.frontend.pt2e_quantizer`, imported only then); the
    engine does not enter it. The calibration batches are the same.

    `prepare_fx(model, get_default_qconfig_mapping(engine), example_inputs)`,
    then `calibration_batches` forward passes on seeded random batches shaped
    like `example_inputs` (standard normal, from a Generator seeded with `seed`;
    non-float inputs are passed as given), then `convert_fx`. All three run
    under `quantized_engine(engine)`, since weights are prepacked for it.

    `model` itself is left untouched (a copy is quantized, in eval mode). A model
    that is already quantized (a GraphModule with quantize ops or quantized
    modules) is returned unchanged.

    Under qnnpack the result has one deviation from plain `convert_fx`: see
    `repair_qnnpack_clamp`.

    Parameters: `engine` is "qnnpack" (the golden reference), "x86" or "fbgemm";
    `calibration_batches` must be positive.
    """
    if engine not in ENGINES:
        raise SpecError(f"quantize(engine={engine!r}): engine must be one of {', '.join(ENGINES)}")
    if calibration_batches < 1:
        raise SpecError(
            f"quantize(calibration_batches={calibration_batches}): must be a positive integer"
        )
    if quantizer not in QUANTIZERS:
        raise SpecError(
            f"quantize(quantizer={quantizer!r}): must be one of {', '.join(QUANTIZERS)}"
        )
    if is_quantized(model) or is_pt2e_quantized(model):
        return model
    float_model = copy.deepcopy(model).eval()
    generator = torch.Generator().manual_seed(seed)
    if quantizer == "pt2e":
        with quiet_torch_logs():  # torchao logs its optional CUDA kernels failing to load
            from tensorgen.frontend.pt2e_quantizer import quantize_pt2e

            try:
                return quantize_pt2e(float_model, example_inputs, calibration_batches, generator)
            except SpecError:
                raise
            except Exception as err:  # torch.export or torchao refusing the model
                raise SpecError(f"PT2E quantization failed: {_one_line(err)}") from None
    with quantized_engine(engine), torch.no_grad(), _no_stack_traces(), one_torch_thread():
        prepared = prepare_fx(float_model, get_default_qconfig_mapping(engine), example_inputs)
        for _ in range(calibration_batches):
            prepared(*_random_like(example_inputs, generator))
        converted = convert_fx(prepared)
    return repair_qnnpack_clamp(converted) if engine == "qnnpack" else converted


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's intra-op pool at one thread inside the block, the previous count restored.

    Calibration and lowering run many small float ops; on a loaded machine torch's default
    threads fight each other and the machine (0.9 s quiet, tens of seconds under load)."""
    previous = torch.get_num_threads()
    if previous != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


@contextmanager
def _no_stack_traces() -> Iterator[None]:
    # FX quantization's tracer records the Python stack of every node it creates (node.stack_trace,
    # debugging metadata nothing of tensorgen reads): symbolizing them imports torch._dynamo and
    # costs about a third of prepare_fx. Off inside the block, the previous setting restored.
    config = torch.fx.config
    previous = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = previous


@contextmanager
def quiet_torch_warnings() -> Iterator[None]:
    # torch 2.13 warns that FX quantization, quantized dtypes and reduce_range are
    # deprecated. They are still the reference this project matches; the warnings
    # say nothing a tensorgen user can act on, and printed before a refusal they break its
    # one line. Scoped (catch_warnings restores the filters), not a global filter.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torch(\.|$)")
        for message in (
            r"torch\.ao\.quantization is deprecated",
            r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other",
            r"Please use quant_min and quant_max",
            r"All inputs of this cat operator must share",  # tensorgen requantizes them exactly
        ):
            warnings.filterwarnings("ignore", message=message)
        yield


@contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """torch and torchao log warnings through `logging` (torchao: its optional CUDA kernels
    failing to load; torch: deprecations at torchao's import), which reach stderr ahead of a
    refusal's one line. Inside the block only errors are logged."""
    names = ("torch", "torchao", "torch.utils._pytree")  # torch configures handlers of its own
    loggers, handler = [logging.getLogger(n) for n in names], logging.NullHandler()
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def _random_like(
    inputs: tuple[torch.Tensor, ...], generator: torch.Generator
) -> tuple[torch.Tensor, ...]:
    return tuple(
        torch.randn(t.shape, dtype=t.dtype, generator=generator) if t.is_floating_point() else t
        for t in inputs
    )


_QUANTIZE_FUNCTIONS = (torch.quantize_per_tensor, torch.quantize_per_channel)
_PT2E_QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"


def is_pt2e_quantized(model: nn.Module) -> bool:
    """Whether `model` is a GraphModule converted by PT2E (`convert_pt2e`): it holds
    `quantized_decomposed` quantize nodes around float operators."""
    return isinstance(model, torch.fx.GraphModule) and any(
        node.op == "call_function" and str(node.target) == _PT2E_QUANTIZE
        for node in model.graph.nodes
    )


_QUANTIZED_MODULE_PACKAGES = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized")


def is_quantized(model: nn.Module) -> bool:
    """Whether `model` is a converted quantized GraphModule (output of convert_fx)."""
    if not isinstance(model, torch.fx.GraphModule):
        return False
    if any(
        node.op == "call_function" and node.target in _QUANTIZE_FUNCTIONS
        for node in model.graph.nodes
    ):
        return True
    return any(type(m).__module__.startswith(_QUANTIZED_MODULE_PACKAGES) for m in model.modules())


# NOTE: torch 2.13's qnnpack clamp kernel (quantized hardtanh, relu6 and clamp, the
# in-place forms too) mishandles channels_last inputs: it writes NHWC-ordered data
# but labels the result NCHW, so values land at the wrong positions. Quantized
# convs produce channels_last tensors under qnnpack, so every conv -> ReLU6 yields
# a scrambled tensor, and an unrepaired MobileNetV2 is no golden reference at all.
# Other ops are correct in both layouts: relu, pooling, add, add_relu, mul, cat.
_CLAMP_MODULES = (nn.ReLU6, nn.Hardtanh)
_CLAMP_FUNCTIONS = (
    F.relu6,
    F.hardtanh,
    F.hardtanh_,
    torch.clamp,
    torch.clip,
    torch.clamp_,
    torch.clip_,
)
_CLAMP_METHODS = ("clamp", "clip", "clamp_", "clip_")


def repair_qnnpack_clamp(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Make the clamp family compute the right values under qnnpack.

    Inserts `x = x.contiguous()` before each ReLU6 / Hardtanh module and each
    relu6 / hardtanh / clamp / clip call, which sidesteps the channels_last bug
    of torch's qnnpack clamp kernel (see the NOTE above). `contiguous` changes
    only the memory layout, so the model compiler lowers it as the identity.
    An in-place clamp whose input has other users is left alone, since a copy
    would hide the in-place update from them.

    Returns `graph_module`, edited in place, or unchanged when it has no such node.
    """
    graph = graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if not _is_clamp(graph_module, node) or not node.args:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node):
            continue
        if _is_in_place(graph_module, node) and len(source.users) > 1:
            continue
        with graph.inserting_before(node):
            contiguous = graph.call_method("contiguous", (source,))
        node.replace_input_with(source, contiguous)
        changed = True
    if changed:
        graph.lint()
        graph_module.recompile()
    return graph_module


def _is_clamp(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(graph_module.get_submodule(node.target), _CLAMP_MODULES)
    if node.op == "call_function":
        return node.target in _CLAMP_FUNCTIONS
    return node.op == "call_method" and node.target in _CLAMP_METHODS


def _is_in_place(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_module":
        return bool(getattr(graph_module.get_submodule(node.target), "inplace", False))
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return name.endswith("_") or bool(node.kwargs.get("inplace", False))
