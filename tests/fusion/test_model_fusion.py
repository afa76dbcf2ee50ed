"""Model-level fusion (`compile_model(..., fuse=True)`, `--fuse`): runs of layers joined by
activations only the next reads are compiled as one program each, the activations kept on chip;
bit-exact against PyTorch like the layer-by-layer compile, with less DRAM traffic."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from tensorgen.frontend.quantize import load_factory
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

MODELS = Path(__file__).parents[2] / "examples" / "models"
TG1 = load_target("tg1")

warnings.filterwarnings("ignore", category=UserWarning)


def test_small_cnn_fused_is_bit_exact_and_moves_less() -> None:
    model, example = load_factory(str(MODELS / "small_cnn.py"), {"size": 16})
    results = {}
    for fuse in (False, True):
        cm = compile_model(model, example, TG1, fuse=fuse)
        for seed in (0, 1):
            x = torch.randn(*example[0].shape, generator=torch.Generator().manual_seed(seed))
            cmp, result = check_model(cm, (x * 1.5,))
            assert cmp.exact, (fuse, cmp.message)
        results[fuse] = (cm, result.stats)
    (plain, before), (fused, after) = results[False], results[True]
    assert not plain.fusion_notes and all(r.schedule != "fused" for r in plain.layers)
    groups = [r for r in fused.layers if r.schedule == "fused"]
    assert groups and all("+" in r.op for r in groups), [r.op for r in fused.layers]
    assert any(note.startswith("fused ") for note in fused.fusion_notes), fused.fusion_notes
    # the activations between fused layers never go to DRAM: fewer bytes, less energy
    assert after.dram_bytes < 0.6 * before.dram_bytes
    assert after.energy_pj < before.energy_pj
    assert sum(r.dram_bytes for r in fused.layers) == after.dram_bytes


def test_a_group_that_does_not_compile_whole_is_fused_in_halves(monkeypatch) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_groups import _Block

    from tensorgen import fusion

    whole = fusion._fused_unit

    def refuse_long(run, group, idx):
        if len(idx) > 2:  # as a capacity refusal would
            return None, "; refused by the test"
        return whole(run, group, idx)

    monkeypatch.setattr(fusion, "_fused_unit", refuse_long)
    torch.manual_seed(0)
    model, example = _Block().eval(), (torch.randn(1, 3, 8, 8),)
    cm = compile_model(model, example, TG1, fuse=True)
    fused = [r for r in cm.layers if r.schedule == "fused"]
    # the whole block is one group (the stem's output, read by expand and by the add folded
    # into project, stays inside); refused, it is split where both parts are groups: not
    # between expand and project (the stem's output would be kept by one part and read by the
    # other), so quantize -> stem, then expand -> project (the stem's output loaded once for
    # both) and head -> dequantize
    assert len(fused) == 3, [(r.name, r.op) for r in cm.layers]
    assert [r.op for r in fused] == ["quantize+conv2d", "conv2d+conv2d", "conv2d+dequantize"]
    assert any("refused by the test" in note for note in cm.fusion_notes)
    for seed in (0, 1):
        x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        cmp, _ = check_model(cm, (x,))
        assert cmp.exact, cmp.message


def test_a_refused_group_is_split_at_the_layer_its_error_names(monkeypatch) -> None:
    """A refusal that names a layer (a tensor `<port>_<i>` or a statement of its) splits the
    group before that layer, or after it if it is the group's first: not in the middle."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_groups import _Block

    from tensorgen import fusion

    whole = fusion._fused_unit
    tried = []

    def blame_stem(run, group, idx):
        tried.append(list(idx))
        stems = [j for j in idx if run.graph.layers[j].path.endswith("stem")]
        if len(idx) > 2 and stems:
            run.blamed = stems[0]
            return None, "; refused by the test"
        return whole(run, group, idx)

    monkeypatch.setattr(fusion, "_fused_unit", blame_stem)
    torch.manual_seed(0)
    model, example = _Block().eval(), (torch.randn(1, 3, 8, 8),)
    cm = compile_model(model, example, TG1, fuse=True)
    # quantize, stem, expand, project, head, dequantize: cut before the stem (quantize alone),
    # then after it (the stem first in its part), then expand..dequantize whole
    assert tried[:3] == [[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [2, 3, 4, 5]], tried
    fused = [r.op for r in cm.layers if r.schedule == "fused"]
    assert fused == ["conv2d+conv2d+conv2d+dequantize"], [(r.name, r.op) for r in cm.layers]
    cmp, _ = check_model(cm, example)
    assert cmp.exact, cmp.message


def test_cli_fuses_by_default_and_explain_names_the_groups(capsys, tmp_path) -> None:
    from tensorgen.cli import main

    assert main(["check", str(MODELS / "mlp.py"), "--trials", "2", "--explain"]) == 0
    text = capsys.readouterr().out
    assert text.count("BIT-EXACT") == 2
    assert "5 layers in 1 units" in text and "fused" in text
    assert "fusion: fused " in text and "DRAM bytes" in text
    out = str(tmp_path / "mlp.tgb")
    assert main(["compile", str(MODELS / "mlp.py"), "-o", out]) == 0
    text = capsys.readouterr().out
    assert "fusion: 1 of 1 groups tried fused (--explain" in text and "DRAM bytes" not in text
    assert main(["compile", str(MODELS / "mlp.py"), "-o", out, "--explain"]) == 0
    assert "fusion: fused " in capsys.readouterr().out
    assert main(["check", str(MODELS / "mlp.py"), "--trials", "1", "--no-fuse"]) == 0
    text = capsys.readouterr().out
    assert "BIT-EXACT" in text and "fusion:" not in text and "5 layers on" in text
    assert main(["check", str(MODELS / "mlp.py"), "--trials", "1", "--fuse"]) == 0  # an alias
    assert "5 layers in 1 units" in capsys.readouterr().out


class _TwoConvs(torch.nn.Module):
    """conv 3x3 + ReLU twice: the activation between them has zero point 0, so its pad is 0."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
        self.b = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_a_zero_pad_halo_does_not_depend_on_what_the_scratchpad_held() -> None:
    """Issue 14: an activation between fused layers is never loaded; its halo must be filled
    with its pad even when that pad is 0, not left as the bytes the last unit wrote there."""
    import numpy as np

    from tensorgen.mc.binary import decode, encode
    from tensorgen.model import reference_outputs
    from tensorgen.sim.machine import Simulator

    torch.manual_seed(0)
    model, example = _TwoConvs().eval(), (torch.randn(1, 3, 8, 8),)
    cm = compile_model(model, example, TG1, fuse=True)
    assert any(r.schedule == "fused" and r.op.count("conv2d") == 2 for r in cm.layers), [
        (r.name, r.op) for r in cm.layers
    ]
    for seed in (0, 1):
        x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        (want,) = reference_outputs(cm, (x,))
        sim = Simulator(decode(encode(cm.binary)), TG1)
        # as a previous unit would leave it: anything but zeros
        rng = np.random.default_rng(seed)
        sim.machine.mem["spad"][:] = rng.integers(1, 256, sim.machine.mem["spad"].size, np.uint8)
        got = sim.run({cm.input_names[0]: x.numpy()}).outputs[cm.output_names[0]]
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), seed


def test_a_max_pool_reads_its_fused_input_with_its_own_pad_even_zero() -> None:
    """A fused conv -> max pool (3x3, stride 1, padding 1) under qnnpack: the pool pads its
    uint8 input with 0, the dtype's minimum, while the conv's output port carries its zero
    point. The halo must hold the reader's pad, 0 included; it held the zero point, which beat
    the negative elements of every border window (17 of 200 random models mismatched)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 5, padding=2), torch.nn.MaxPool2d(3, 1, 1))
    cm = compile_model(model.eval(), (torch.randn(1, 3, 8, 8),), TG1, fuse=True)
    assert any(r.schedule == "fused" and "max_pool2d" in r.op for r in cm.layers), [
        (r.name, r.op) for r in cm.layers
    ]
    for seed in range(4):
        x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(seed)) * 1.5
        cmp, _ = check_model(cm, (x,))
        assert cmp.exact, (seed, cmp.message)


def test_segnet_fused_is_bit_exact() -> None:
    """Issue 14 as it was found: segnet at 16 fused (once as neighbouring groups that put their
    activations at the same scratchpad addresses; fused over regions of the graph it is one
    group: the encoder's skips and the decoder's concatenations stay on chip)."""
    model, example = load_factory(str(MODELS / "segnet.py"), {"size": 16})
    cm = compile_model(model, example, TG1, fuse=True)
    fused = [r.op for r in cm.layers if r.schedule == "fused"]
    assert fused and "cat" in " ".join(fused), [(r.name, r.op) for r in cm.layers]
    cmp, _ = check_model(cm, example)
    assert cmp.exact, cmp.message


def test_a_mismatch_is_localised_in_one_line_and_never_raises(monkeypatch) -> None:
    """check_model's MISMATCH names the first layer or fused group that differs alone, or says
    that each agrees alone; whatever happens while it looks, the message stays one line."""
    import numpy as np

    from tensorgen import model as tg_model
    from tensorgen.frontend import fx as tg_fx

    torch.manual_seed(0)
    example = (torch.randn(1, 3, 8, 8),)
    cm = compile_model(_TwoConvs().eval(), example, TG1, fuse=True)
    exact = tg_model.reference_outputs
    # PyTorch said otherwise at one element: every unit alone still agrees with PyTorch
    monkeypatch.setattr(
        tg_model, "reference_outputs", lambda cm, x: [o + 1.0 for o in exact(cm, x)]
    )
    cmp, _ = check_model(cm, example)
    assert not cmp.exact and "\n" not in cmp.message
    assert "every layer and fused group alone matches PyTorch" in cmp.message, cmp.message
    # a fused group fed other weights than PyTorch's differs alone: named, with its layers
    fused = next(u for u in cm.units if len(u.layers) > 1)
    layer = next(cm.graph.layers[j] for j in fused.layers if cm.graph.layers[j].op == "conv2d")
    port = next(p for p in layer.ports if p.const is not None and p.const.ndim == 4)
    np.negative(port.const, out=port.const)  # this test's own compile: nothing else reads it
    cmp, _ = check_model(cm, example)
    assert "first differing unit: fused " in cmp.message and layer.name in cmp.message, cmp.message
    assert "\n" not in cmp.message

    def broken(*args, **kwargs):
        raise RuntimeError("recording failed\nsecond line")

    monkeypatch.setattr(tg_fx, "record", broken)
    cmp, _ = check_model(cm, example)
    assert cmp.message.endswith("; no differing layer found (RuntimeError: recording failed)")


def test_a_layer_with_a_lookup_table_fuses() -> None:
    """A layer that passes a tensor whole (`lut(Q[...], T)`, a Hardswish after a conv) is
    merged with its table renamed like its other tensors (it was `unknown tensor 'T'`)."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.Hardswish(),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.ReLU(),
    ).eval()
    torch.manual_seed(0)
    example = (torch.randn(1, 3, 8, 8),)
    cm = compile_model(model, example, TG1, fuse=True)
    assert not any("unknown tensor" in note for note in cm.fusion_notes), cm.fusion_notes
    assert any(r.schedule == "fused" and r.op.count("conv2d") == 2 for r in cm.layers), [
        (r.name, r.op, r.epilogue) for r in cm.layers
    ]
    for seed in (0, 1):
        x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        cmp, _ = check_model(cm, (x,))
        assert cmp.exact, cmp.message
