"""tensorgen's PT2E quantizer: which tensors of an exported graph get which quantization.

torchao's PT2E flow (`prepare_pt2e` / `convert_pt2e`) takes the quantizer from its user; torchao
no longer exports a general-purpose one (`XNNPACKQuantizer` moved into ExecuTorch), so
tensorgen ships this one. It annotates the ATen graph `torch.export` produces:

- activations: int8, asymmetric, per tensor (a histogram observer);
- weights of `conv2d` / `linear`: int8 symmetric per output channel, range [-127, 127];
- bias: int32 at scale `s_x·s_w[k]` (derived from the input's and weight's observers);
- a conv or linear followed by `relu` / `hardtanh` (ReLU6), and an `add` followed by `relu`,
  are one pattern: only the activation's output is quantized;
- ops that do not change values share their input's parameters (max pooling, flatten, view,
  reshape, transpose, permute, nearest upsampling, dropout, the pieces of chunk / split,
  `cat`'s inputs and output), so they stay integer copies; average pooling and `mean` get
  their own output parameters;
- functions of one tensor (hardswish, hardsigmoid, sigmoid, tanh, leaky_relu, elu, gelu, silu)
  and `mul` (of two tensors or a tensor and a number) get their own output parameters: the
  lowering makes the former lookup tables.

torchao is imported here only, and this module only when `--quantizer pt2e` is used.
"""

from __future__ import annotations

import operator

import torch
from torch import fx
from torchao.quantization.pt2e import HistogramObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

aten = torch.ops.aten
ACT = QuantizationSpec(
    dtype=torch.int8,
    quant_min=-128,
    quant_max=127,
    qscheme=torch.per_tensor_affine,
    is_dynamic=False,
    observer_or_fake_quant_ctr=HistogramObserver.with_args(eps=2**-12),
)
WEIGHT = QuantizationSpec(
    dtype=torch.int8,
    quant_min=-127,
    quant_max=127,
    qscheme=torch.per_channel_symmetric,
    ch_axis=0,
    is_dynamic=False,
    observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2**-12),
)
WEIGHTED = (aten.conv2d.default, aten.linear.default)
ACTIVATIONS = (aten.relu.default, aten.relu_.default, aten.hardtanh.default, aten.hardtanh_.default)
ADDS = (aten.add.Tensor, aten.add_.Tensor)
SAME_VALUES = (  # ops whose output takes their input's quantization parameters
    aten.max_pool2d.default,
    aten.flatten.using_ints,
    aten.view.default,
    aten.reshape.default,
    aten.contiguous.default,
    aten.clone.default,
    aten.transpose.int,
    aten.permute.default,
    aten.relu.default,
    aten.relu_.default,
    aten.hardtanh.default,
    aten.hardtanh_.default,
    aten.dropout.default,
    aten.upsample_nearest2d.vec,
    aten.upsample_nearest2d.default,
)
LOOKUPS = (  # functions of one tensor with their own output parameters: lookup tables
    aten.hardswish.default,
    aten.hardswish_.default,
    aten.hardsigmoid.default,
    aten.hardsigmoid_.default,
    aten.sigmoid.default,
    aten.tanh.default,
    aten.leaky_relu.default,
    aten.elu.default,
    aten.gelu.default,
    aten.silu.default,
)
SPLIT_SIZES = aten.split_with_sizes.default
MULS = (aten.mul.Tensor, aten.mul_.Tensor, aten.sub.Tensor)  # inputs and output quantized
OWN_OUTPUT = (aten.adaptive_avg_pool2d.default, aten.mean.dim, aten.avg_pool2d.default)
KEY = "quantization_annotation"


def _bias_qparams(observers) -> tuple[torch.Tensor, torch.Tensor]:
    act, weight = observers
    s_x, _ = act.calculate_qparams()
    s_w, _ = weight.calculate_qparams()
    scale = (s_x.to(torch.float64) * s_w.to(torch.float64)).to(torch.float32)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


class TensorgenQuantizer(Quantizer):
    """int8 activations, int8 per-channel weights, int32 bias (see the module docstring)."""

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        for node in model.graph.nodes:
            if node.op != "call_function" or KEY in node.meta:
                continue
            if node.target in WEIGHTED:
                self._weighted(node)
            elif node.target in ADDS:
                self._add(node)
            elif node.target is aten.cat.default:
                self._cat(node)
            elif node.target in SAME_VALUES:
                self._same(node)
            elif node.target in (aten.chunk.default, aten.split.Tensor, SPLIT_SIZES):
                self._pieces(node)
            elif node.target in MULS:
                self._annotate(node, {_arg(node, 0): ACT, _arg(node, 1): ACT}, ACT)
            elif node.target in OWN_OUTPUT or node.target in LOOKUPS:
                self._annotate(node, {_arg(node, 0): ACT}, ACT)
        return model

    def validate(self, model: fx.GraphModule) -> None:
        pass

    @staticmethod
    def _annotate(node: fx.Node, inputs: dict, output) -> None:
        inputs = {k: v for k, v in inputs.items() if isinstance(k, fx.Node)}
        node.meta[KEY] = QuantizationAnnotation(
            input_qspec_map=inputs, output_qspec=output, _annotated=True
        )

    def _fused(self, node: fx.Node, kinds) -> fx.Node | None:
        """The activation that alone consumes `node`, if one follows it."""
        users = list(node.users)
        if len(users) == 1 and users[0].op == "call_function" and users[0].target in kinds:
            return users[0]
        return None

    def _weighted(self, node: fx.Node) -> None:
        x, w = _arg(node, 0), _arg(node, 1)
        bias = _arg(node, 2)
        inputs = {x: ACT, w: WEIGHT}
        if isinstance(bias, fx.Node):
            inputs[bias] = DerivedQuantizationSpec(
                derived_from=[(x, node), (w, node)],
                derive_qparams_fn=_bias_qparams,
                dtype=torch.int32,
                quant_min=-(2**31),
                quant_max=2**31 - 1,
                qscheme=torch.per_channel_symmetric,
                ch_axis=0,
            )
        act = self._fused(node, ACTIVATIONS)
        self._annotate(node, inputs, None if act is not None else ACT)
        if act is not None:
            self._annotate(act, {}, ACT)

    def _add(self, node: fx.Node) -> None:
        a, b = _arg(node, 0), _arg(node, 1)
        act = self._fused(node, (aten.relu.default, aten.relu_.default))
        self._annotate(node, {a: ACT, b: ACT}, None if act is not None else ACT)
        if act is not None:
            self._annotate(act, {}, ACT)

    def _cat(self, node: fx.Node) -> None:
        tensors = [t for t in node.args[0] if isinstance(t, fx.Node)]
        if not tensors:
            return
        first = tensors[0]
        shared = SharedQuantizationSpec((first, node))
        inputs = {first: ACT} | {t: shared for t in tensors[1:]}
        self._annotate(node, inputs, shared)

    def _pieces(self, node: fx.Node) -> None:
        """chunk / split: the tuple is not observed; each getitem of it shares the input's."""
        x = _arg(node, 0)
        if not isinstance(x, fx.Node):
            return
        self._annotate(node, {x: ACT}, None)
        for user in node.users:
            if user.op == "call_function" and user.target is operator.getitem:
                self._annotate(user, {}, SharedQuantizationSpec((x, node)))

    def _same(self, node: fx.Node) -> None:
        x = _arg(node, 0)
        if not isinstance(x, fx.Node):
            return
        self._annotate(node, {x: ACT}, SharedQuantizationSpec((x, node)))


def _arg(node: fx.Node, i: int):
    return node.args[i] if len(node.args) > i else None


def quantize_pt2e(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    calibration_batches: int,
    generator: torch.Generator,
) -> fx.GraphModule:
    """`torch.export` (static shapes), `prepare_pt2e` with TensorgenQuantizer, calibration on
    `calibration_batches` standard-normal batches from `generator`, `convert_pt2e`."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad():
        exported = torch.export.export(model, example_inputs, strict=False).module()
        prepared = prepare_pt2e(exported, TensorgenQuantizer())
        for _ in range(calibration_batches):
            prepared(
                *(
                    torch.randn(t.shape, dtype=t.dtype, generator=generator)
                    if t.is_floating_point()
                    else t
                    for t in example_inputs
                )
            )
        return convert_pt2e(prepared)
