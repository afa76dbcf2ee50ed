"""The example models and the frontend that quantizes them (tensorgen/frontend/quantize.py).

Besides checking the frontend, `test_node_kinds` is the record of what the model
compiler must lower: every distinct node kind in each converted graph, per engine.
"""

from __future__ import annotations

import operator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tensorgen.errors import SpecError
from tensorgen.frontend.quantize import (
    is_quantized,
    load_factory,
    quantize,
    quantized_engine,
    repair_qnnpack_clamp,
)

MODELS = Path(__file__).parents[2] / "examples" / "models"
# small sizes keep the suite fast; resnet18 at 32 still reaches 1x1 in layer4
SIZES = {"small_cnn": 16, "resnet18": 32, "mobilenetv2": 32, "mlp": 256}
CALIBRATION_BATCHES = 4
ENGINES = ("qnnpack", "x86")

# What each converted graph contains; see kind() for the spelling.
QUANTIZE_IN = {"placeholder", "get_attr", "call_function torch.quantize_per_tensor"}
DEQUANTIZE_OUT = {"call_method dequantize", "output"}
CONV = "call_module torch.ao.nn.quantized.modules.conv.Conv2d"
CONV_RELU = "call_module torch.ao.nn.intrinsic.quantized.modules.conv_relu.ConvReLU2d"
LINEAR = "call_module torch.ao.nn.quantized.modules.linear.Linear"
LINEAR_RELU = "call_module torch.ao.nn.intrinsic.quantized.modules.linear_relu.LinearReLU"
MAXPOOL = "call_module torch.nn.modules.pooling.MaxPool2d"
AVGPOOL = "call_module torch.nn.modules.pooling.AdaptiveAvgPool2d"
RELU6 = "call_module torch.nn.modules.activation.ReLU6"
FLATTEN = "call_function torch.flatten"
ADD = "call_function torch.ops.quantized.add"
ADD_RELU = "call_function torch.ops.quantized.add_relu"
CONTIGUOUS = "call_method contiguous"  # inserted by repair_qnnpack_clamp, qnnpack only

_RESNET = (
    QUANTIZE_IN | DEQUANTIZE_OUT | {CONV, CONV_RELU, ADD_RELU, MAXPOOL, AVGPOOL, FLATTEN, LINEAR}
)
_MOBILENET = QUANTIZE_IN | DEQUANTIZE_OUT | {CONV, RELU6, ADD, AVGPOOL, FLATTEN, LINEAR}
_MLP = QUANTIZE_IN | DEQUANTIZE_OUT | {FLATTEN, LINEAR_RELU, LINEAR}
NODE_KINDS = {
    ("small_cnn", "qnnpack"): _RESNET,
    ("small_cnn", "x86"): _RESNET,
    ("resnet18", "qnnpack"): _RESNET,
    ("resnet18", "x86"): _RESNET,
    ("mobilenetv2", "qnnpack"): _MOBILENET | {CONTIGUOUS},
    ("mobilenetv2", "x86"): _MOBILENET,
    ("mlp", "qnnpack"): _MLP,
    ("mlp", "x86"): _MLP,
}


def build(name: str, seed: int = 0):
    return load_factory(str(MODELS / f"{name}.py"), {"size": SIZES[name], "seed": seed})


_QUANTIZED: dict[tuple[str, str, int], tuple] = {}


def quantized(name: str, engine: str, seed: int = 0):
    """(float model, example inputs, quantized model), quantized once per session."""
    key = (name, engine, seed)
    if key not in _QUANTIZED:
        model, inputs = build(name, seed)
        qmodel = quantize(model, inputs, engine, CALIBRATION_BATCHES, seed)
        _QUANTIZED[key] = (model, inputs, qmodel)
    return _QUANTIZED[key]


def kind(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        cls = type(gm.get_submodule(node.target))
        return f"call_module {cls.__module__}.{cls.__qualname__}"
    if node.op == "call_function":
        if isinstance(node.target, torch._ops.OpOverloadPacket):
            return f"call_function torch.ops.{node.target}"
        module = "operator" if node.target.__module__ == "_operator" else node.target.__module__
        return f"call_function {module}.{node.target.__name__}"
    if node.op == "call_method":
        return f"call_method {node.target}"
    return node.op


def node_kinds(gm: torch.fx.GraphModule) -> set[str]:
    return {kind(gm, node) for node in gm.graph.nodes}


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


# --- the models ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SIZES)
def test_build_is_deterministic(name: str) -> None:
    model_a, inputs_a = build(name)
    model_b, inputs_b = build(name)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key
    assert all(torch.equal(a, b) for a, b in zip(inputs_a, inputs_b, strict=True))
    with torch.no_grad():
        assert torch.equal(model_a(*inputs_a), model_b(*inputs_b))
    assert not model_a.training
    assert inputs_a[0].shape[0] == 1
    other, _ = build(name, seed=1)
    assert not torch.equal(next(other.parameters()), next(model_a.parameters()))


def test_build_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build("small_cnn")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "mobilenetv2"])
def test_batchnorm_is_not_the_identity(name: str) -> None:
    model, _ = build(name)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    for bn in norms:
        assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))


def test_resnet18_is_resnet18() -> None:
    model, inputs = load_factory(str(MODELS / "resnet18.py"))
    assert inputs[0].shape == (1, 3, 64, 64)
    assert sum(p.numel() for p in model.parameters()) == 11_689_512  # torchvision's count
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 20  # stem + 16 in blocks + 3 downsample projections
    with torch.no_grad():
        assert model(*inputs).shape == (1, 1000)


def test_mobilenetv2_has_the_block_variety() -> None:
    model, _ = build("mobilenetv2")
    depthwise = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels
    ]
    assert {m.stride for m in depthwise} == {(1, 1), (2, 2)}
    blocks = [m for m in model.modules() if hasattr(m, "use_residual")]
    assert any(b.use_residual for b in blocks) and not all(b.use_residual for b in blocks)


def test_mlp_takes_an_image_like_input_too() -> None:
    model, _ = build("mlp")
    with torch.no_grad():
        assert model(torch.randn(1, 1, 16, 16)).shape == (1, 10)


# --- load_factory ----------------------------------------------------------------------------


def test_load_factory_defaults_to_build_and_passes_params() -> None:
    model, inputs = load_factory(str(MODELS / "small_cnn.py"), {"size": 8})
    named, _ = load_factory(f"{MODELS / 'small_cnn.py'}:build", {"size": 8})
    assert inputs[0].shape == (1, 3, 8, 8)
    assert torch.equal(model.fc.weight, named.fc.weight)


def test_load_factory_leaves_sys_path_and_modules_alone() -> None:
    import sys

    path, modules = list(sys.path), set(sys.modules)
    load_factory(str(MODELS / "mlp.py"))
    assert sys.path == path
    assert set(sys.modules) - modules == set()


FACTORY_ERRORS = {
    "raises": (
        "def build(size=1, seed=0):\n    raise ValueError('bad size')\n",
        r"bad\.py:build\(size=3\) raised ValueError: bad size",
    ),
    "wrong_type": (
        "def build(size=1, seed=0):\n    return 42\n",
        r"bad\.py:build: factory returned int; expected \(nn\.Module",
    ),
    "not_a_module": (
        "import torch\ndef build(size=1, seed=0):\n    return 'model', (torch.zeros(1),)\n",
        r"bad\.py:build: factory returned a str as the model",
    ),
    "inputs_not_tensors": (
        "import torch\ndef build(size=1, seed=0):\n    return torch.nn.ReLU(), [torch.zeros(1)]\n",
        r"bad\.py:build: factory's example inputs are not",
    ),
    "import_fails": (
        "import no_such_module_xyz\n",
        r"bad\.py:build: importing the file raised ModuleNotFoundError",
    ),
    "no_function": ("x = 1\n", r"bad\.py:build: the file defines no function 'build'"),
}


@pytest.mark.parametrize("case", FACTORY_ERRORS)
def test_load_factory_errors(tmp_path: Path, case: str) -> None:
    source, message = FACTORY_ERRORS[case]
    path = tmp_path / "bad.py"
    path.write_text(source)
    params = {"size": 3} if case == "raises" else None
    with pytest.raises(SpecError, match=message) as info:
        load_factory(str(path), params)
    assert "\n" not in str(info.value)


def test_load_factory_missing_file_and_function(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope\.py:build: no such file"):
        load_factory(str(tmp_path / "nope.py"))
    with pytest.raises(SpecError, match=r"mlp\.py:make: the file defines no function 'make'"):
        load_factory(f"{MODELS / 'mlp.py'}:make")
    with pytest.raises(SpecError, match=r"mlp\.py:build\(width=3\) raised TypeError"):
        load_factory(str(MODELS / "mlp.py"), {"width": 3})


# --- quantize --------------------------------------------------------------------------------


def test_quantized_engine_is_restored() -> None:
    before = torch.backends.quantized.engine
    other = "qnnpack" if before != "qnnpack" else "x86"
    with quantized_engine(other):
        assert torch.backends.quantized.engine == other
    assert torch.backends.quantized.engine == before
    with pytest.raises(RuntimeError), quantized_engine(other):
        raise RuntimeError
    assert torch.backends.quantized.engine == before
    with (
        pytest.raises(SpecError, match=r"quantized_engine\('tpu'\): engine must be one of"),
        quantized_engine("tpu"),
    ):
        pass


def test_quantize_checks_its_arguments() -> None:
    model, inputs = build("mlp")
    with pytest.raises(SpecError, match=r"quantize\(engine='int4'\)"):
        quantize(model, inputs, engine="int4")
    with pytest.raises(SpecError, match=r"quantize\(calibration_batches=0\)"):
        quantize(model, inputs, calibration_batches=0)


@pytest.mark.parametrize("name", SIZES)
def test_quantize_qnnpack_is_close_to_float(name: str) -> None:
    model, inputs, qmodel = quantized(name, "qnnpack")
    assert is_quantized(qmodel)
    assert quantize(qmodel, inputs) is qmodel  # already quantized: unchanged
    assert not is_quantized(model)  # the float model is not touched
    with quantized_engine("qnnpack"), torch.no_grad():
        assert cosine(qmodel(*inputs), model(*inputs)) > 0.95


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", SIZES)
def test_quantize_is_close_to_float_across_seeds(name: str, seed: int, engine: str) -> None:
    model, inputs, qmodel = quantized(name, engine, seed)
    with quantized_engine(engine), torch.no_grad():
        assert cosine(qmodel(*inputs), model(*inputs)) > 0.95


def test_quantize_records_no_stack_traces_and_restores_the_setting(monkeypatch) -> None:
    # FX's tracer would symbolize a Python stack per node (importing torch._dynamo) for metadata
    # nothing reads: quantize turns that off while it traces, and only then
    import tensorgen.frontend.quantize as q

    config = torch.fx.config
    before = config.do_not_emit_stack_traces
    seen = []

    def prepare(*args, **kwargs):
        seen.append(config.do_not_emit_stack_traces)
        return prepare_fx(*args, **kwargs)

    prepare_fx = q.prepare_fx
    monkeypatch.setattr(q, "prepare_fx", prepare)
    model, inputs = build("small_cnn")
    assert is_quantized(quantize(model, inputs, calibration_batches=1))
    assert seen == [True]
    assert config.do_not_emit_stack_traces == before


def test_quantize_is_deterministic_and_silent(capsys) -> None:
    model, inputs = build("small_cnn")
    first = quantize(model, inputs, calibration_batches=2, seed=5)
    second = quantize(model, inputs, calibration_batches=2, seed=5)
    with quantized_engine("qnnpack"), torch.no_grad():
        assert torch.equal(first(*inputs), second(*inputs))
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", SIZES)
def test_node_kinds(name: str, engine: str) -> None:
    """The distinct node kinds of each converted graph: what the model compiler must lower."""
    model, inputs, qmodel = quantized(name, engine)
    kinds = node_kinds(qmodel)
    print(f"{name} / {engine}:", *sorted(kinds), sep="\n  ")
    assert kinds == NODE_KINDS[name, engine]
    # BatchNorm is folded into the convs; no float compute is left between quantize and dequantize
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in qmodel.modules())
    assert not any(
        isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) and not hasattr(m, "scale")
        for m in qmodel.modules()
    )
    with quantized_engine(engine), torch.no_grad():
        assert qmodel(*inputs).shape == model(*inputs).shape


@pytest.mark.parametrize("engine", ENGINES)
def test_qparams_live_where_the_report_says(engine: str) -> None:
    """Output qparams of conv/linear are module attributes; weights carry their own; the
    input quantize and the adds take theirs from get_attr nodes (0-d tensor buffers)."""
    _, _, qmodel = quantized("small_cnn", engine)
    per_channel = engine == "x86"
    for node in qmodel.graph.nodes:
        if node.op == "call_module" and hasattr(qmodel.get_submodule(node.target), "scale"):
            module = qmodel.get_submodule(node.target)
            assert isinstance(module.scale, float) and isinstance(module.zero_point, int)
            weight = module.weight()
            assert weight.dtype == torch.qint8
            expected = torch.per_channel_affine if per_channel else torch.per_tensor_affine
            assert weight.qscheme() == expected
            assert module.bias().dtype == torch.float32  # quantized to int32 by the kernel
        if node.op == "call_function" and node.target in (
            torch.quantize_per_tensor,
            torch.ops.quantized.add_relu,
        ):
            scale, zero_point = (
                node.args[-3:-1] if node.target is torch.quantize_per_tensor else node.args[2:4]
            )
            assert scale.op == zero_point.op == "get_attr"
            assert getattr(qmodel, scale.target).dtype == torch.float32
            assert getattr(qmodel, zero_point.target).dtype == torch.int64
    quantize_node = next(n for n in qmodel.graph.nodes if n.target is torch.quantize_per_tensor)
    assert quantize_node.args[3] == torch.quint8


def test_residual_add_is_a_quantized_op_not_operator_add() -> None:
    for name in ("resnet18", "mobilenetv2", "small_cnn"):
        _, _, qmodel = quantized(name, "qnnpack")
        assert not any(n.target is operator.add for n in qmodel.graph.nodes)


# --- the qnnpack clamp repair ----------------------------------------------------------------


def test_qnnpack_clamp_bug_is_still_in_torch() -> None:
    """A canary: when this fails, torch has fixed its qnnpack clamp on channels_last
    inputs, and repair_qnnpack_clamp can go."""
    x = torch.randn(1, 8, 4, 4, generator=torch.Generator().manual_seed(0))
    q = torch.quantize_per_tensor(x, 0.03, 128, torch.quint8)
    expected = F.relu6(q).int_repr()
    with quantized_engine("qnnpack"):
        scrambled = F.relu6(q.contiguous(memory_format=torch.channels_last)).int_repr()
    assert not torch.equal(scrambled, expected)
    assert torch.equal(scrambled.flatten(), expected.permute(0, 2, 3, 1).flatten())


def test_repaired_relu6_clamps_codes_exactly() -> None:
    """Under qnnpack every ReLU6 output is its input's codes clamped to [zp, q(6.0)]."""
    _, inputs, qmodel = quantized("mobilenetv2", "qnnpack")
    checked = []

    class Check(torch.fx.Interpreter):
        def call_module(self, target, args, kwargs):
            out = super().call_module(target, args, kwargs)
            if isinstance(self.module.get_submodule(target), torch.nn.ReLU6):
                x = args[0]
                low, high = torch.quantize_per_tensor(
                    torch.tensor([0.0, 6.0]), x.q_scale(), x.q_zero_point(), x.dtype
                ).int_repr()
                assert torch.equal(out.int_repr(), x.int_repr().clamp(low, high)), target
                checked.append(target)
            return out

    with quantized_engine("qnnpack"), torch.no_grad():
        Check(qmodel).run(*inputs)
    assert len(checked) == 17


def test_repair_leaves_graphs_without_clamps_unchanged() -> None:
    _, _, qmodel = quantized("resnet18", "qnnpack")
    code = qmodel.code
    assert repair_qnnpack_clamp(qmodel) is qmodel and qmodel.code == code


# --- the qnnpack dilated max pooling bug -------------------------------------------------------


@pytest.mark.parametrize(
    "kernel,stride,padding,dilation,buggy",
    [
        (3, 1, 1, 2, True),
        (3, 2, 1, 2, True),
        (2, 1, 1, 3, True),
        (3, 1, 0, 2, False),
        (3, 1, 1, 1, False),
        (2, 2, 0, 1, False),
    ],
)
def test_qnnpack_dilated_max_pool_bug_is_still_in_torch(
    kernel, stride, padding, dilation, buggy
) -> None:
    """A canary: torch 2.13's qnnpack quantized max pooling is wrong at the borders exactly when
    dilation > 1 and padding > 0 (in both layouts); x86 agrees with float max pooling of the
    dequantized values. When the buggy cases start passing, torch has fixed it and the refusal
    in fx.py (max_pool) can go."""
    x = torch.randn(1, 4, 14, 14, generator=torch.Generator().manual_seed(0))
    q = torch.quantize_per_tensor(x, 0.03, 128, torch.quint8)
    args = (kernel, stride, padding, dilation)
    expected = torch.quantize_per_tensor(
        F.max_pool2d(q.dequantize(), *args), 0.03, 128, torch.quint8
    ).int_repr()
    for channels_last in (False, True):
        qi = q.contiguous(memory_format=torch.channels_last) if channels_last else q
        with quantized_engine("x86"):
            assert torch.equal(F.max_pool2d(qi, *args).int_repr(), expected)
        with quantized_engine("qnnpack"):
            assert torch.equal(F.max_pool2d(qi, *args).int_repr(), expected) != buggy
