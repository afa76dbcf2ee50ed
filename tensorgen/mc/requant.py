"""Semantics of the float32 requantization instructions of `tensorgen.mc.isa` (VREQUANT,
VREQUANTF, VREQUANTO, VADDQF, VADDQS, VREQUANTZ, VQUANT, VDEQUANT): each the rule of one PyTorch
engine, computed in numpy float32 with every operation rounded once. The instruction table in
isa.py names them; its docs/isa.md entry states each formula."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tensorgen.mc import arith

if TYPE_CHECKING:
    from tensorgen.mc.isa import MachineState


def vrequant(state: MachineState, a) -> None:
    stored = getattr(state, "stored", None)  # the simulator's: the int32 values as held
    if (
        stored is not None
        and a["a"].dtype == "int32"
        and arith.float32_exact(a["zp"], a["lo"], a["hi"])
    ):
        x, dt = stored(a["a"]), np.dtype(a["dst"].dtype)
        scale, zp, lo, hi = np.float32(a["scale"]), a["zp"], a["lo"], a["hi"]
        into = getattr(state, "destination", None)  # the simulator's: dst's array
        same = a["a"].shape == a["dst"].shape
        if into is not None and same and dt.kind in "iu" and arith.holds(dt, lo, hi):
            # the integers in [lo, hi] converted into dst directly: what `write` stores
            arith.requantize_int32(x, scale, zp, lo, hi, dt, out=into(a["dst"]))
            return
        state.write(a["dst"], arith.requantize_int32(x, scale, zp, lo, hi, dt))
        return
    state.write(
        a["dst"],
        arith.requantize(state.read(a["a"]), np.float32(a["scale"]), a["zp"], a["lo"], a["hi"]),
    )


def vrequantf(state: MachineState, a) -> None:
    # fbgemm's per-channel rule with the bias already divided by s_in*s_w: dividing by 1 is exact
    y = arith.requantize_fbgemm(
        state.read(a["a"]),
        state.read(a["bias"]),
        np.float32(1),
        np.float32(1),
        state.read(a["mult"]),
        a["zp"],
        a["lo"],
        a["hi"],
        per_channel=True,
    )
    state.write(a["dst"], y)


def vrequanto(state: MachineState, a) -> None:
    # oneDNN's conv requantization (frontend/onednn.py): float32 operations left to right, each
    # rounded once; the float saturates to [lo, hi] before it converts (NaN gives lo)
    f = np.float32
    t = state.read(a["a"]).astype(f) * f(a["s_src"]) * state.read(a["wei"]).astype(f)
    t = (t + state.read(a["bias"]).astype(f)) * f(a["d"]) + f(a["zp"])
    r = np.rint(np.nan_to_num(t.astype(np.float64), nan=a["lo"]))
    state.write(a["dst"], np.clip(r, a["lo"], a["hi"]).astype(np.int64))


def vaddqf(state: MachineState, a) -> None:
    # fbgemm's vectorised quantized add; the zero points enter only through the offsets
    f = np.float32
    y = arith.add_fbgemm(
        state.read(a["a"]),
        state.read(a["b"]),
        f(a["s_a"]),
        0,
        f(a["off_a"]),
        f(a["s_b"]),
        0,
        f(a["off_b"]),
        f(a["inv"]),
        a["zp"],
        0,
        255,
    )
    state.write(a["dst"], y)


def vaddqs(state: MachineState, a) -> None:
    # fbgemm's scalar-path quantized add: the zero points subtracted from the integers
    f = np.float32
    y = arith.add_fbgemm(
        state.read(a["a"]),
        state.read(a["b"]),
        f(a["s_a"]),
        a["zp_a"],
        f(0),
        f(a["s_b"]),
        a["zp_b"],
        f(0),
        f(a["inv"]),
        a["zp"],
        0,
        255,
        scalar=True,
    )
    state.write(a["dst"], y)


def vrequantz(state: MachineState, a) -> None:
    y = arith.avgpool_fbgemm(state.read(a["a"]), np.float32(a["scale"]), a["zp"], a["lo"], a["hi"])
    state.write(a["dst"], y)


def vquant(state: MachineState, a) -> None:
    x = state.read(a["a"]).astype(np.float32)
    state.write(a["dst"], arith.quantize(x, np.float32(a["inv_scale"]), a["zp"], a["lo"], a["hi"]))


def vdequant(state: MachineState, a) -> None:
    state.write(a["dst"], arith.dequantize(state.read(a["a"]), np.float32(a["scale"]), a["zp"]))
