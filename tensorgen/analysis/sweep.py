"""`tensorgen sweep`: the cross product of target parameters, each point compiled, simulated and
checked, on a local process pool or a Dask cluster; resumable (one file per finished point).

A point is a plain dict (picklable, so Dask and the process pool run the same function); its
result row is stored atomically under DIR/points/<hash>.json, keyed by the model file's
contents, its parameters, the derived target's data and the tensorgen version.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import re
from pathlib import Path

from tensorgen.errors import TargetError, TensorgenError

# --vary KEY -> where it goes in the target YAML's data, and how its value is spelled
KEYS = {
    "mac_array": ("mac_array.rows", "RxC"),
    "spad": ("memories.spad.bytes", "bytes"),
    "acc": ("memories.acc.bytes", "bytes"),
    "dram_bytes_per_cycle": ("dram.bytes_per_cycle", "int"),
    "lanes": ("vector.lanes", "int"),
    "clock": ("clock_mhz", "number"),
    "node": ("technology.node_nm", "int"),
    "weight_buffers": ("mac_array.weight_buffers", "int"),
}
TIMING_FIELDS = ("compile_s", "sim_s")


def parse_value(key: str, text: str) -> object:
    kind = KEYS[key][1]
    t = text.strip()
    if kind == "RxC":
        m = re.fullmatch(r"(\d+)[xX](\d+)", t)
        if not m:
            raise TensorgenError(
                f"--vary {key}: bad value '{text}' (expected ROWSxCOLS, e.g. 16x16)"
            )
        return f"{int(m[1])}x{int(m[2])}"
    if kind == "bytes":
        m = re.fullmatch(r"(\d+)([KkMm]?)", t)
        if not m:
            raise TensorgenError(
                f"--vary {key}: bad value '{text}' (expected bytes, e.g. 262144, 256K or 1M)"
            )
        return int(m[1]) * {"": 1, "k": 1024, "m": 1 << 20}[m[2].lower()]
    if kind == "number":
        try:
            v = float(t)
        except ValueError:
            raise TensorgenError(f"--vary {key}: bad value '{text}' (expected a number)") from None
        return int(v) if v.is_integer() else v
    if not re.fullmatch(r"-?\d+", t):
        raise TensorgenError(f"--vary {key}: bad value '{text}' (expected an integer)")
    return int(t)


def parse_vary(items: list[str]) -> dict[str, list]:
    out: dict[str, list] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not values.strip():
            raise TensorgenError(f"--vary {item}: expected KEY=V1,V2,...")
        if key not in KEYS:
            raise TensorgenError(f"--vary {item}: unknown key '{key}' (known: {', '.join(KEYS)})")
        if key in out:
            raise TensorgenError(f"--vary {key}: given twice")
        out[key] = [parse_value(key, v) for v in values.split(",")]
    if not out:
        raise TensorgenError("sweep: nothing to vary (give --vary KEY=V1,V2,...)")
    return out


def derive(base: dict, params: dict) -> dict:
    """The base target's YAML data with the varied keys set."""
    d = copy.deepcopy(base)
    for key, value in params.items():
        path = KEYS[key][0]
        if key == "mac_array":
            rows, cols = (int(x) for x in str(value).split("x"))
            d.setdefault("mac_array", {}).update(rows=rows, cols=cols)
            continue
        cur = d
        *parents, leaf = path.split(".")
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[leaf] = value
    d["description"] = f"{d.get('name', 'target')} with " + ", ".join(
        f"{k}={v}" for k, v in params.items()
    )
    return d


@functools.lru_cache(maxsize=1)
def tensorgen_version() -> str:
    """The package version and a digest of the package's own files: a point computed by other
    code (a new commit under the same version number) is computed again, never reused."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("tensorgen")
    except PackageNotFoundError:
        number = "unknown"
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".yaml") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return f"{number}+{h.hexdigest()[:12]}"


def source_digest(source: str) -> str:
    from tensorgen.inputs import read_bytes

    path = source.split(":", 1)[0]
    return hashlib.sha256(
        read_bytes(path, "the model or op.yaml file") + source.encode()
    ).hexdigest()


def point_key(point: dict) -> str:
    blob = json.dumps(
        {
            k: point[k]
            for k in ("digest", "model_params", "engine", "objective", "target", "version")
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def make_points(
    source: str,
    base: dict,
    vary: dict[str, list],
    model_params: dict,
    engine: str,
    objective: str = "cycles",
) -> list[dict]:
    digest, version = source_digest(source), tensorgen_version()
    points = []
    for combo in itertools.product(*vary.values()):
        params = dict(zip(vary, combo, strict=False))
        p = {
            "source": source,
            "digest": digest,
            "model_params": model_params,
            "engine": engine,
            "objective": objective,
            "params": params,
            "target": derive(base, params),
            "version": version,
        }
        p["key"] = point_key(p)
        points.append(p)
    return points


def target_columns(d: dict) -> dict:
    """Every sweepable parameter of a derived target, as its row spells it (t_ prefix)."""

    def get(path: str):
        cur = d
        for k in path.split("."):
            cur = cur.get(k) if isinstance(cur, dict) else None
        return cur

    cols = {"t_rows": get("mac_array.rows"), "t_cols": get("mac_array.cols")}
    cols.update({f"t_{key}": get(path) for key, (path, _) in KEYS.items() if key != "mac_array"})
    return cols


def run_point(point: dict) -> dict:
    """One design point -> its result row (never raises for a bad target or a failed compile)."""
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # points run in parallel: one core each
    from tensorgen.analysis.core import analyze
    from tensorgen.inputs import one_line
    from tensorgen.target import target_from_dict
    from tensorgen.target.energy import area_breakdown

    row: dict = {
        "key": point["key"],
        **point["params"],
        **target_columns(point["target"]),
        "objective": point["objective"],
    }
    try:
        target = target_from_dict(point["target"], f"sweep point {point['params']}")
        row["area_mm2"] = round(area_breakdown(target)["total"], 6)
        a = analyze(
            point["source"],
            target,
            point["model_params"],
            point["engine"],
            objective=point["objective"],
        )
    except TensorgenError as err:
        return {
            **row,
            "ok": False,
            "bit_exact": False,
            "reason": one_line(f"{type(err).__name__}: {err}"),
        }
    except Exception as err:  # a tensorgen bug at this point: a row saying so, not a dead sweep
        return {
            **row,
            "ok": False,
            "bit_exact": False,
            "internal": True,
            "reason": one_line(f"internal error {type(err).__name__}: {err}"),
        }
    energy = sum(a.energy.values())
    return {
        **row,
        "ok": True,
        "cycles": a.stats.cycles,
        "latency_ms": round(a.latency_s * 1e3, 6),
        "energy_uj": round(energy / 1e6, 6),
        "power_mw": round(a.power_w * 1e3, 4),
        "utilization": round(a.utilization(), 6),
        "dram_bytes": a.stats.dram_bytes,
        "bit_exact": a.exact,
        "reason": "" if a.exact else a.message,
        "compile_s": round(a.compile_s, 3),
        "sim_s": round(a.sim_s, 3),
    }


def pareto(rows: list[dict]) -> list[dict]:
    """The bit-exact points no other bit-exact point beats in both latency and energy."""
    ok = [r for r in rows if r.get("bit_exact")]
    front = []
    for r in ok:
        if not any(
            o["latency_ms"] <= r["latency_ms"]
            and o["energy_uj"] <= r["energy_uj"]
            and (o["latency_ms"], o["energy_uj"]) != (r["latency_ms"], r["energy_uj"])
            for o in ok
        ):
            front.append(r)
    return sorted(front, key=lambda r: r["latency_ms"])


def load_base(target: str | None) -> dict:
    from tensorgen.inputs import load_yaml, read_text
    from tensorgen.target import ISA_DIR, load_target

    name = target or "tg1"
    load_target(name)  # validates the base, and names the known targets when it is unknown
    path = Path(name) if Path(name).suffix else ISA_DIR / f"{name}.yaml"
    return load_yaml(read_text(path, "the target file", TargetError), str(path), TargetError)


def cached(points_dir: Path, key: str) -> dict | None:
    path = points_dir / f"{key}.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return (
            None  # unreadable: recompute it (writes are atomic, so this is another writer's damage)
        )


def _result(future, point: dict) -> dict:
    """A finished future's row; a worker that died (killed, out of memory) makes a row saying so,
    not stored, so that a rerun retries the point."""
    from tensorgen.inputs import one_line

    try:
        return future.result()
    except Exception as err:
        return {
            "key": point["key"],
            **point["params"],
            **target_columns(point["target"]),
            "ok": False,
            "bit_exact": False,
            "internal": True,
            "reason": one_line(f"worker lost: {type(err).__name__}: {err}"),
        }


def check_executor(executor: str, scheduler: str | None) -> None:
    """Refuse a Dask run that cannot start before any work (or output directory) happens."""
    if executor == "local":
        if scheduler:
            raise TensorgenError("--scheduler applies to --executor dask")
        return
    try:
        import distributed  # noqa: F401  (an optional extra: imported only when asked for)
    except ImportError:
        raise TensorgenError(
            "--executor dask needs the 'distributed' package (pip install 'tensorgen[dask]')"
        ) from None
    if not scheduler:
        raise TensorgenError("--executor dask needs --scheduler tcp://HOST:PORT")


def execute(
    points: list[dict], todo: list[dict], jobs: int, executor: str, scheduler: str | None, done
) -> None:
    """Run `todo` and call `done(point, row)` as each finishes (in completion order)."""
    if executor == "dask":
        check_executor(executor, scheduler)
        from distributed import Client, as_completed

        try:
            client = Client(scheduler, timeout=20)
        except (OSError, TimeoutError) as err:
            raise TensorgenError(f"--scheduler {scheduler}: cannot connect ({err})") from None
        with client:
            futures = {
                client.submit(run_point, p, key=f"tensorgen-point-{p['key']}", pure=False): p
                for p in todo
            }
            for fut in as_completed(futures):
                done(futures[fut], _result(fut, futures[fut]))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import as_completed as local_completed

    if jobs == 1:
        for p in todo:
            done(p, run_point(p))
        return
    ctx = multiprocessing.get_context("spawn")  # no forked torch/OpenMP state in the workers
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(run_point, p): p for p in todo}
        for fut in local_completed(futures):
            done(futures[fut], _result(fut, futures[fut]))


def sweep(
    source: str,
    vary: dict[str, list],
    out: Path,
    base_target: str | None,
    model_params: dict,
    engine: str,
    jobs: int,
    executor: str,
    scheduler: str | None,
    progress,
    objective: str = "cycles",
) -> tuple[list[dict], int]:
    """Run (or resume) the sweep; returns every point's row in the cross product's order and how
    many were already stored."""
    from tensorgen.analysis.report import write

    base = load_base(base_target)
    points = make_points(source, base, vary, model_params, engine, objective)
    points_dir = out / "points"
    points_dir.mkdir(exist_ok=True)
    rows = {p["key"]: cached(points_dir, p["key"]) for p in points}
    todo = [p for p in points if rows[p["key"]] is None]
    progress(len(points) - len(todo), len(points))

    def done(point: dict, row: dict) -> None:
        rows[point["key"]] = row
        if not row.get("internal"):  # a bug is not a result worth keeping: rerun it next time
            write(points_dir / f"{point['key']}.json", json.dumps(row, sort_keys=True).encode())
        progress(sum(r is not None for r in rows.values()), len(points))

    if todo:
        execute(points, todo, jobs, executor, scheduler, done)
    return [rows[p["key"]] for p in points], len(points) - len(todo)


def spelled(key: str, value: object) -> str:
    """A parameter value as one would type it (`256K` rather than 262144)."""
    if (
        KEYS.get(key, ("", ""))[1] == "bytes"
        and isinstance(value, int)
        and value
        and value % 1024 == 0
    ):
        return f"{value >> 20}M" if value % (1 << 20) == 0 else f"{value >> 10}K"
    return str(value)


def label(row: dict, vary: dict) -> str:
    return " ".join(f"{k}={spelled(k, row[k])}" for k in vary)
