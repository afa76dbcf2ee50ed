"""Whole-model compilation: a quantized PyTorch model to one .tgb, checked bit for bit.

quantize (PyTorch's FX flow) -> lower every node to a layer (op.yaml program)
-> fold clamps into epilogues -> schedule and compile each layer (auto, else default)
-> plan DRAM by lifetime and link into one binary -> simulate and compare with PyTorch
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import fx

from tensorgen.autosched.objective import check_objective
from tensorgen.autosched.replay import replay_schedule, structure_key
from tensorgen.codegen.link import Buffer, Linked, LinkLayer, link
from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Comparison, compile_auto
from tensorgen.errors import TensorgenError
from tensorgen.frontend.fx import Graph, lower_graph
from tensorgen.frontend.layers import Layer
from tensorgen.frontend.pt2e import is_pt2e, lower_pt2e
from tensorgen.frontend.quantize import one_torch_thread, quantize, quantized_engine
from tensorgen.fusion import Unit, fuse_units
from tensorgen.ir.core import Program
from tensorgen.ir.verify import verify_program
from tensorgen.mc.binary import Binary, decode, encode
from tensorgen.mc.verify import verify_compiled
from tensorgen.sim.machine import Mark, SimResult, simulate
from tensorgen.target import Target


@dataclass(frozen=True)
class LayerReport:
    name: str
    path: str
    op: str
    shape: tuple[int, ...]  # of the output
    macs: int
    cycles: int  # simulated in the whole model, on the example input
    dram_bytes: int
    schedule: str  # "auto" or why the default schedule was used
    epilogue: tuple[str, ...] = ()

    def utilization(self, target: Target) -> float:
        return self.macs / (self.cycles * target.rows * target.cols) if self.cycles else 0.0


@dataclass
class CompiledModel:
    binary: Binary
    graph: Graph
    linked: Linked
    layers: list[LayerReport]
    layer_binaries: list[Binary]
    target: Target
    qmodel: fx.GraphModule
    engine: str
    example_inputs: tuple[torch.Tensor, ...]
    compile_s: float = 0.0
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    reference: torch.nn.Module | None = None  # a PT2E graph's: tensorgen's rule (pt2e_rule)
    fusion_notes: list[str] = field(default_factory=list)  # what was fused and why
    units: list[Unit] = field(default_factory=list)  # what was linked: layers and fused groups


def is_quantized(model: torch.nn.Module) -> bool:
    return isinstance(model, fx.GraphModule) and any(
        n.op == "call_function" and n.target is torch.quantize_per_tensor for n in model.graph.nodes
    )


# allocations between collections of the youngest generation while a model compiles
YOUNG_COLLECTION = 10_000


@contextlib.contextmanager
def fewer_collections(young: int = YOUNG_COLLECTION):
    """Python's cyclic garbage collector run less often while a model compiles: its youngest
    generation collected every `young` allocations instead of every 700, the thresholds
    restored afterwards. A compile allocates millions of short-lived objects (isl wrappers,
    instructions, the cost model's tuples) next to the ~300k long-lived ones of PyTorch and
    the model, and the default thresholds made ~800 collections, ~0.5 s of ResNet-18's compile
    (gc.callbacks, process CPU); at 10,000, 45 (0.06-0.1 s). Nothing the compiler computes
    depends on when garbage is collected (its caches keyed by id hold their keys)."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], young), old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


@fewer_collections()
def compile_model(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    target: Target,
    engine: str = "qnnpack",
    seed: int = 0,
    progress: Callable[[int, int, Layer], None] | None = None,
    jobs: int = 1,
    quantizer: str = "fx",
    fuse: bool = True,
    overlap: bool = True,
    objective: str = "cycles",
) -> CompiledModel:
    """Quantize `model` (unless it already is) with `quantizer` ("fx" or "pt2e"), lower,
    schedule, compile and link it; `jobs` processes compile its layers (compile_layers: the
    same binary whatever their number); with `fuse` (the default; `--no-fuse` turns it off),
    the groups of layers that fusion.py finds fusable are linked as one program each; with
    `overlap` (the default), units that fit the on-chip memories in pairs overlap at link time
    (codegen/overlap.py) instead of meeting at a full barrier. `objective`: what the layers'
    schedule search minimises (autosched/objective.py)."""
    check_objective(objective)
    t0 = time.perf_counter()
    qmodel, graph, reference = _lowered(model, example_inputs, engine, seed, quantizer)
    if not graph.layers:
        raise TensorgenError("the model has no layers to compile")
    buffers: dict[str, Buffer] = {}
    for v in graph.values.values():
        if v.buffer == v.name:  # the value that owns its storage; aliases share it
            role = "input" if v in graph.inputs else "output" if v in graph.outputs else "temp"
            buffers[v.name] = Buffer(v.name, v.nbytes, role)
    singles, binaries, traces = _compile_graph(graph, target, jobs, progress, buffers, objective)
    units, notes = fuse_units(graph, target, singles, traces) if fuse else (singles, [])
    link_layers = [LinkLayer(_unit_name(graph, u), u.binary, u.bindings) for u in units]
    public = {v.buffer: v.name for v in graph.inputs + graph.outputs}
    onchip = {"spad": target.spad.bytes, "acc": target.acc.bytes} if overlap else None
    linked = link(link_layers, buffers, public, target.name, target.hash, onchip)
    verify_compiled(linked.binary, target)
    cm = CompiledModel(
        linked.binary,
        graph,
        linked,
        [],
        binaries,
        target,
        qmodel,
        engine,
        example_inputs,
        0.0,
        [v.name for v in graph.inputs],
        [v.name for v in graph.outputs],
    )
    cm.reference = reference
    cm.fusion_notes = notes
    cm.units = units
    _report(cm, units)
    cm.compile_s = time.perf_counter() - t0
    return cm


def _report(cm: CompiledModel, units: list[Unit]) -> None:
    """One values-free run of the whole binary (`simulate(values=False)`: its marks are all this
    reads, and they do not depend on the values) gives every unit's cycles and traffic."""
    graph = cm.graph
    # the binary as compile_model holds it, not its .tgb bytes decoded again as run_model
    # simulates them: a Binary is a value that encode and decode carry over whole (equal after
    # the round trip, tested), and the round trip of a model's weights took 0.2 s of ResNet-18's
    _, result = run_model(cm, cm.example_inputs, cm.binary, values=False)
    before = Mark(0, 0, 0, 0)
    for unit, mark in zip(units, result.marks, strict=False):
        layers = [graph.layers[j] for j in unit.layers]
        cm.layers.append(
            LayerReport(
                _unit_name(graph, unit),
                layers[0].path,
                "+".join(lay.op for lay in layers),
                layers[-1].output.shape,
                unit.macs,
                mark.cycles - before.cycles,
                mark.dram_bytes - before.dram_bytes,
                unit.schedule,
                tuple(e for lay in layers for e in lay.epilogue),
            )
        )
        before = mark


def _unit_name(graph: Graph, unit: Unit) -> str:
    """A layer's name, or a fused group's: its first layer's and how many follow."""
    first = graph.layers[unit.layers[0]].name
    return first if len(unit.layers) == 1 else f"{first}_and{len(unit.layers) - 1}"


def _compile_graph(
    graph: Graph,
    target: Target,
    jobs: int,
    progress: Callable[[int, int, Layer], None] | None,
    buffers: dict[str, Buffer],
    objective: str = "cycles",
) -> tuple[list[Unit], list[Binary], list[tuple | None]]:
    """Every layer of `graph` compiled (compile_layers) and bound to its buffers, its constants
    added to `buffers`: one unit per layer, their binaries, and their schedules' traces (None:
    no schedule to replay)."""
    singles, binaries, traces = [], [], []
    programs = [verify_program(layer.program(target.name)) for layer in graph.layers]
    finished = []

    def done(i: int) -> None:
        finished.append(i)
        if progress:
            progress(len(finished), len(graph.layers), graph.layers[i])

    for layer, compiled in zip(
        graph.layers, compile_layers(programs, target, jobs, done, objective), strict=True
    ):
        binary = compiled.compiled
        bindings = {}
        for port in layer.ports:
            if port.const is not None:
                name = f"{layer.name}/{port.name}"
                buffers[name] = Buffer(
                    name,
                    port.const.nbytes,
                    "const",
                    np.ascontiguousarray(port.const.astype(np.dtype(port.dtype))).tobytes(),
                )
                bindings[port.name] = name
            elif port.value is not None:
                bindings[port.name] = port.value
        sched = "auto" if compiled.auto else "default"
        singles.append(Unit([len(singles)], binary, bindings, compiled.macs, sched))
        traces.append(compiled.trace)
        binaries.append(binary)
    return singles, binaries, traces


@dataclass(frozen=True)
class LayerBinary:
    """One layer compiled, as a worker process returns it (pickled, the Binary a value)."""

    compiled: Binary  # linked as it is: encoded only when `binary` is read
    macs: int
    auto: bool  # scheduled by the search (or a schedule built from the primitives)
    trace: tuple | None  # the steps of its schedule, replayed onto layers of the same structure

    @property
    def binary(self) -> bytes:
        """The layer's .tgb bytes. (Encoding each layer and decoding it again for the link,
        a round trip a Binary survives whole, took 0.1-0.2 s of ResNet-18's compile.)"""
        return encode(self.compiled)


def compile_layers(
    programs: Sequence[Program],
    target: Target,
    jobs: int = 1,
    done: Callable[[int], None] | None = None,
    objective: str = "cycles",
) -> list[LayerBinary]:
    """Every program compiled (compile_auto), in `jobs` processes (1: this one). Programs of the
    same structure (autosched.replay.structure_key) are scheduled once: the first of them is
    searched, the others replay its schedule (searched afresh if the replay fails). Which is
    searched and which replays does not depend on `jobs`, so neither does a byte of the output.
    `done(i)` is called as program i's compile arrives."""
    keys = [structure_key(p, target) for p in programs]
    first: dict[tuple, int] = {}
    leader = [first.setdefault(k, i) for i, k in enumerate(keys)]
    leaders = [i for i, j in enumerate(leader) if i == j]
    followers = [i for i, j in enumerate(leader) if i != j]
    out: list[LayerBinary | None] = [None] * len(programs)
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    try:
        run = pool.map if pool else map
        for group in (leaders, followers):
            traces = [None if leader[i] == i else out[leader[i]].trace for i in group]
            n = len(group)
            args = ([programs[i] for i in group], [target] * n, traces, [objective] * n)
            for i, result in zip(group, run(_compile_layer, *args), strict=True):
                out[i] = result
                if done:
                    done(i)
    finally:
        if pool:
            pool.shutdown()
    return out


@fewer_collections()  # in a worker process too
def _compile_layer(
    program: Program, target: Target, trace: tuple | None = None, objective: str = "cycles"
) -> LayerBinary:
    """`program` compiled under the schedule `trace` builds on it, else by compile_auto."""
    if trace is not None:
        try:
            schedule = replay_schedule(program, target, trace)
            compiled = compile_scheduled(program, target, schedule)
            verify_compiled(compiled.binary, target)
            return LayerBinary(compiled.binary, compiled.macs, True, trace)
        except TensorgenError:
            pass  # a miss: searched afresh
    result = compile_auto(program, target, objective)
    schedule = result.plan.schedule
    return LayerBinary(
        result.compiled.binary,
        result.compiled.macs,
        schedule is not None,
        tuple(schedule.trace) if schedule is not None else None,
    )


def _lowered(model, example_inputs, engine: str, seed: int, quantizer: str):
    """(the quantized model, its layer graph, the reference of a PT2E graph or None)."""
    threads = torch.get_num_threads()  # what PyTorch runs the model at, outside one_torch_thread
    with quantized_engine(engine), one_torch_thread():
        qmodel = (
            model
            if is_quantized(model) or is_pt2e(model)
            else quantize(model, example_inputs, engine=engine, seed=seed, quantizer=quantizer)
        )
        if not is_pt2e(qmodel):
            return qmodel, lower_graph(qmodel, example_inputs, engine, threads), None
    from tensorgen.frontend.pt2e_rule import RuleModel

    with one_torch_thread():
        return qmodel, lower_pt2e(qmodel, example_inputs), RuleModel(qmodel)


def reference_outputs(cm: CompiledModel, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    """PyTorch's quantized execution of the model, under the engine it was quantized for."""
    with quantized_engine(cm.engine), torch.no_grad():
        out = (cm.reference or cm.qmodel)(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o.detach().numpy() for o in outs]


def run_model(
    cm: CompiledModel,
    inputs: tuple[torch.Tensor, ...],
    binary: Binary | None = None,
    values: bool = True,
) -> tuple[list[np.ndarray] | None, SimResult]:
    """The model's outputs and the simulator's result on `inputs`: of `binary`, by default the
    model's binary as its .tgb bytes decode (what a file of it runs). `values=False`: a
    values-free run (`simulate(values=False)`), its counters and marks only, outputs None."""
    feed = {
        name: x.detach().numpy().astype(np.float32)
        for name, x in zip(cm.input_names, inputs, strict=False)
    }
    marks = tuple(end for _, end in cm.linked.layer_ranges)
    binary = decode(encode(cm.binary)) if binary is None else binary
    result = simulate(binary, feed, cm.target, marks=marks, values=values)
    if not values:
        return None, result
    return [result.outputs[name] for name in cm.output_names], result


def check_model(
    cm: CompiledModel, inputs: tuple[torch.Tensor, ...]
) -> tuple[Comparison, SimResult]:
    """Simulate the model's binary on `inputs` and compare every output bit for bit with PyTorch."""
    got, result = run_model(cm, inputs)
    for name, ref, out in zip(cm.output_names, reference_outputs(cm, inputs), got, strict=False):
        if ref.shape != out.shape:
            return Comparison(
                False, f"MISMATCH {name}: shape {list(out.shape)}, PyTorch {list(ref.shape)}"
            ), result
        differ = ref.view(np.int32) != out.view(np.int32)
        if differ.any():
            where = tuple(np.argwhere(differ)[0])
            return Comparison(
                False,
                f"MISMATCH {name}[{', '.join(map(str, where))}]: simulator {out[where]!r}, "
                f"PyTorch {ref[where]!r} ({int(differ.sum())} of {ref.size} elements differ)"
                + _first_bad_layer(cm, inputs),
            ), result
    if cm.reference is not None:
        return Comparison(
            True, f"BIT-EXACT with the PT2E rule; {cm.reference.describe(inputs)}"
        ), result
    return Comparison(True, "BIT-EXACT"), result


def _first_bad_layer(cm: CompiledModel, inputs) -> str:
    """Each unit (a layer, or a fused group) alone on PyTorch's own values at its inputs: the
    first whose output differs, else that every one agrees (then the units interfere). One
    line, never an exception: it only explains a mismatch already found."""
    if cm.reference is not None:  # PyTorch's values are float, not the rule's integers
        return ""
    try:
        return _first_bad_unit(cm, inputs)
    except Exception as err:  # noqa: BLE001 - a diagnostic must not turn a MISMATCH into a crash
        text = str(err).strip().splitlines()
        return f"; no differing layer found ({type(err).__name__}{': ' + text[0] if text else ''})"


def _first_bad_unit(cm: CompiledModel, inputs) -> str:
    from tensorgen.frontend.fx import record

    with quantized_engine(cm.engine):
        results = {n.name: r for n, r in record(cm.qmodel, inputs).items()}
    consts = {
        f"{lay.name}/{p.name}": p
        for lay in cm.graph.layers
        for p in lay.ports
        if p.const is not None
    }
    latest: dict[str, str] = {}  # model value -> the node whose result it holds now
    for unit in cm.units:
        feed = {}
        for t in unit.binary.tensors:
            if t.role == "input":
                buf = unit.bindings[t.name]
                port = consts.get(buf)
                value = (
                    port.const.astype(np.dtype(port.dtype))
                    if port is not None
                    else _as_array(results[latest.get(buf, buf)])
                )
                feed[t.name] = np.ascontiguousarray(value).reshape(t.shape)
        layers = [cm.graph.layers[j] for j in unit.layers]
        for lay in layers:
            latest[lay.output.value] = lay.result or lay.name
        outputs = simulate(unit.binary, feed, cm.target).outputs
        for name, out in outputs.items():
            buf = unit.bindings[name]
            want = np.ascontiguousarray(_as_array(results[latest.get(buf, buf)]))
            if want.size != out.size or want.astype(out.dtype).tobytes() != out.tobytes():
                return "; first differing " + (
                    f"layer: {layers[0].op} {layers[0].name} at {layers[0].path}"
                    if len(layers) == 1
                    else f"unit: fused {'+'.join(lay.op for lay in layers)} "
                    f"{' -> '.join(lay.name for lay in layers)} at {layers[0].path}"
                )
    return (
        "; every layer and fused group alone matches PyTorch on PyTorch's values at its inputs"
        " (they differ together: what one leaves on chip, or the linking)"
    )


def _as_array(t: torch.Tensor) -> np.ndarray:
    return (t.int_repr() if t.is_quantized else t).detach().numpy()
