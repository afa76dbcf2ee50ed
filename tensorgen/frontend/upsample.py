"""Nearest and bilinear `F.interpolate` / `nn.Upsample` as affine gathers.

Both are separable: output row `o` reads a few input rows `i` with weights `A[o, i]`, and the
same for columns. The weights are read off PyTorch's own float operator (run on one-hot rows and
columns), so every mode's index rule and float rounding (scale factors, sizes, `align_corners`,
`nearest-exact`) is PyTorch's. The outputs of one dimension fall into a few classes
`o = q*t + a` (t in [t0, t1]) whose taps sit at `p*t + r` with constant weights (`gather_classes`);
each pair of a row class and a column class is one statement.

Nearest: a copy, `Y[n, c, q*t + a, q'*u + b] = X[n, c, p*t + r, p'*u + r']`. A ratio of
sizes with a long period (8 to 13 rows: 13 classes, each one row) gives more class pairs than
MAX_GATHER_PIECES; compile time grows with the square of a layer's statements (39 copies took
minutes), so such a gather is two contractions by one-hot matrices instead, rows then columns,
`T[n, c, o, j] += R[o, i] * X[n, c, i, j]` and `Y[n, c, o, p] += T[n, c, o, j] * C[p, j]`, with R
and C PyTorch's own weights (0 or 1, one 1 a row): exact (every sum has one nonzero term) and
on the MAC array, four statements whatever the sizes.

Bilinear on quantized data (PyTorch's quantized kernel, the output keeps the input's
parameters): `y = RNE(fl(fl(S) - zp) + zp)` (quantize_val adds the zero point before rounding),
`S = h0*(w0*x00 + w1*x01) + h1*(w0*x10 + w1*x11)` in float32 over the raw codes. When every weight is a multiple of 2^-kh (rows) and 2^-kw (columns)
with kh + kw <= 16, every product and sum is exact in float32 (|numerator| < 2^24), so
`y = RNE(N / 2^(kh+kw))` with the integer `N = sum(Wh*Ww*x)`: one `requant` by 2^-(kh+kw).
Other weights (scale 3, most `align_corners=True` sizes) round in float32 in ways no integer
statement reproduces: refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import torch

from tensorgen.errors import SpecError
from tensorgen.frontend.layers import NATURAL, Layer, Port, affine, f32, module_path

if TYPE_CHECKING:
    from torch import fx

    from tensorgen.frontend.fx import _Lowering

EXACT_BITS = 16  # kh + kw at most this: 255 * 2^16 < 2^24, float32's significand
# class pairs a nearest gather writes as copies (nearest-x1.5: 9); past it, one-hot contractions
MAX_GATHER_PIECES = 16


@dataclass(frozen=True)
class OutputClass:
    """Outputs `q*t + a` for t in [t0, t1] of one dimension, each reading inputs `p*t + r` with
    weight `w` for every (r, w) in `taps` (w a Fraction)."""

    q: int
    a: int
    p: int
    t0: int
    t1: int
    taps: tuple[tuple[int, Fraction], ...]


def axis_weights(run: Callable, shape: tuple[int, ...], dim: int) -> np.ndarray:
    """A[o, i]: the weight of input index i in output index o along `dim` (2: rows, 3: columns),
    from PyTorch's float operator `run` applied to one-hot rows (columns)."""
    _, _, h, w = shape
    size = shape[dim]
    probe = torch.zeros(size, 1, h, w)
    for i in range(size):
        if dim == 2:
            probe[i, 0, i, :] = 1.0
        else:
            probe[i, 0, :, i] = 1.0
    with torch.no_grad():
        out = run(probe)
    line = out[:, 0, :, 0] if dim == 2 else out[:, 0, 0, :]
    return line.double().numpy().T.copy()


def gather_classes(weights: np.ndarray) -> list[OutputClass]:
    """The fewest classes (over the periods PyTorch's rules can have) covering every output."""
    o_size, i_size = weights.shape
    taps = [
        tuple((int(i), Fraction(float(weights[o, i]))) for i in np.nonzero(weights[o])[0])
        for o in range(o_size)
    ]
    candidates = {(o_size, 0)}
    for num, den in ((i_size, o_size), (i_size - 1, o_size - 1)):
        if den > 0:
            f = Fraction(num, den)
            candidates.add((f.denominator, f.numerator))
    best = None
    for q, p in sorted(candidates):
        classes = _classes(taps, q, p)
        if best is None or len(classes) < len(best):
            best = classes
    return best


def _classes(taps: list[tuple], q: int, p: int) -> list[OutputClass]:
    runs: dict[tuple, list[list[int]]] = {}
    for o, tp in enumerate(taps):
        t, a = divmod(o, q)
        key = (a, tuple((i - p * t, w) for i, w in tp))
        seq = runs.setdefault(key, [])
        if seq and seq[-1][1] == t - 1:
            seq[-1][1] = t
        else:
            seq.append([t, t])
    return [OutputClass(q, a, p, t0, t1, rel) for (a, rel), seqs in runs.items() for t0, t1 in seqs]


def _denominator_bits(weights: np.ndarray) -> int | None:
    """The least k with every weight a multiple of 2^-k, or None past EXACT_BITS."""
    for k in range(EXACT_BITS + 1):
        scaled = weights * (1 << k)
        if np.array_equal(scaled, np.round(scaled)):
            return k
    return None


def interpolate(lw: _Lowering, node: fx.Node, run: Callable, mode: str) -> None:
    """`F.interpolate` / `nn.Upsample` of mode `mode` on a quantized tensor (PyTorch's quantized
    kernel) or, for nearest, on a dequantized one (FX leaves nn.Upsample in float)."""
    src = node.args[0]
    x, y = lw.value_of(src), lw.result_value(node)
    if len(x.shape) != 4:
        raise SpecError(f"interpolate of a rank-{len(x.shape)} tensor (only NCHW)")
    if mode not in ("nearest", "nearest-exact", "bilinear"):
        raise SpecError(f"interpolate mode '{mode}' (nearest, nearest-exact and bilinear only)")
    rows, cols = (axis_weights(run, x.shape, d) for d in (2, 3))
    if x.dtype == "float32":
        producer = lw.producer.get(getattr(src, "name", ""))
        if producer is None or producer.op != "dequantize":
            raise SpecError("interpolate of a float tensor that is not a dequantized one")
        if mode == "bilinear":
            raise SpecError(
                "bilinear upsampling left in float by FX (dequantize, float bilinear of the "
                "dequantized values, quantize: float32 rounding of non-integer values); "
                "use F.interpolate, which runs PyTorch's quantized bilinear kernel"
            )
        q = lw.value_of(src.args[0])
        ports = [q.port("X", "input"), y.port("Y", "output", 0)]
        read = lambda sub: f"dequantize(X[{sub}], {q.scale!r}, {q.zp})"  # noqa: E731
    else:
        if (x.scale, x.zp) != (y.scale, y.zp):
            raise SpecError("quantized interpolate that changes the quantization parameters")
        ports = [x.port("X", "input"), y.port("Y", "output")]
        read = None
    kh, kw = _denominator_bits(rows), _denominator_bits(cols)
    if kh is None or kw is None or kh + kw > EXACT_BITS:
        raise SpecError(
            f"{mode} interpolate from {x.shape[2]}x{x.shape[3]} to {y.shape[2]}x{y.shape[3]}: "
            "PyTorch's quantized bilinear weights are not multiples of 2^-k with k <= 16 "
            "between rows and columns, so its float32 sums round (only such weights are exact)"
        )
    classes = [(h, w) for h in gather_classes(rows) for w in gather_classes(cols)]
    natural = NATURAL.get(y.dtype, (0, 0))
    if mode != "bilinear" and len(classes) > MAX_GATHER_PIECES:
        ports, stmts = _one_hot_gather(ports, rows, cols, q if read else x, read is not None)
    else:
        stmts = [_statement(h, w, kh + kw, read, natural) for h, w in classes]
    op = "upsample_bilinear" if mode == "bilinear" else "upsample_nearest"
    if read is None:
        _check_quantized(lw.results[src], lw.results[node], run, rows, cols, mode)
    lw.add(Layer(node.name, module_path(node), op, ports, lambda lo, hi: stmts), y)


def _one_hot_gather(ports: list[Port], rows, cols, x, dequantize: bool):
    """The ports and statements of a nearest gather as two one-hot contractions (module
    docstring); `x` the codes read, `dequantize`: Y is their float32 dequantized values."""
    if not all(np.isin(m, (0.0, 1.0)).all() and (m.sum(axis=1) == 1).all() for m in (rows, cols)):
        raise SpecError("nearest interpolate whose weights are not one input each")
    (n, c, _, w_in), (h_out, w_out) = x.shape, (rows.shape[0], cols.shape[0])
    one_hot = lambda name, m: Port(name, m.shape, "int8", "input", 0, None, m.astype(np.int8))  # noqa: E731
    mid, out = (n, c, h_out, w_in), (n, c, h_out, w_out)
    extra = [one_hot("R", rows), one_hot("C", cols), Port("A1", mid, "int32", "none")]
    extra += [Port("T", mid, x.dtype, "none"), Port("A2", out, "int32", "none")]
    stmts = [
        "A1[n, c, o, j] += R[o, i] * X[n, c, i, j]",
        "T[n, c, o, j] = A1[n, c, o, j]",  # a code: the store is exact
        "A2[n, c, o, p] += T[n, c, o, j] * C[p, j]",
    ]
    if dequantize:
        extra.append(Port("U", out, x.dtype, "none"))
        stmts += ["U[n, c, o, p] = A2[n, c, o, p]"]
        stmts += [f"Y[n, c, o, p] = dequantize(U[n, c, o, p], {x.scale!r}, {x.zp})"]
    else:
        stmts.append("Y[n, c, o, p] = A2[n, c, o, p]")
    return [ports[0], *extra, ports[1]], stmts


def _statement(h: OutputClass, w: OutputClass, k: int, read, natural) -> dict:
    """One class pair's statement: a copy (one tap of weight 1) or the weighted sum."""

    def at(rh: int, rw: int) -> str:
        return f"n, c, {affine((h.p, 't'), const=rh)}, {affine((w.p, 'u'), const=rw)}"

    out = f"Y[n, c, {affine((h.q, 't'), const=h.a)}, {affine((w.q, 'u'), const=w.a)}]"
    where = f"{h.t0} <= t <= {h.t1} and {w.t0} <= u <= {w.t1}"
    terms = [(wh * ww, rh, rw) for rh, wh in h.taps for rw, ww in w.taps]
    if len(terms) == 1 and terms[0][0] == 1:
        _, rh, rw = terms[0]
        rhs = read(at(rh, rw)) if read else f"X[{at(rh, rw)}]"
        return {"stmt": f"{out} = {rhs}", "where": where}
    parts = []
    for wt, rh, rw in terms:
        n = wt * (1 << k)
        assert n.denominator == 1  # _denominator_bits
        parts.append(f"X[{at(rh, rw)}]" if n == 1 else f"{int(n)} * X[{at(rh, rw)}]")
    lo, hi = natural
    body = f"requant({' + '.join(parts)}, {f32(2.0**-k)}, 0)" if k else " + ".join(parts)
    return {"stmt": f"{out} = clamp({body}, {lo}, {hi})", "where": where}


def _check_quantized(qx: torch.Tensor, qy: torch.Tensor, run, rows, cols, mode: str) -> None:
    """The integer rule against PyTorch's quantized kernel on random codes of the layer's own
    parameters (and the recorded run), so a kernel that is not the float rule (a channels-last
    path of its own) is refused rather than mismatched."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, qx.shape, generator=g, dtype=torch.int32)
    if qx.dtype == torch.qint8:
        codes -= 128
    probe = torch._make_per_tensor_quantized_tensor(
        codes.to(torch.uint8 if qx.dtype == torch.quint8 else torch.int8),
        qx.q_scale(),
        qx.q_zero_point(),
    )
    if qx.is_contiguous(memory_format=torch.channels_last) and qx.shape[1] > 1:
        probe = probe.contiguous(memory_format=torch.channels_last)
    for inp, out in ((probe, None), (qx, qy)):
        with torch.no_grad():
            got = (run(inp) if out is None else out).int_repr().numpy().astype(np.int64)
        want = bilinear_reference(inp.int_repr().numpy().astype(np.int64), rows, cols)
        lo, hi = (0, 255) if qx.dtype == torch.quint8 else (-128, 127)
        if not np.array_equal(got, np.clip(want, lo, hi)):
            raise SpecError(
                f"PyTorch's quantized {mode} kernel does not follow its float operator's weights "
                "on this layer (a kernel path of its own)"
            )


def bilinear_reference(codes: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """RNE(sum of weights times codes), exactly (the weights are dyadic)."""
    exact = np.einsum("oi,ncij,pj->ncop", rows, codes.astype(np.float64), cols)
    return np.round(exact).astype(np.int64)  # numpy rounds half to even
