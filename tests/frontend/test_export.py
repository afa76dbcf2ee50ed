"""torch.export programs of float models: rebuilt for FX quantization (frontend/export.py),
loaded from .pt2 files (frontend/load.py) and compiled bit-exact."""

from __future__ import annotations

import operator
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorgen.errors import SpecError
from tensorgen.frontend.export import module_from_exported
from tensorgen.frontend.load import exported_module, load_model
from tensorgen.frontend.quantize import load_factory, quantize, quantized_engine
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

MODELS = Path(__file__).parents[2] / "examples" / "models"


def export_to(path: Path, model: nn.Module, inputs: tuple[torch.Tensor, ...], **kwargs) -> Path:
    torch.export.save(torch.export.export(model, inputs, **kwargs), str(path))
    return path


@pytest.fixture(scope="module")
def small_cnn(tmp_path_factory):
    """(float model, example inputs, the saved .pt2 of its export)."""
    model, inputs = load_factory(str(MODELS / "small_cnn.py"), {"size": 16})
    pt2 = export_to(tmp_path_factory.mktemp("export") / "small_cnn.pt2", model, inputs)
    return model, inputs, pt2


def assert_same_float(
    model: nn.Module, rebuilt: nn.Module, inputs: tuple[torch.Tensor, ...]
) -> None:
    with torch.no_grad():
        expected, got = model(*inputs), rebuilt(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def assert_compiles_bit_exact(
    model: nn.Module, module: nn.Module, example: tuple[torch.Tensor, ...]
) -> None:
    """`module` compiles bit-exact, and quantizes to what FX quantization of `model` gives."""
    cm = compile_model(module, example, load_target("tg1"))
    reference = quantize(model, example)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randn(example[0].shape, generator=generator)
        comparison, _ = check_model(cm, (x,))
        assert comparison.exact, comparison.message
        assert comparison.message == "BIT-EXACT"
        with quantized_engine("qnnpack"), torch.no_grad():
            assert torch.equal(cm.qmodel(x), reference(x))


def test_small_cnn_from_pt2_is_bit_exact(small_cnn):
    model, inputs, pt2 = small_cnn
    module, example = load_model(str(pt2))
    assert torch.equal(example[0], inputs[0])
    assert_same_float(model, module, inputs)
    assert_compiles_bit_exact(model, module, example)


@pytest.mark.slow
def test_mobilenetv2_from_pt2_is_bit_exact(tmp_path):
    # 16x16 still reaches 1x1 through the stride-2 stem and depthwise convs
    model, inputs = load_factory(str(MODELS / "mobilenetv2.py"), {"size": 16})
    module, example = load_model(str(export_to(tmp_path / "mobilenetv2.pt2", model, inputs)))
    assert_same_float(model, module, inputs)
    assert_compiles_bit_exact(model, module, example)


def test_rebuilt_graph_is_modules_named_after_the_users_model():
    model, inputs = load_factory(str(MODELS / "mobilenetv2.py"), {"size": 16})
    gm = module_from_exported(torch.export.export(model, inputs))
    nodes = gm.graph.nodes
    kinds = {type(gm.get_submodule(n.target)).__name__ for n in nodes if n.op == "call_module"}
    assert kinds == {"Conv2d", "BatchNorm2d", "ReLU6", "AdaptiveAvgPool2d", "Linear"}
    assert {n.target for n in nodes if n.op == "call_function"} == {operator.add, torch.flatten}
    names = dict(gm.named_children())
    # features.1.conv.0.0 is the depthwise conv of the first block, classifier the final Linear
    assert names["features_1_conv_0_0"].groups == names["features_1_conv_0_0"].in_channels == 16
    assert isinstance(names["features_1_conv_0_2"], nn.ReLU6)
    assert torch.equal(names["classifier"].weight, model.classifier.weight)
    assert not any(n.op == "get_attr" or "_guards" in str(n.target) for n in gm.graph.nodes)
    assert not gm.training and not names["features_0_1"].training


class Block(nn.Module):
    """Functional ops inside a module's forward, and the ops beyond the example models."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding="same", groups=2)
        self.act = nn.ReLU(inplace=True)
        self.clip = nn.Hardtanh(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))
        y = torch.cat([F.relu(y), self.clip(x)], dim=1)
        return F.avg_pool2d(y, 2)


class Everything(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1, dilation=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.block = Block()
        self.pool = nn.MaxPool2d(3, stride=1, padding=1)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(16 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.block(F.relu6(self.bn(self.stem(x))))
        y = self.pool(y) + y
        z = y.permute(0, 2, 3, 1).reshape(1, -1)
        return self.head(self.drop(y.view(1, -1))), z


def test_every_supported_op_rebuilds_to_the_same_floats():
    model = Everything().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    inputs = (torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)),)
    gm = module_from_exported(torch.export.export(model, inputs))
    names = dict(gm.named_children())
    assert isinstance(names["block_conv"], nn.Conv2d) and names["block_conv"].padding == (1, 1)
    assert isinstance(names["block_act"], nn.ReLU) and isinstance(names["block_clip"], nn.Hardtanh)
    # F.relu6 in the root's forward is named after its node, F.relu in block's forward after
    # block's path and its node
    assert isinstance(names["relu6"], nn.ReLU6)
    assert isinstance(names["block_relu"], nn.ReLU)
    assert isinstance(names["block_avg_pool2d"], nn.AvgPool2d)
    assert "drop" not in names  # dropout in eval mode is the identity
    with torch.no_grad():
        expected, got = model(*inputs), gm(*inputs)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "dim, size",
    [(0, torch.export.Dim("batch", min=2, max=8)), (2, torch.export.Dim("height", min=8, max=64))],
)
def test_dynamic_shape_is_refused_naming_the_input(tmp_path, small_cnn, dim, size):
    model, _, _ = small_cnn
    pt2 = export_to(
        tmp_path / "dynamic.pt2",
        model,
        (torch.randn(2, 3, 16, 16),),
        dynamic_shapes={"x": {dim: size}},
    )
    expected = r"dynamic\.pt2: input x has a dynamic shape .*; export with static shapes"
    with pytest.raises(SpecError, match=expected) as err:
        load_model(str(pt2))
    assert "\n" not in str(err.value)


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.layer1 = nn.Sequential(nn.ReLU(), Gate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.layer1(self.conv(x)))


def test_unsupported_op_is_refused_naming_op_and_module(tmp_path):
    pt2 = export_to(tmp_path / "gated.pt2", Gated().eval(), (torch.randn(1, 3, 8, 8),))
    expected = (
        r"^.*gated\.pt2: unsupported operator aten\.sigmoid\.default at layer1\.1 "
        r"\(sigmoid\)$"
    )
    with pytest.raises(SpecError, match=expected):
        load_model(str(pt2))


def test_unsupported_op_at_the_root_is_refused_naming_the_node():
    class Sine(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) + x

    expected = r"^sine\.pt2: unsupported operator aten\.sin\.default at sin$"
    with pytest.raises(SpecError, match=expected):
        exported_module(torch.export.export(Sine(), (torch.randn(1, 4),)), "sine.pt2")


def test_training_mode_batch_norm_is_refused():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    expected = r"aten\.batch_norm\.default at 1 \(batch_norm\): batch norm in training mode"
    with pytest.raises(SpecError, match=expected):
        module_from_exported(torch.export.export(model, (torch.randn(2, 3, 8, 8),)))


def test_computed_weight_is_refused():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.conv2d(x, self.weight * 2)

    with pytest.raises(SpecError, match=r"aten\.mul\.Tensor at mul"):
        module_from_exported(torch.export.export(Scaled(), (torch.randn(1, 3, 8, 8),)))


def test_cli_compiles_a_pt2(cli, small_cnn, tmp_path):
    _, _, pt2 = small_cnn
    out = tmp_path / "out.tgb"
    result = cli("compile", pt2, "-o", out)
    assert result.code == 0, result.err
    assert out.stat().st_size > 0
    assert f"{out}:" in result.out and "inputs x" in result.out


class RunsACommand:
    """Unpickling this runs a shell command that leaves a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def rewrite_pt2(src: Path, dst: Path, change: dict[str, bytes]) -> Path:
    """A copy of the archive `src` with some records replaced or added."""
    from torch.export.pt2_archive._package import PT2ArchiveReader, PT2ArchiveWriter

    with PT2ArchiveReader(str(src)) as reader:
        records = {name: reader.read_bytes(name) for name in reader.get_file_names()}
    records.update(change)
    with PT2ArchiveWriter(str(dst)) as writer:
        for name, data in records.items():
            if not name.startswith(".data/"):  # the writer adds its own
                writer.write_bytes(name, data)
    return dst


def _pickled(obj: object) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _json_record(pt2: Path, name: str, edit) -> bytes:
    import json

    from torch.export.pt2_archive._package import PT2ArchiveReader

    with PT2ArchiveReader(str(pt2)) as reader:
        data = json.loads(reader.read_string(name))
    edit(data)
    return json.dumps(data).encode()


def _crafted(kind: str, pt2: Path, tmp_path: Path, marker: Path) -> Path:
    payload = _pickled(RunsACommand(marker))
    weights = "data/weights/model_weights_config.json"

    def mark_pickled(config: dict) -> None:
        next(iter(config["config"].values()))["use_pickle"] = True

    def add_guard(program: dict) -> None:
        program["guards_code"] = [f"__import__('os').system('touch {marker}')"]

    def symbolic_size(program: dict) -> None:
        graph = program["graph_module"]["graph"]
        inputs = {arg["as_tensor"]["name"] for arg in graph["inputs"]}
        size = next(v for k, v in graph["tensor_values"].items() if k not in inputs)[
            "sizes"
        ]  # an inner value
        size[0] = {
            "as_expr": {
                "expr_str": f"__import__('os').system('touch {marker}')",
                "hint": {"as_int": 4},
            }
        }

    change = {
        "use_pickle": {
            weights: _json_record(pt2, weights, mark_pickled),
            "data/weights/weight_0": payload,
        },
        "sample_inputs": {"data/sample_inputs/model.pt": payload},
        "opaque_object": {"data/constants/opaque_obj_0": payload},
        "aotinductor": {"data/aotinductor/model/model.so": b"\x7fELF"},
        "guards": {"models/model.json": _json_record(pt2, "models/model.json", add_guard)},
        "symbolic": {"models/model.json": _json_record(pt2, "models/model.json", symbolic_size)},
    }[kind]
    return rewrite_pt2(pt2, tmp_path / f"{kind}.pt2", change)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("use_pickle", r"conv1\.weight is stored as a pickled object, which loading would run"),
        (
            "sample_inputs",
            r"its example inputs are not plain tensors \(the weights-only unpickler refuses them",
        ),
        ("opaque_object", r"unexpected record 'data/constants/opaque_obj_0'"),
        ("aotinductor", r"unexpected record 'data/aotinductor/model/model\.so'"),
        (
            "guards",
            r"the program has symbolic shapes or guards, which loading would evaluate as Python",
        ),
        (
            "symbolic",
            r"the program has symbolic shapes or guards, which loading would evaluate as Python",
        ),
    ],
)
def test_a_pt2_never_runs_code(cli, small_cnn, tmp_path, kind, message):
    _, _, pt2 = small_cnn
    marker = tmp_path / "marker"
    crafted = _crafted(kind, pt2, tmp_path, marker)
    out = tmp_path / "out.tgb"
    result = cli("compile", crafted, "-o", out)
    err = result.err.strip().splitlines()
    assert result.code == 2 and len(err) == 1 and not out.exists(), result.err
    assert re.match(rf"^error: {re.escape(str(crafted))}: {message}", err[0]), err[0]
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["use_pickle", "sample_inputs", "symbolic", "guards"])
def test_canary_torch_export_load_runs_the_code_of_a_crafted_pt2(small_cnn, tmp_path, kind):
    # why tensorgen checks an archive before torch loads it: torch 2.13 unpickles pickles, evaluates
    # symbolic sizes with sympy (eval) and runs guards code when the module runs
    _, _, pt2 = small_cnn
    marker = tmp_path / "marker"
    crafted = _crafted(kind, pt2, tmp_path, marker)
    try:
        ep = torch.export.load(str(crafted))
        ep.module()(*ep.example_inputs[0])
    except Exception:  # noqa: BLE001 - whatever it built is broken; the command ran before
        pass
    assert marker.exists()


def test_pytorch_warnings_never_precede_the_error_line(tmp_path):
    # a factory that quantizes its model itself: torch.ao warns while it runs, then the
    # GELU (which FX leaves in float) is refused; stderr holds the error line only (a process:
    # pytest captures warnings)
    import subprocess
    import sys

    factory = tmp_path / "gelu.py"
    factory.write_text(
        "import torch\nfrom torch import nn\n"
        "from torch.ao.quantization import get_default_qconfig_mapping\n"
        "from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx\n\n\n"
        "def build():\n"
        "    torch.backends.quantized.engine = 'qnnpack'\n"
        "    model, x = nn.Sequential(nn.Linear(8, 8), nn.GELU()).eval(), (torch.randn(2, 8),)\n"
        "    prepared = prepare_fx(model, get_default_qconfig_mapping('qnnpack'), x)\n"
        "    prepared(*x)\n"
        "    return convert_fx(prepared), x\n"
    )
    out = tmp_path / "out.tgb"
    root = Path(__file__).parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            "-m",
            "tensorgen.cli",
            "compile",
            str(factory),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
        env={"PYTHONPATH": str(root), "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: GELU at 1: a float operation inside the quantized model cannot be bit-exact on "
        "the accelerator; quantize it (give it a qconfig) or remove it\n",
    )
    assert not out.exists()
