"""Band fusion with kept halos: a group run per band of its last layer's rows (as recompute.py)
whose producers compute, per band, only the rows no band before computed, the rows two bands
read (the halo) carried from one band to the next on chip instead of computed again.

The rewrite is recompute.py's (a shared outermost loop `band`, one buffer per band of every
tensor a producer writes, the tile layer as there), with three changes:
- each producer of a halo tensor T runs twice: in the first band its whole window (the `count`
  rows its readers read there, as recomputed), from the second on its last `step` rows only,
  the rows no band before computed. Each of the two has statements of its own (the first
  band peeled: one domain each, every buffer's origin one affine function of the band), its
  own accumulators, and its own port of each activation it reads (bound to the same value;
  the first band's staged whole: its box is that band's, loaded once); an input another layer
  reads too (a residual block's input) gets a port of its own from the second band on as well;
  the weights both read are staged whole;
- a carry tensor H_T (role none, `count - step` rows, no band dimension, staged whole in its
  band buffer's layout) takes the other rows over: a copy-out after the producer, `H_T[u] =
  T[band, .., step*band + start + step + u, ..]`, and a copy-in, `T[band, .., step*band +
  start + u, ..] = H_T[u]` from the second band on, both clipped to the image. They carry a
  dependence band -> band+1 (isl accepts the schedule in band order only); fused_schedule runs
  each as vector instructions of its innermost loops;
- no row is computed twice, none above the image (the first band's rows numbered from the
  image's first: its blocks' origins are those of one band).
The price: the copies on the vector unit, a second port's DMAs of an activation the first
band reads (its buffer, and the other bands' buffer loaded in the first band too), and the
weights held whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tensorgen.fusion.recompute import _expr, _instances, _moved, _row, _Span, recompute
from tensorgen.fusion.tiled import BAND, TileError
from tensorgen.ir import poly
from tensorgen.ir.core import Access, Affine, Program, Read, Statement


@dataclass(frozen=True)
class _Plan:
    """What keep's rewrite is made of: recompute's rewrite (`banded`), the layers' statements,
    the tensors the producers write (by layer; `local`: only their own layer reads them), each
    layer's window per band (`spans`) and the rows it runs from the second band on (`runs`),
    and the halo tensors carried (their windows)."""

    program: Program
    offsets: tuple[int, ...]
    banded: Program
    layers: list
    layer_of: dict[str, int]
    written: dict[str, int]
    local: set[str]
    spans: dict[int, _Span]
    runs: dict[int, _Span]
    carried: dict[str, _Span]

    @property
    def bands(self) -> int:
        return dict(self.banded.shared_loops)[BAND]


def keep(program: Program, offsets: tuple[int, ...], rows: int) -> tuple[Program, tuple]:
    """`program` (a group's merged program, its layers from `offsets` on) run per band of `rows`
    output rows of its last layer, its producers' halos kept from the band before (see the
    module's docstring); with the layers' new offsets (each one's first band's statements
    first; its other bands' from `meta["steady"][i]` on; the copies after them)."""
    plan = _plan(program, offsets, rows)
    firsts, steadies = _aliases(plan)
    statements, new_offsets, steady = _statements(plan, firsts, steadies)
    copies = tuple(st.name for st in statements if st.text.startswith("carry "))
    out = replace(
        plan.banded,
        tensors=_tensors(plan, firsts, steadies),
        statements=tuple(statements),
        meta={
            **plan.banded.meta,
            "band_runs": tuple(
                (sp.step, sp.start, sp.count) for _, sp in sorted(plan.runs.items())
            ),
            "carries": {f"H_{t}": t for t in sorted(plan.carried)},
            "copies": copies,
            "steady": steady,  # layer -> its statements' offset from the second band on
            "firsts": firsts,  # an accumulator or input -> the first band's
            "steadies": steadies,  # an input other layers read too -> the other bands' port
        },
    )
    return out, tuple(new_offsets)


def _plan(program: Program, offsets: tuple[int, ...], rows: int) -> _Plan:
    banded = recompute(program, offsets, rows)  # what it refuses, a kept halo refuses too
    ends = (*offsets[1:], len(program.statements))
    layers = [program.statements[a:b] for a, b in zip(offsets, ends, strict=True)]
    layer_of = {st.name: i for i, layer in enumerate(layers) for st in layer}
    readers: dict[str, set[int]] = {}
    for st in program.statements:
        for acc in st.reads:
            readers.setdefault(acc.tensor, set()).add(layer_of[st.name])
    written = {st.lhs.tensor: layer_of[st.name] for st in program.statements[: offsets[-1]]}
    local = {t for t, i in written.items() if readers.get(t, set()) <= {i}}
    spans = {i: _Span(*sp) for i, sp in enumerate(banded.meta["band_spans"])}
    carried, runs = {}, dict(spans)
    for i in range(len(layers) - 1):
        sp = spans[i]
        if sp.count > sp.step and dict(banded.shared_loops)[BAND] > 1:
            carried.update({t: sp for t, j in written.items() if j == i and t not in local})
            runs[i] = _Span(sp.step, sp.start + sp.count - sp.step, sp.step)  # the last `step`
    if not carried:
        raise TileError(f"kept halo: bands of {rows} rows carry no row a band before computed")
    return _Plan(program, offsets, banded, layers, layer_of, written, local, spans, runs, carried)


def _aliases(plan: _Plan) -> tuple[dict[str, str], dict[str, str]]:
    """The first band's statements have accumulators of their own (of the window's rows) and
    ports of their own of the activations they read (bound to the same values): staged by the
    layer's schedule, the first band's footprints start elsewhere (not one affine origin with
    the other bands'). An input another layer reads too (a residual block's input) is read from
    the second band on through a port of its own as well: the other layer's footprint in the
    first band (no halo columns) and the producer's in the others would have no one origin."""
    program, layer_of, local = plan.program, plan.layer_of, plan.local

    def peeled(st) -> bool:
        return plan.runs[layer_of[st.name]] != plan.spans[layer_of[st.name]]

    firsts = {}
    for st in program.statements[: plan.offsets[-1]]:
        if peeled(st):
            h = _row(st)
            for acc in [st.lhs, *st.reads]:
                rows = len(acc.index) == 4 and acc.index[2].coef(h) != 0  # not a weight
                if acc.tensor in local or (program.tensor(acc.tensor).role == "input" and rows):
                    firsts[acc.tensor] = f"{acc.tensor}_first"
    others = {a.tensor for st in program.statements if not peeled(st) for a in st.reads}
    steadies = {t: f"{t}_steady" for t in firsts if t not in local and t in others}
    return firsts, steadies


def _statements(plan: _Plan, firsts: dict, steadies: dict) -> tuple[list, list, dict]:
    """The rewritten statements (named by their place), the layers' offsets, and where each
    peeled layer's statements from the second band on start."""
    statements, new_offsets, steady = [], [], {}
    written, local, bands, last = plan.written, plan.local, plan.bands, len(plan.layers) - 1
    for i, layer in enumerate(plan.layers):
        new_offsets.append(len(statements))
        if i == last:
            statements += plan.banded.statements[plan.offsets[-1] :]
            break
        if plan.runs[i] != plan.spans[i]:
            for st in layer:
                span = _first_band(plan.spans[i])
                first = _kept_statement(st, written, local, span, bands, f"{BAND} <= 0")
                statements.append(_renamed(first, firsts))
            steady[i] = len(statements)
        which = f"{BAND} >= 1" if i in steady else ""
        for st in layer:
            st = _kept_statement(st, written, local, plan.runs[i], bands, which)
            statements.append(_renamed(st, steadies if i in steady else {}))
        for t in sorted(t for t in plan.carried if written[t] == i):
            statements += _copies(plan.program, t, plan.spans[i], plan.runs[i], bands)
    statements = [replace(st, name=f"S{k}") for k, st in enumerate(statements)]
    return statements, new_offsets, steady


def _first_band(span: _Span) -> _Span:
    """The rows of the window `span` inside the image in the first band (its rows numbered
    from the image's first: no row above it computed, its blocks' origins those of one band)."""
    lo = max(span.start, 0)
    return _Span(span.step, lo, span.count - (lo - span.start))


def _tensors(plan: _Plan, firsts: dict, steadies: dict) -> tuple:
    """recompute's tensors, the aliases' and the carries'; an accumulator of the other bands
    holds the rows its layer runs there."""
    tensors = []
    for t in plan.banded.tensors:
        if t.name in firsts and t.name in plan.local:  # the first band's rows
            count = _first_band(plan.spans[plan.written[t.name]]).count
            tensors.append(
                replace(t, name=firsts[t.name], shape=(*t.shape[:3], count, *t.shape[4:]))
            )
        elif t.name in firsts:
            tensors.append(replace(t, name=firsts[t.name]))
        if t.name in steadies:
            tensors.append(replace(t, name=steadies[t.name]))
        if t.name in plan.local and t.name in firsts:
            count = plan.runs[plan.written[t.name]].count
            t = replace(t, shape=(*t.shape[:3], count, *t.shape[4:]))
        tensors.append(t)
    for t in sorted(plan.carried):
        src, sp = plan.program.tensor(t), plan.runs[plan.written[t]]
        k = plan.spans[plan.written[t]].count - sp.count
        tensors.append(replace(src, name=f"H_{t}", shape=(*src.shape[:2], k, *src.shape[3:])))
    return tuple(tensors)


def _renamed(st: Statement, names: dict[str, str]) -> Statement:
    """`st` with the tensors `names` maps renamed."""

    def access(acc: Access) -> Access:
        return replace(acc, tensor=names.get(acc.tensor, acc.tensor))

    return replace(st, lhs=access(st.lhs), rhs=_expr(st.rhs, access))


def _kept_statement(
    st: Statement, written, local, span: _Span, bands: int, which: str = ""
) -> Statement:
    """`st` run per band over `span`'s rows (recompute's `_moved`), clipped to the image's rows:
    a statement writing a band-local accumulator clipped below only (its blocks of rows start
    with the band's: rows above the image computed from the pad, never stored)."""
    h = _row(st)
    g = f"{h} + {span.step}*{BAND} + {span.start}"
    last = dict(zip(st.indices, st.bounds, strict=True))[h][1]
    clip = f"{g} <= {last}" if st.lhs.tensor in local else f"0 <= {g} <= {last}"
    return _moved(st, written, local, span, bands, " and ".join(w for w in (which, clip) if w))


def _copies(program: Program, tensor: str, span: _Span, run: _Span, bands: int) -> list:
    """The copy-in (the carried rows of `tensor`'s window `span` into this band's buffer, from
    the second band on) and the copy-out (the rows the next band carries, out of this band's
    buffer), clipped to the image; `run`: the rows the producer computes per band."""
    t = program.tensor(tensor)
    n, c, height, width = t.shape
    k = run.start - span.start  # the window's rows before those the producer computes
    carry = f"H_{tensor}"
    box = {"n": (0, n - 1), "c": (0, c - 1), "u": (0, k - 1), "w": (0, width - 1)}

    def band_row(const: int) -> Affine:
        return Affine.of({BAND: span.step, "u": 1}, span.start + const)

    def rows_at(const: int) -> str:
        return f"0 <= u + {span.step}*{BAND} + {span.start + const} <= {height - 1}"

    here = (Affine.of({BAND: 1}), Affine.of({"n": 1}), Affine.of({"c": 1}))
    cols = (Affine.of({"w": 1}),)
    carry_at = (Affine.of({"n": 1}), Affine.of({"c": 1}), Affine.of({"u": 1}), *cols)
    indices = (BAND, "n", "c", "u", "w")
    bounds = ((0, bands - 1), *(box[i] for i in indices[1:]))
    copy_in = Statement(
        "copy_in",
        Access(tensor, (*here, band_row(0), *cols)),
        "=",
        Read(Access(carry, carry_at)),
        indices,
        bounds,
        f"{BAND} >= 1 and {rows_at(0)}",
        f"carry {carry} into {tensor}",
    )
    copy_out = Statement(
        "copy_out",
        Access(carry, carry_at),
        "=",
        Read(Access(tensor, (*here, band_row(span.step), *cols))),
        indices,
        bounds,
        f"{BAND} <= {bands - 2} and {rows_at(span.step)}",
        f"carry {tensor} into {carry}",
    )
    return [copy_in, copy_out]


def copy_elements(kept: Program, name: str) -> int:
    """The elements the copy statement `name` of `kept` moves over all bands (isl's count)."""
    st = next(s for s in kept.statements if s.name == name)
    return int(poly.domain(st).count_val().to_python())


def kept_extra_macs(program: Program, kept: Program) -> int:
    """The MACs (instances of `+=` statements) `kept` (keep's rewrite of `program`) runs beyond
    `program`'s: its first band's row above the image (as recomputed halos' first band)."""
    # a banded statement's rows: its lhs's (N, C, H, W after the band) next to last index
    new = sum(_instances(st, st.lhs.index[-2].bare()) for st in kept.statements if st.op == "+=")
    return new - sum(
        math.prod(hi - lo + 1 for lo, hi in st.bounds) for st in program.statements if st.op == "+="
    )
