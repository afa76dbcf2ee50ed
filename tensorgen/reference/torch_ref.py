"""The PyTorch reference: evaluates an op.yaml program with torch, independently of the compiler.

It reads only the IR of the spec (tensors and statements), never a schedule or
the microcode. Recognisable convolutions and contractions run as the aten op
itself (`conv2d`, `einsum`) in exact int64 arithmetic; everything else runs as
a vectorised gather/scatter over the statement's iteration domain. Statements
run in program order (shared loops outermost); a statement that reads what it
writes at another element runs point by point, in its own lexicographic order.

Arithmetic semantics (docs/op-yaml.md): int32 with wrap-around after every
operation; storing into a narrower tensor wraps; `requant(x, s, zp)` follows
PyTorch's qnnpack requantization (NUMERICS.md) and saturates to the LHS dtype.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from tensorgen.errors import TensorgenError
from tensorgen.ir.core import (
    Access,
    Affine,
    BinOp,
    Call,
    Const,
    Expr,
    Program,
    Read,
    Statement,
    dtype_range,
)
from tensorgen.reference import fbgemm

TORCH_DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32}


def wrap32(x: torch.Tensor) -> torch.Tensor:
    return ((x + 2**31) % 2**32) - 2**31


def wrap_to(x: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype == "float32":
        return x.to(torch.float32)
    bits = {"int8": 8, "uint8": 8, "int32": 32}[dtype]
    lo, _ = dtype_range(dtype)
    return ((x - lo) % (1 << bits)) + lo


def requant(acc: torch.Tensor, scale: float, zp: int, dtype: str) -> torch.Tensor:
    lo, hi = dtype_range(dtype)
    scaled = wrap32(acc).to(torch.int32).to(torch.float32) * torch.tensor(
        scale, dtype=torch.float32
    )
    return torch.clamp(_cvt_int32(scaled) + zp, lo, hi)


def _cvt_int32(x: torch.Tensor) -> torch.Tensor:
    """x86's float -> int32 conversion: round half to even; INT32_MIN outside int32 and for NaN
    (a multiplier >= 1 reaches it: x86's cvtps2dq, docs/numerics.md)."""
    r = torch.round(x.to(torch.float64))
    bad = ~((r >= -(2**31)) & (r <= 2**31 - 1))
    return torch.where(bad, torch.full_like(r, -(2**31)), r).to(torch.int64)


def check_work(program: Program) -> None:
    """Refuse, before anything runs, a program whose reference would take Python-level steps
    without bound: it runs every statement once per step of the shared loops."""
    from tensorgen.inputs import LIMITS

    steps = math.prod(n for _, n in program.shared_loops) * len(program.statements)
    if steps > LIMITS.reference_steps:
        raise TensorgenError(
            f"the PyTorch reference would run {steps:,} statement steps (shared-loop steps times "
            f"statements), over the limit of {LIMITS.reference_steps:,} "
            "(InputLimits.reference_steps in tensorgen/inputs.py)"
        )
    # every tensor held as int64 (or float32) while the reference runs, beside the inputs
    work = sum(math.prod(t.shape) * (4 if t.np_dtype.kind == "f" else 8) for t in program.tensors)
    if work > LIMITS.reference_bytes:
        raise TensorgenError(
            f"the PyTorch reference would hold {work:,} bytes of tensors (int64 working copies), "
            f"over the limit of {LIMITS.reference_bytes:,} "
            "(InputLimits.reference_bytes in tensorgen/inputs.py)"
        )


def evaluate(program: Program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `program` on `inputs`; returns every output and inout tensor."""
    check_work(program)
    env: dict[str, torch.Tensor] = {}
    for t in program.tensors:
        work = torch.float32 if t.np_dtype.kind == "f" else torch.int64
        if t.role in ("input", "inout"):
            env[t.name] = torch.as_tensor(np.asarray(inputs[t.name])).to(work)
        else:
            env[t.name] = torch.zeros(t.shape, dtype=work)
    shared = program.shared_loops
    for values in itertools.product(*(range(n) for _, n in shared)):
        fixed = dict(zip((n for n, _ in shared), values, strict=False))
        for stmt in program.statements:
            _run(program, stmt, fixed, env)
    return {t.name: env[t.name].numpy().astype(t.np_dtype) for t in program.outputs}


def _run(program: Program, stmt: Statement, fixed: dict[str, int], env) -> None:
    if not all(lo <= fixed[i] <= hi for i, (lo, hi) in _fixed_bounds(stmt, fixed)):
        return  # a where: on a shared loop excludes this step
    if stmt.where and _where_is_box(stmt):  # the bounds say it all: the aten fast paths apply
        stmt = replace(stmt, where="")
    if _self_dependent(stmt):
        for point in _points(stmt, fixed):
            _run_points(program, stmt, {k: torch.tensor([v]) for k, v in point.items()}, env)
        return
    if stmt.op == "+=" and not stmt.where and _fast_contraction(program, stmt, fixed, env):
        return
    grids = _grid(stmt, fixed)
    if any(a == stmt.lhs for a in stmt.reads):
        _run_rounds(program, stmt, fixed, grids, env)
        return
    _run_points(program, stmt, grids, env)


def _run_rounds(program: Program, stmt: Statement, fixed: dict[str, int], grids, env) -> None:
    """A statement that reads the element it writes, e.g. `Q[i] = X[t, i] + Q[i]` over t: every
    instance reads what the instance before it wrote. Instances run in rounds, one per value of
    the indices the LHS does not name (in lexicographic order), vectorised over the LHS indices;
    a round that writes an element twice (a non-injective LHS) runs point by point."""
    named = {n for sub in stmt.lhs.index for n in sub.names}
    others = [i for i in stmt.indices if i not in named and i not in fixed]
    n = len(next(iter(grids.values()))) if grids else 1
    key = torch.zeros(n, dtype=torch.int64)
    for i in others:  # mixed radix over the other indices: sorts like their lexicographic order
        lo, hi = stmt.bounds[stmt.indices.index(i)]
        key = key * (hi - lo + 1) + (grids[i] - lo)
    rounds, which = torch.unique(key, sorted=True, return_inverse=True)
    t = program.tensor(stmt.lhs.tensor)
    for r in range(len(rounds)):
        part = {k: v[which == r] for k, v in grids.items()}
        flat = (
            torch.zeros_like(next(iter(part.values())))
            if part
            else torch.zeros(1, dtype=torch.int64)
        )
        for a, size in zip(stmt.lhs.index, t.shape, strict=False):
            flat = flat * size + _subscript(a, part)
        if len(torch.unique(flat)) == len(flat):
            _run_points(program, stmt, part, env)
            continue
        for p in range(len(flat)):
            _run_points(program, stmt, {k: v[p : p + 1] for k, v in part.items()}, env)


def _self_dependent(stmt: Statement) -> bool:
    return any(a.tensor == stmt.lhs.tensor and a != stmt.lhs for a in stmt.reads)


def _points(stmt: Statement, fixed: dict[str, int]):
    grids = _grid(stmt, fixed)
    n = len(next(iter(grids.values()))) if grids else 1
    for i in range(n):
        yield {k: int(v[i]) for k, v in grids.items()}


def _grid(stmt: Statement, fixed: dict[str, int]) -> dict[str, torch.Tensor]:
    """Every point of the statement's domain, in lexicographic order, as flat index tensors."""
    # a shared-loop value outside the statement's bounds (a where: on the shared loop): no points
    ranges = [
        (torch.tensor([fixed[i]]) if lo <= fixed[i] <= hi else torch.zeros(0, dtype=torch.int64))
        if i in fixed
        else torch.arange(lo, hi + 1)
        for i, (lo, hi) in zip(stmt.indices, stmt.bounds, strict=False)
    ]
    _check_points(stmt, math.prod(len(r) for r in ranges))
    mesh = torch.meshgrid(*ranges, indexing="ij")
    grids = {i: m.reshape(-1) for i, m in zip(stmt.indices, mesh, strict=False)}
    if stmt.where:
        keep = _where_mask(stmt, grids)
        grids = {k: v[keep] for k, v in grids.items()}
    return grids


def _fixed_bounds(stmt: Statement, fixed: dict[str, int]):
    return [(i, b) for i, b in zip(stmt.indices, stmt.bounds, strict=False) if i in fixed]


def _where_is_box(stmt: Statement) -> bool:
    """The domain is the box of the statement's bounds (the loader intersects a where:'s bounds
    into them): `0 <= h < 17` restricts nothing the bounds do not already say."""
    from tensorgen.ir import poly

    return poly.domain(stmt).is_equal(poly.domain(replace(stmt, where="")))


def _check_points(stmt: Statement, n: int) -> None:
    """Refuse before allocating: the reference evaluates a statement as index tensors of n points
    (8 bytes per index and point, a few temporaries), so n is bounded by a limit."""
    from tensorgen.inputs import LIMITS

    if n > LIMITS.reference_points:
        raise TensorgenError(
            f"{stmt.name} '{stmt.text[:60]}': the PyTorch reference would evaluate {n:,} points as "
            f"index tensors, over the limit of {LIMITS.reference_points:,} "
            "(InputLimits.reference_points in tensorgen/inputs.py; a contraction or convolution "
            "without a where: runs as one aten op and is not limited)"
        )


def _where_mask(stmt: Statement, grids: dict[str, torch.Tensor]) -> torch.Tensor:
    """Which points of the box satisfy the where:, vectorised: the domain's basic sets, each a
    conjunction of affine (in)equalities over the indices and integer divisions of them (isl's
    explicit divs: floor(affine / d)), evaluated over all the points at once."""
    import islpy as isl

    from tensorgen.ir import poly

    coords = [grids[i] for i in stmt.indices]
    n = len(coords[0]) if coords else 1
    mask = torch.zeros(n, dtype=torch.bool)
    bounds = [max(abs(lo), abs(hi)) for lo, hi in stmt.bounds]
    for bset in poly.domain(stmt).compute_divs().get_basic_sets():
        divs: list[torch.Tensor] = []
        for k in range(bset.dim(isl.dim_type.div)):
            aff = bset.get_div(k)
            den = int(aff.get_denominator_val().to_python())
            coef = [_coef(aff, isl.dim_type.in_, i, den) for i in range(len(coords))]
            dcoef = [_coef(aff, isl.dim_type.div, m, den) for m in range(aff.dim(isl.dim_type.div))]
            if den <= 0 or any(dcoef[k:]):  # isl orders divs so that each uses earlier ones only
                raise TensorgenError(
                    f"where: '{stmt.where[:60]}': an integer division isl leaves implicit"
                )
            dcoef = dcoef[:k]
            const = _coef(aff, None, 0, den)
            num = _affine(coef + dcoef, const, coords + divs, bounds, n)
            divs.append(torch.div(num, den, rounding_mode="floor"))
            bounds.append(max(abs(b) for b in bounds) * sum(map(abs, coef + dcoef)) + abs(const))
        keep = torch.ones(n, dtype=torch.bool)
        for c in bset.get_constraints():
            coef = [_coef(c, isl.dim_type.set, i) for i in range(len(coords))]
            coef += [_coef(c, isl.dim_type.div, m) for m in range(len(divs))]
            value = _affine(coef, _coef(c, None, 0), coords + divs, bounds, n)
            keep &= value == 0 if c.is_equality() else value >= 0
        mask |= keep
    return mask


def _coef(obj, kind, pos: int, scale: int = 1) -> int:
    """An integer coefficient (or the constant, kind None) of an isl constraint or div, times
    `scale` (a div's denominator: its coefficients are rationals over it)."""
    from fractions import Fraction

    val = obj.get_constant_val() if kind is None else obj.get_coefficient_val(kind, pos)
    return int(Fraction(str(val)) * scale)


def _affine(coef: list[int], const: int, values: list[torch.Tensor], bounds, n) -> torch.Tensor:
    """sum(coef * values) + const in int64, refused (not wrapped) if it could leave int64."""
    reach = abs(const) + sum(abs(c) * b for c, b in zip(coef, bounds, strict=False))
    if reach >= 1 << 62:
        raise TensorgenError(
            f"where: coefficients up to {max(map(abs, coef), default=0)} make its terms too large "
            "for the reference's int64 arithmetic"
        )
    out = torch.full((n,), const, dtype=torch.int64)
    for c, v in zip(coef, values, strict=False):
        if c:
            out = out + c * v
    return out


def _subscript(a: Affine, grids: dict[str, torch.Tensor]) -> torch.Tensor:
    out = torch.full_like(next(iter(grids.values())), a.const) if grids else torch.tensor([a.const])
    for name, c in a.terms:
        out = out + c * grids[name]
    return out


def _gather(program: Program, acc: Access, grids, env) -> torch.Tensor:
    t = program.tensor(acc.tensor)
    subs = [_subscript(a, grids) for a in acc.index]
    inside = torch.ones_like(subs[0], dtype=torch.bool)
    for s, n in zip(subs, t.shape, strict=False):
        inside &= (s >= 0) & (s < n)
    clipped = [torch.clamp(s, 0, n - 1) for s, n in zip(subs, t.shape, strict=False)]
    values = env[acc.tensor][tuple(clipped)]
    return torch.where(inside, values, torch.full_like(values, t.pad))


def _eval(program: Program, stmt: Statement, e: Expr, grids, env) -> torch.Tensor | int:
    if isinstance(e, Read):
        return _gather(program, e.access, grids, env)
    if isinstance(e, Const):
        return e.value
    if isinstance(e, BinOp):
        a, b = _eval(program, stmt, e.lhs, grids, env), _eval(program, stmt, e.rhs, grids, env)
        return _binop(e.op, torch.as_tensor(a), torch.as_tensor(b))
    assert isinstance(e, Call)
    if e.fn == "lut":  # the table's entry at the low byte of x (two's complement for int8)
        x = torch.as_tensor(_eval(program, stmt, e.args[0], grids, env))
        table = env[e.args[1].access.tensor].reshape(-1)
        return table[torch.remainder(x.to(torch.int64), 256)]
    args = [_eval(program, stmt, x, grids, env) for x in e.args]
    x = torch.as_tensor(args[0])
    if e.fn == "relu":
        return torch.clamp(x, min=0)
    if e.fn == "clamp":
        return torch.clamp(x, int(args[1]), int(args[2]))
    if e.fn in ("min", "max"):
        y = torch.as_tensor(args[1])
        return torch.minimum(x, y) if e.fn == "min" else torch.maximum(x, y)
    if e.fn in ("int8", "uint8"):
        return torch.clamp(x, *dtype_range(e.fn))
    if e.fn == "int32":
        return x
    if e.fn == "requant":
        return requant(x, float(args[1]), int(args[2]), program.tensor(stmt.lhs.tensor).dtype)
    if e.fn == "quantize":
        return _quantize(x, float(args[1]), int(args[2]), program.tensor(stmt.lhs.tensor).dtype)
    if e.fn == "dequantize":
        return _dequantize(x, float(args[1]), int(args[2]))
    if e.fn == "requant_fbgemm":  # float32 add then multiply, each rounded once; ties to even
        lo, hi = dtype_range(program.tensor(stmt.lhs.tensor).dtype)
        xf = wrap32(x).to(torch.int32).to(torch.float32) + torch.as_tensor(args[1]).to(
            torch.float32
        )
        scaled = xf * torch.as_tensor(args[2]).to(torch.float32)
        return torch.clamp(_cvt_int32(scaled) + int(args[3]), lo, hi)
    if e.fn == "requant_onednn":  # oneDNN's five float32 roundings; the float saturates
        lo, hi = dtype_range(program.tensor(stmt.lhs.tensor).dtype)
        s_src, d, zp = (torch.tensor(float(v), dtype=torch.float32) for v in args[3:6])
        wei, bias = (torch.as_tensor(v).to(torch.float32) for v in args[1:3])
        t = wrap32(x).to(torch.int32).to(torch.float32) * s_src * wei + bias
        t = torch.round((t * d + zp).to(torch.float64))
        return torch.clamp(t, lo, hi).to(torch.int64)
    if e.fn == "requant_fma":  # fbgemm's float rules with fused multiply-adds (fbgemm.py)
        lo, hi = dtype_range(program.tensor(stmt.lhs.tensor).dtype)
        return fbgemm.requant_fma(x, float(args[1]), int(args[2]), lo, hi)
    if e.fn == "add_fbgemm":
        return fbgemm.add_fbgemm(x, *args[1:7], int(args[7]))
    if e.fn == "add_fbgemm_scalar":
        return fbgemm.add_fbgemm_scalar(x, *args[1:7], int(args[7]))
    if e.fn == "rshift_round":  # qnnpack's rounding: asr, plus one when the remainder exceeds half
        shift = torch.clamp(torch.as_tensor(args[1]), 0, 31)
        mask = (torch.ones_like(shift) << shift) - 1
        remainder = (x & mask) - (x < 0).to(x.dtype)
        return (x >> shift) + (remainder > (mask >> 1)).to(x.dtype)
    raise ValueError(e.fn)


def _binop(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if op == "+":
        return wrap32(a + b)
    if op == "-":
        return wrap32(a - b)
    if op == "*":
        return wrap32(a * b)
    if op == ">>":
        return a >> torch.clamp(b, 0, 31)
    return wrap32(a << torch.clamp(b, 0, 31))


def _quantize(x: torch.Tensor, scale: float, zp: int, out: str) -> torch.Tensor:
    """PyTorch's own quantize_per_tensor, saturating to the LHS dtype `out`."""
    qdtype = {"uint8": torch.quint8, "int8": torch.qint8, "int32": torch.qint32}
    q = torch.quantize_per_tensor(x.to(torch.float32), scale, zp, qdtype[out])
    return q.int_repr().to(torch.int64)


def _dequantize(x: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    """PyTorch's own Tensor.dequantize(), of the integers held as uint8 when they fit."""
    lo, hi = dtype_range("uint8")
    held = torch.uint8 if int(x.min()) >= lo and int(x.max()) <= hi else torch.int8
    return torch._make_per_tensor_quantized_tensor(x.to(held), scale, zp).dequantize()


def _run_points(program: Program, stmt: Statement, grids, env) -> None:
    t = program.tensor(stmt.lhs.tensor)
    n = len(next(iter(grids.values()))) if grids else 1
    if n == 0:
        return
    values = torch.as_tensor(_eval(program, stmt, stmt.rhs, grids, env)).expand(n).clone()
    subs = tuple(_subscript(a, grids) for a in stmt.lhs.index)
    flat = torch.zeros(n, dtype=torch.int64)
    for s, size in zip(subs, t.shape, strict=False):
        flat = flat * size + s
    target = env[t.name].reshape(-1).clone()
    if stmt.op == "=":
        # the last write of an element in program order wins
        last = torch.full((target.numel(),), -1, dtype=torch.int64).scatter_reduce(
            0, flat, torch.arange(n), reduce="amax"
        )
        keep = last[flat] == torch.arange(n)
        target[flat[keep]] = values[keep]
    elif stmt.op == "+=":
        target = target.index_add(0, flat, values)
    elif t.dtype in ("int32", "float32"):
        target = target.scatter_reduce(0, flat, values, reduce="amax", include_self=True)
    else:
        target = _max_into_narrow(target, flat, values, t.dtype)
    env[t.name] = wrap_to(target, t.dtype).reshape(t.shape)


def _max_into_narrow(
    target: torch.Tensor, flat: torch.Tensor, values: torch.Tensor, dtype: str
) -> torch.Tensor:
    """`max=` into an 8-bit tensor: every instance stores (and wraps) its max, so the reduction is
    not one max of the int32 values: `wrap(max(wrap(max(z, a)), b))`. Instances that update the
    same element run in rounds, the r-th update of every element in round r, in program order."""
    order = torch.argsort(flat, stable=True)
    _, counts = torch.unique_consecutive(flat[order], return_counts=True)
    starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(len(flat)) - starts
    for r in range(int(counts.max())):
        pick = rank == r
        idx = flat[pick]
        target[idx] = wrap_to(torch.maximum(target[idx], values[pick]), dtype)
    return target


# --- aten fast paths --------------------------------------------------------------------------


def _operand(e: Expr) -> tuple[Access, int] | None:
    """`X[...]` or `X[...] - c` (a zero point): contractions the aten ops take after a shift."""
    if isinstance(e, Read):
        return e.access, 0
    if (
        isinstance(e, BinOp)
        and e.op == "-"
        and isinstance(e.lhs, Read)
        and isinstance(e.rhs, Const)
        and isinstance(e.rhs.value, int)
    ):
        return e.lhs.access, e.rhs.value
    return None


def _fast_contraction(program: Program, stmt: Statement, fixed, env) -> bool:
    rhs = stmt.rhs
    if not (isinstance(rhs, BinOp) and rhs.op == "*"):
        return False
    ops = _operand(rhs.lhs), _operand(rhs.rhs)
    if None in ops or stmt.lhs.tensor in (ops[0][0].tensor, ops[1][0].tensor):
        return False
    (xa, xs), (wa, ws) = ops
    shifted = {**env, xa.tensor: env[xa.tensor] - xs}
    shifted[wa.tensor] = (
        shifted[wa.tensor] - ws if wa.tensor != xa.tensor or ws != xs else shifted[wa.tensor]
    )
    if xa.tensor == wa.tensor and xs != ws:
        return False
    pads = {
        xa.tensor: program.tensor(xa.tensor).pad - xs,
        wa.tensor: program.tensor(wa.tensor).pad - ws,
    }
    result = _as_conv2d(program, stmt, xa, wa, shifted, pads) if not fixed else None
    if result is None:
        result = _as_einsum(program, stmt, (xa, wa), fixed, shifted)
    if result is None:
        return False
    out = env[stmt.lhs.tensor]
    region = tuple(
        slice(lo, hi + 1) if sub.bare() else None
        for sub, (lo, hi) in zip(
            stmt.lhs.index, [_bound(stmt, s) for s in stmt.lhs.index], strict=False
        )
    )
    if any(r is None for r in region):
        return False
    t = program.tensor(stmt.lhs.tensor)
    out[region] = wrap_to(out[region] + result, t.dtype)
    return True


def _bound(stmt: Statement, sub: Affine) -> tuple[int, int]:
    name = sub.bare()
    return stmt.bounds[stmt.indices.index(name)] if name else (0, 0)


def _as_einsum(program, stmt, accesses, fixed, env) -> torch.Tensor | None:
    """Contractions whose subscripts are all bare indices or shared-loop indices plus constants."""
    letters = {}
    operands, specs = [], []
    for acc in accesses:
        index, spec = [], ""
        for sub in acc.index:
            name = sub.bare()
            if name is not None and name not in fixed:
                letters.setdefault(name, chr(ord("a") + len(letters)))
                lo, hi = stmt.bounds[stmt.indices.index(name)]
                index.append(slice(lo, hi + 1))
                spec += letters[name]
            elif all(n in fixed for n in sub.names):
                index.append(sum(c * fixed[n] for n, c in sub.terms) + sub.const)
            else:
                return None
        tensor = program.tensor(acc.tensor)
        for i, n in zip(index, tensor.shape, strict=False):
            if isinstance(i, int) and not 0 <= i < n or isinstance(i, slice) and i.stop > n:
                return None
        operands.append(env[acc.tensor][tuple(index)])
        specs.append(spec)
    out = ""
    for sub in stmt.lhs.index:
        name = sub.bare()
        if name is None or name not in letters:
            return None
        out += letters[name]
    return wrap32(torch.einsum(f"{specs[0]},{specs[1]}->{out}", *operands))


def _as_conv2d(program, stmt, xa: Access, wa: Access, env, pads) -> torch.Tensor | None:
    """`Y[n,k,h,w] += X[n,c,s*h+d*r+o, s*w+d*q+o'] * W[k,c,r,q]`, plain or depthwise."""
    for x, w in ((xa, wa), (wa, xa)):
        got = _match_conv(program, stmt, x, w)
        if got is not None:
            return _conv(program, stmt, x, w, got, env, pads[x.tensor])
    return None


def _match_conv(program, stmt, x: Access, w: Access):
    lhs = [s.bare() for s in stmt.lhs.index]
    if len(lhs) != 4 or None in lhs or len(x.index) != 4 or len(w.index) != 4:
        return None
    n, k, h, wi = lhs
    if x.index[0].bare() != n:
        return None
    c = x.index[1].bare()
    wk, wc, r, q = (s.bare() for s in w.index)
    depthwise = c == k and wk == k and w.index[1] == Affine((), 0)
    if not depthwise and not (wk == k and wc == c and c not in lhs):
        return None
    if r is None or q is None or r in lhs or q in lhs:
        return None
    spatial = []
    for sub, out_i, red_i in ((x.index[2], h, r), (x.index[3], wi, q)):
        if set(sub.names) != {out_i, red_i}:
            return None
        spatial.append((sub.coef(out_i), sub.coef(red_i), sub.const))
    if any(s <= 0 or d <= 0 for s, d, _ in spatial):
        return None
    return depthwise, spatial, (n, k, h, wi, c, r, q)


def _conv(program, stmt, x: Access, w: Access, got, env, pad: int) -> torch.Tensor:
    depthwise, spatial, (n, k, h, wi, c, r, q) = got
    xt = program.tensor(x.tensor)
    bounds = {name: stmt.bounds[stmt.indices.index(name)] for name in (n, k, h, wi, r, q)}
    X = env[x.tensor]
    nlo, nhi = bounds[n]
    X = X[nlo : nhi + 1]
    # the window of input rows/cols each spatial dim reads, padded with X's pad value
    windows = []
    for (s, d, off), (out_i, red_i) in zip(spatial, ((h, r), (wi, q)), strict=False):
        (olo, ohi), (rlo, rhi) = bounds[out_i], bounds[red_i]
        windows.append((s * olo + d * rlo + off, s * ohi + d * rhi + off))
    (h0, h1), (w0, w1) = windows
    H, W = xt.shape[2], xt.shape[3]
    pads = (max(0, -w0), max(0, w1 - W + 1), max(0, -h0), max(0, h1 - H + 1))
    Xp = F.pad(X, pads, value=pad)
    Xp = Xp[:, :, h0 + pads[2] : h1 + pads[2] + 1, w0 + pads[0] : w1 + pads[0] + 1]
    (rlo, rhi), (qlo, qhi) = bounds[r], bounds[q]
    (klo, khi) = bounds[k]
    if depthwise:
        Wt = env[w.tensor][klo : khi + 1, 0:1, rlo : rhi + 1, qlo : qhi + 1]
        Xp = Xp[:, klo : khi + 1]
        groups = khi - klo + 1
    else:
        clo, chi = stmt.bounds[stmt.indices.index(c)]
        Wt = env[w.tensor][klo : khi + 1, clo : chi + 1, rlo : rhi + 1, qlo : qhi + 1]
        Xp = Xp[:, clo : chi + 1]
        groups = 1
    out = F.conv2d(
        Xp,
        Wt,
        stride=(spatial[0][0], spatial[1][0]),
        dilation=(spatial[0][1], spatial[1][1]),
        groups=groups,
    )
    return wrap32(out)
