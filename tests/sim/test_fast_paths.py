"""The simulator's fast paths (runs of MATMULs as one BLAS call, reduction nests at once, the
fast MATMUL kernel) against stepping every instruction through its semantics: over random
programs of the compiler's instruction mix, the same outputs, every counter, the trace
events and the DRAM channel -- or the same error, hazards included -- with the products on
either arithmetic (`tensorgen.sim.products`: int8 on torch._int_mm, or float32 BLAS)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.mc.binary import assemble
from tensorgen.sim import batch, loops, products, rowruns
from tensorgen.sim.machine import Simulator, simulate
from tensorgen.sim.products import exact_product
from tensorgen.target import ISA_DIR, target_from_dict


def _tiny(buffers: int):
    d = yaml.safe_load((ISA_DIR / "tiny.yaml").read_text())
    d["mac_array"]["weight_buffers"] = buffers
    return target_from_dict(d, "tiny.yaml")


TARGETS = {n: _tiny(n) for n in (1, 2)}
ARITHS = ["float32", "int_mm"]


@contextlib.contextmanager
def arithmetic(name: str):
    """Products on float32 BLAS, or on torch._int_mm whatever their size (the random
    programs' tiles are far below `products.MIN_INT_MACS`) and its speed (slower than
    float32 on CPUs without VNNI, where the products would not take it)."""
    saved = products.ENABLED, products.MIN_INT_MACS, products.ONLY_WHERE_FASTER
    products.ENABLED, products.MIN_INT_MACS = name == "int_mm", 0
    products.ONLY_WHERE_FASTER = False
    try:
        yield
    finally:
        products.ENABLED, products.MIN_INT_MACS, products.ONLY_WHERE_FASTER = saved


@dataclass(frozen=True)
class Case:
    buffers: int
    xd: str  # dtype of X
    a_zp: int
    b_zp: int
    outer: bool  # an outer LOOP over two row blocks
    acc_moves: bool  # the row blocks use their own accumulators (else: a WAR hazard on acc)
    nest: str  # what follows the first MATMUL: loop | loopb | pair | none
    acc0: int  # the first MATMUL's accumulate
    peel_waits: bool  # the first MATMUL carries the LD token itself
    vmac: bool  # a VMAC reduction nest too
    drop: str  # a token left out: none | ld (EX reads weights in flight) | st (the store races)
    # a LOOP of two around the MATMULs: none | moves (acc@256 and A two rows further next) |
    # shared (only acc moves: one A for both) | still (nothing moves: each needs the one before)
    group: str = "none"


def _vmac_lines(c: Case, g: int) -> list[str]:
    """A VMUL/VMAC reduction into acc@512 at loop level `g`: a perfect nest and a LOOPB one."""
    return [
        "VMUL dst=acc:int32@512[4x4:4,1] a=spad:int8@0[4x4:16,1] b=- imm=-3",
        f"VMUL dst=acc:int32@512[4x4:4,1] a=acc:int32@512[4x4:4,1] b=spad:{c.xd}@4[4x4:16,1] imm=0",
        "LOOP count=3 body=1",
        f"VMAC dst=acc:int32@512[4x4:4,1] a=spad:int8@4*L{g}[4x4:16,1] b=spad:int8@128+16*L{g}[4x4:4,1]",
        "LOOP count=2 body=2",  # LOOPB: not a perfect nest, each VMAC on its own
        f"LOOPB lower=B(1-L{g}/1) upper=B(1/1) body=1",
        f"VMAC dst=acc:int32@512[4x4:4,1] a=spad:int8@8*L{g}+4*L{g + 1}[4x4:16,1] b=spad:int8@128[4x4:0,0]",
    ]


def _program(c: Case) -> str:
    g = 1 if c.outer else 0  # the level of the group loop
    d = g + (c.group != "none")  # the level of the inner loops
    row = "+64*L0" if c.outer else ""
    acc = ("+64*L0" if c.acc_moves else "") if c.outer else ""
    grp = f"+256*L{g}" if c.group in ("moves", "shared") else ""
    a_grp = f"+32*L{g}" if c.group in ("moves", "still") else ""

    def mm(a: str, b: str, accumulate: int, tokens: str = "") -> str:
        return (
            f"MATMUL acc=acc:int32@0{acc}{grp}[4x4:4,1] a=spad:{c.xd}@{a}{row}{a_grp}[4x4:16,1] "
            f"b=spad:int8@{b}[4x4:4,1] accumulate={accumulate} a_zp={c.a_zp} b_zp={c.b_zp} {tokens}"
        )

    waits = c.drop != "ld"  # else EX reads what LD is still writing: a hazard
    ex = [mm("0", "128", c.acc0, "wait=LD" if waits and c.peel_waits and not c.outer else "")]
    if c.nest == "loop":
        ex += ["LOOP count=3 body=1", mm(f"4+4*L{d}", f"144+16*L{d}", 1)]
    elif c.nest == "loopb":  # the peeled product is the triangle's missing corner
        ex += [
            "LOOP count=2 body=2",
            f"LOOPB lower=B(1-L{d}/1) upper=B(1/1) body=1",
            mm(f"8*L{d}+4*L{d + 1}", f"128+32*L{d}+16*L{d + 1}", 1),
        ]
    elif c.nest == "pair":
        ex += [mm("4", "144", 1), mm("8", "160", 1)]
    if c.group != "none":  # every MATMUL so far in a loop: its iterations at once
        ex = [f"LOOP count=2 body={len(ex)}"] + ex
    if c.vmac:
        ex += _vmac_lines(c, g)
    store_wait = "" if c.drop == "st" else "wait=EX"
    ex += [
        "SYNC queue=1 signal=ST" if c.drop != "st" else "SYNC queue=1",
        f"STORE dst=C({'4*L0' if c.outer else '0'},0)[4x4] src=acc:int32@0{acc}[4x4:4,1] {store_wait}",
    ]
    if c.group in ("moves", "shared"):
        ex += [
            "SYNC queue=1 signal=ST",
            f"STORE dst=E(0,0)[4x4] src=acc:int32@256{acc}[4x4:4,1] wait=EX",
        ]
    if c.outer:
        ex = [f"LOOP count=2 body={len(ex)}"] + ex
    if waits and (not c.peel_waits or c.outer):
        ex = ["SYNC queue=1 wait=LD"] + ex
    if c.vmac:
        ex += [
            "SYNC queue=1 signal=ST",
            "STORE dst=D(0,0)[4x4] src=acc:int32@512[4x4:4,1] wait=EX",
        ]
    head = f""".target tiny {TARGETS[c.buffers].hash.hex()}
.dram 448
.tensor X {c.xd} 8x16 input dram=0 pad=0
.tensor W int8 16x4 input dram=128 pad=0
.tensor C int32 8x4 output dram=192 pad=0
.tensor D int32 4x4 output dram=320 pad=0
.tensor E int32 4x4 output dram=384 pad=0
LOAD dst=spad:{c.xd}@0[8x16:16,1] src=X(0,0)[8x16]
LOAD dst=spad:int8@128[16x4:4,1] src=W(0,0)[16x4] {"" if c.drop == "ld" else "signal=EX"}
"""
    return head + "\n".join(ex) + "\n"


CASES = st.builds(
    Case,
    buffers=st.sampled_from([1, 2]),
    xd=st.sampled_from(["int8", "uint8"]),
    a_zp=st.sampled_from([0, 3, 128, -(2**23)]),  # the last: int32 sums wrap (semantics run)
    b_zp=st.sampled_from([0, -2]),
    outer=st.booleans(),
    acc_moves=st.booleans(),
    nest=st.sampled_from(["loop", "loopb", "pair", "none"]),
    acc0=st.sampled_from([0, 0, 1]),
    peel_waits=st.booleans(),
    vmac=st.booleans(),
    drop=st.sampled_from(["none", "none", "ld", "st"]),
    group=st.sampled_from(["none", "moves", "shared", "still"]),
)


@settings(max_examples=120, deadline=None)
@given(case=CASES, seed=st.integers(0, 2**16), arith=st.sampled_from(ARITHS))
def test_fast_paths_equal_stepping(case: Case, seed: int, arith: str, outcome) -> None:
    with arithmetic(arith):
        _fast_paths_equal_stepping(case, seed, outcome)


def _fast_paths_equal_stepping(case: Case, seed: int, outcome) -> None:
    binary = assemble(_program(case))
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 128) if case.xd == "int8" else (0, 256)
    inputs = {
        "X": rng.integers(lo, hi, (8, 16)).astype(case.xd),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }
    target = TARGETS[case.buffers]
    fast = outcome(binary, inputs, target, True)
    assert fast == outcome(binary, inputs, target, False)
    # a second run of the same binary takes the plans the first one kept (`sim.static`):
    # on other inputs, still stepping's values, counters, events and errors
    again = {k: rng.permutation(v.ravel()).reshape(v.shape) for k, v in inputs.items()}
    assert outcome(binary, again, target, True) == outcome(binary, again, target, False)
    if (
        fast[0] != "error"
        and case.drop == "none"
        and not (case.outer and not case.acc_moves)
        and case.group != "still"
        and case.acc0 == 0
    ):
        # and the values are the product itself (the first block of rows; the group loop's
        # second iteration: two rows further, in E)
        x = inputs["X"].astype(np.int64) - case.a_zp
        w = inputs["W"].astype(np.int64) - case.b_zp
        k = {"loop": 16, "loopb": 16, "pair": 12, "none": 4}[case.nest]
        want = (x[:4, :k] @ w[:k]).astype(np.int32)  # wrapped
        np.testing.assert_array_equal(np.array(fast[0]["C"])[:4], want)
        if case.group in ("moves", "shared") and not case.outer:
            rows = slice(2, 6) if case.group == "moves" else slice(0, 4)
            want = (x[rows, :k] @ w[:k]).astype(np.int32)
            np.testing.assert_array_equal(np.array(fast[0]["E"]), want)


def test_the_hazard_checks_run_on_both_paths(outcome) -> None:
    """The random programs above reach errors on both paths, hazards among them."""
    c = Case(1, "int8", 0, 0, True, True, "loopb", 0, False, False, "st")
    binary = assemble(_program(c))
    inputs = {"X": np.ones((8, 16), np.int8), "W": np.ones((16, 4), np.int8)}
    fast = outcome(binary, inputs, TARGETS[1], True)
    assert fast[0] == "error" and "hazard" in fast[1]
    assert fast == outcome(binary, inputs, TARGETS[1], False)


def test_exact_product_chunks_k_beyond_the_float32_bound() -> None:
    """float32 is exact below 2**24: a long K is summed in chunks, wrapping like int32."""
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (3, 5000)).astype(np.float32)
    w = rng.integers(-128, 128, (5000, 2)).astype(np.float32)
    expected = (x.astype(np.int64) @ w.astype(np.int64)).astype(np.int32)
    np.testing.assert_array_equal(exact_product(x, w, 128 * 128), expected)
    big = np.full((1, 4), 2**15, np.float32)  # products 2**30: the int32 sum wraps
    np.testing.assert_array_equal(exact_product(big, big.T.copy(), 2**30), [[0]])  # 2**32


@pytest.mark.parametrize("nest", ["loop", "loopb", "pair", "none"])
def test_a_loop_of_runs_runs_at_once(nest: str, monkeypatch, outcome) -> None:
    """The group loop of the random programs takes the batched path (`sim.loops`) when its
    accumulators move, and is declined when they do not; both equal stepping."""
    taken = []
    real = loops.run_loop
    monkeypatch.setattr(loops, "run_loop", lambda *a: taken.append(real(*a)) or taken[-1])
    shared, real_shared = [], batch._reduce_shared
    monkeypatch.setattr(batch, "_reduce_shared", lambda *a: shared.append(real_shared(*a)))
    rng = np.random.default_rng(1)
    inputs = {
        "X": rng.integers(-128, 128, (8, 16)).astype(np.int8),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }
    for group, expected in (("moves", [True]), ("shared", [True]), ("still", [False])):
        c = Case(2, "int8", 3, -2, False, False, nest, 0, False, False, "none", group)
        binary = assemble(_program(c))
        taken.clear()
        fast = outcome(binary, inputs, TARGETS[2], True)
        assert taken == expected
        assert len(shared) == (group == "shared")  # one A for every iteration: one product
        shared.clear()
        assert fast[0] != "error" and fast == outcome(binary, inputs, TARGETS[2], False)


@settings(max_examples=100, deadline=None)
@given(
    batch_n=st.integers(0, 4),
    m=st.sampled_from([(1,), (3,), (2, 5), (4, 6), (1, 3)]),
    k=st.sampled_from([(4,), (3, 2)]),
    n=st.integers(1, 5),
    channel_major=st.booleans(),
    padded=st.booleans(),
    shared=st.sampled_from(["none", "a", "b"]),
    a_dtype=st.sampled_from(["int8", "uint8"]),
    zps=st.tuples(st.sampled_from([-3, 0, 2, 128, 255]), st.integers(-3, 3)),
    accumulate=st.integers(0, 1),
    seed=st.integers(0, 2**16),
    arith=st.sampled_from(ARITHS),
)
def test_products_equal_int64_in_either_orientation(
    batch_n, m, k, n, channel_major, padded, shared, a_dtype, zps, accumulate, seed, arith
) -> None:
    """`reduce_into` (unbatched, batched, a batch against one A or one B) equals int64 arithmetic
    whether A's K axis (row-major activations) or its M axis (channel-major: the transposed
    product) is the contiguous one -- in rows of a padded tile or not (`rowruns.rows_merge`) --,
    accumulating or not, int8 or uint8 activations, with zero points, wrapping like int32, on
    either arithmetic."""
    rng = np.random.default_rng(seed)
    lead = (batch_n,) if batch_n else ()
    shape = (*lead, *m, *k)
    lo, hi = (-128, 128) if a_dtype == "int8" else (0, 256)
    a_full = rng.integers(lo, hi, shape).astype(a_dtype)
    if shared == "a" and batch_n:
        a_full = np.ascontiguousarray(np.broadcast_to(a_full[:1], shape))
    if channel_major:  # K axes outermost in memory, then the batch, M innermost
        nk, nd, nl = len(k), len(shape), len(lead)
        order = (*range(nd - nk, nd), *range(nl), *range(nl, nd - nk))
        memory = np.ascontiguousarray(a_full.transpose(order))
        if padded:  # two bytes of other values after each row of the innermost M axis
            wide = rng.integers(lo, hi, (*memory.shape[:-1], memory.shape[-1] + 2))
            wide = wide.astype(a_dtype)
            wide[..., : memory.shape[-1]] = memory
            memory = wide[..., : memory.shape[-1]]
        a = memory.transpose(np.argsort(order))
        assert m[-1] == 1 or abs(a.strides[-1]) > abs(a.strides[-1 - nk])
    else:
        a = a_full
    if shared == "a" and batch_n:
        a = np.broadcast_to(a[:1], shape)  # stride 0 on the batch axis
    if shared == "b" and batch_n:
        b_full = np.broadcast_to(rng.integers(-128, 128, (*k, n)).astype(np.int8), (*lead, *k, n))
    else:
        b_full = rng.integers(-128, 128, (*lead, *k, n)).astype(np.int8)
    acc = rng.integers(-(2**31), 2**31, (*lead, *m, n)).astype(np.int32)
    ai = a_full.astype(np.int64).reshape(*lead, math.prod(m), math.prod(k)) - zps[0]
    bi = b_full.astype(np.int64).reshape(*lead, math.prod(k), n) - zps[1]
    want = (ai @ bi).reshape(acc.shape) + (acc.astype(np.int64) if accumulate else 0)
    piece = batch.Piece(a, b_full, zps[0], zps[1], 256 * 256)
    with arithmetic(arith):
        batch.reduce_into(acc, [piece], accumulate, batch_n)
    np.testing.assert_array_equal(acc, want.astype(np.int32))


@pytest.mark.parametrize("arith", ARITHS)
@pytest.mark.parametrize("a_dtype", ["int8", "uint8"])
def test_products_wrap_like_the_int32_accumulator(arith: str, a_dtype: str) -> None:
    """A reduction whose sum overflows int32 (K = 300,000 products of 2**14, and zero points
    making every product 2**16) gives the wrapped integers, not saturated or rounded ones, on
    either arithmetic; two pieces of different zero points sum into one accumulator."""
    k = 300_000
    low = -128 if a_dtype == "int8" else 0
    a = np.full((16, k), low, a_dtype)
    b = np.full((k, 8), -128, np.int8)
    zp = 0 if a_dtype == "int8" else 128  # (a - zp) = -128 either way
    acc = np.full((16, 8), 7, np.int32)
    pieces = [
        batch.Piece(a, b, zp, 0, 128 * 128),
        batch.Piece(a[:, :1000], b[:1000], zp + 128, 128, 256 * 256),
    ]
    with arithmetic(arith):
        batch.reduce_into(acc, pieces, 1)
    total = 7 + 16384 * k + 65536 * 1000
    assert total >= 2**32
    np.testing.assert_array_equal(acc, np.full((16, 8), np.int64(total).astype(np.int32)))
    assert int(acc[0, 0]) == (total + 2**31) % 2**32 - 2**31


def test_int_mm_is_trusted_only_where_it_is_exact() -> None:
    """On this torch, products take torch._int_mm only after its probe; with oneDNN held to
    AVX2 (no VNNI: its kernels give wrong integers) the probe refuses it, and the products
    stay exact on float32."""
    import subprocess
    import sys

    code = (
        "import numpy as np, torch\n"
        "from tensorgen.sim import batch, products\n"
        "a = torch.full((64, 2), 127, dtype=torch.int8)\n"
        "raw = bool((torch._int_mm(a, a.T.contiguous()) == 2 * 127 * 127).all())\n"
        "trusted = products._int_mm() is not None\n"
        "x = np.full((64, 600), 255, np.uint8); w = np.full((600, 64), 127, np.int8)\n"
        "acc = np.zeros((64, 64), np.int32)\n"
        "batch.reduce_into(acc, [batch.Piece(x, w, 128, 0, 127 * 128)], 0)\n"
        "print(raw, trusted, bool((acc == 600 * 127 * 127).all()))\n"
    )
    for isa_limit in ("AVX2", ""):
        env = {**__import__("os").environ, "ONEDNN_MAX_CPU_ISA": isa_limit}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        raw, trusted, exact = out.stdout.split()
        assert exact == "True", out.stderr
        assert trusted == "False" or raw == "True"  # never trusted where it is wrong


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("zps", [(-(2**23), -3), (2**31 - 1, -(2**31)), (-(2**31), 2**31 - 1)])
def test_a_matmul_with_crafted_zero_points_wraps_exactly(zps, fast: bool) -> None:
    """Zero points are int32 fields: with huge ones a single product exceeds float32's and
    the sums float64's exact range. The fast kernel declines them and the MATMUL's semantics
    give the exact wrapped integers (Python's own arbitrary-precision sums, modulo 2**32)."""
    t = TARGETS[1]
    program = f""".target tiny {t.hash.hex()}
.dram 448
.tensor X uint8 8x16 input dram=0 pad=0
.tensor W int8 16x4 input dram=128 pad=0
.tensor C int32 8x4 output dram=192 pad=0
LOAD dst=spad:uint8@0[8x16:16,1] src=X(0,0)[8x16]
LOAD dst=spad:int8@128[16x4:4,1] src=W(0,0)[16x4] signal=EX
MATMUL acc=acc:int32@0[8x4:4,1] a=spad:uint8@0[8x16:16,1] b=spad:int8@128[16x4:4,1] \
accumulate=0 a_zp={zps[0]} b_zp={zps[1]} wait=LD signal=ST
STORE dst=C(0,0)[8x4] src=acc:int32@0[8x4:4,1] wait=EX
"""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (8, 16)).astype(np.uint8)
    w = rng.integers(-128, 128, (16, 4)).astype(np.int8)
    exact = [
        [
            sum((int(x[i, k]) - zps[0]) * (int(w[k, j]) - zps[1]) for k in range(16))
            for j in range(4)
        ]
        for i in range(8)
    ]
    want = np.array([[(v + 2**31) % 2**32 - 2**31 for v in row] for row in exact], np.int64)
    r = simulate(assemble(program), {"X": x, "W": w}, t, vectorize_loops=fast)
    np.testing.assert_array_equal(r.outputs["C"], want)


def test_a_padded_tile_is_gathered_in_runs_and_exact() -> None:
    """Channel-major activations in rows of a padded image: the rows are gathered as one run
    and the product, on either arithmetic, is the int64 one."""
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (16, 9, 16)).astype(np.uint8)  # (C, H, W) padded to W=16
    a = image[:, :8, :14].transpose(1, 2, 0)  # (M: 8 x 14, K: 16 channels)
    b = rng.integers(-128, 128, (16, 64)).astype(np.int8)
    merge = rowruns.rows_merge([(a, 1)], 0)
    assert merge == (8, 14, 16, 7 * 16 + 14)
    want = (a.astype(np.int64) - 7).reshape(-1, 16) @ (b.astype(np.int64) + 1)
    # and a second piece with two K axes (a nest's loop axis before the channels)
    image2 = rng.integers(0, 256, (3, 16, 9, 16)).astype(np.uint8)
    a2 = image2[:, :, :8, :14].transpose(2, 3, 0, 1)  # (M: 8 x 14, K: 3 x 16)
    b2 = rng.integers(-128, 128, (3, 16, 64)).astype(np.int8)
    assert rowruns.rows_merge([(a, 1), (a2, 2)], 0) is not None
    want2 = want + (a2.astype(np.int64) - 5).reshape(-1, 48) @ b2.astype(np.int64).reshape(48, 64)
    for arith in ARITHS:
        for pieces, expected in (
            ([batch.Piece(a, b, 7, -1, 256 * 129)], want),
            ([batch.Piece(a, b, 7, -1, 256 * 129), batch.Piece(a2, b2, 5, 0, 256 * 128)], want2),
        ):
            acc = np.zeros((8, 14, 64), np.int32)
            with arithmetic(arith):
                batch.reduce_into(acc, pieces, 0)
            np.testing.assert_array_equal(acc.reshape(-1, 64), expected)


def test_products_run_at_one_torch_thread_restored_afterwards(monkeypatch, outcome) -> None:
    """simulate pins torch to one thread for its products, and restores the caller's count."""
    import torch

    seen, real = [], products.product
    monkeypatch.setattr(
        products, "product", lambda *a: seen.append(torch.get_num_threads()) or real(*a)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        c = Case(2, "uint8", 3, -2, False, False, "loop", 0, False, False, "none")
        inputs = {"X": np.ones((8, 16), np.uint8), "W": np.ones((16, 4), np.int8)}
        with arithmetic("int_mm"):
            outcome(assemble(_program(c)), inputs, TARGETS[2], True)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_blas_runs_at_one_thread_restored_afterwards(monkeypatch, outcome) -> None:
    """simulate pins every BLAS pool to one thread (as threadpoolctl reports it) while it
    runs, and restores the caller's count."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def counts():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    seen, real = [], Simulator.run
    monkeypatch.setattr(Simulator, "run", lambda *a: seen.append(counts()) or real(*a))
    with threadpool_limits(limits=2, user_api="blas"):
        c = Case(2, "uint8", 3, -2, False, False, "loop", 0, False, False, "none")
        inputs = {"X": np.ones((8, 16), np.uint8), "W": np.ones((16, 4), np.int8)}
        outcome(assemble(_program(c)), inputs, TARGETS[2], True)
        assert seen and all(n == 1 for ns in seen for n in ns)
        assert counts() == [2] * len(counts())


def test_a_run_s_timing_is_kept_and_shifted_exactly(monkeypatch, outcome) -> None:
    """`MatmulRuns._timing` computes a run's steps once per (segments, EX state relative to
    its time) and shifts them after: a second run of a binary takes them (no fresh
    `_steps`) and still equals stepping; an entry is not taken where its clamp at 0 would
    bite (a state shifted below it)."""
    from tensorgen.sim import runs

    fresh = []
    real = runs.MatmulRuns._steps
    monkeypatch.setattr(runs.MatmulRuns, "_steps", lambda *a: fresh.append(1) or real(*a))
    rng = np.random.default_rng(2)
    inputs = {
        "X": rng.integers(-128, 128, (8, 16)).astype(np.int8),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }
    c = Case(2, "int8", 3, -2, False, False, "loop", 0, False, False, "none", "moves")
    binary = assemble(_program(c))
    first = outcome(binary, inputs, TARGETS[2], True)
    assert first[0] != "error" and fresh
    fresh.clear()
    assert outcome(binary, inputs, TARGETS[2], True) == first and not fresh
    assert first == outcome(binary, inputs, TARGETS[2], False)
    # a kept entry records the least time it clamped at; below that it is recomputed
    sim = Simulator(binary, TARGETS[2])
    key, entry = next(iter(sim.runs.timings.items()))
    entry = (*entry[:5], 5)  # as if it had clamped 5 cycles after the run's start
    sim.runs.timings[key] = entry
    sim.queue_time["EX"] = -10  # then a start at -10 clamps at -5: not a shift of it
    sim.streaming = None if key[1] is None else (-10 - key[1][0], key[1][1])
    segments = next(s for s in _kept_segments(sim) if sim.runs.signature(s) == key[0])
    fresh.clear()
    sim.runs._timing(segments, {})
    assert fresh  # recomputed, not shifted


def _kept_segments(sim):
    """The segment lists of the plans a binary's runs keep."""
    for plan in sim.runs.loop_plans.values():
        if plan is not None:
            yield plan.ordered
    for _, plan in sim.runs.run_plans.values():
        if plan is not None:
            yield plan[0]
