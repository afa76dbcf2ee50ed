"""Fuzz the CLI: N mutated inputs per family, run through `tensorgen.cli.main`, tallied by class.

    python benchmarks/fuzz.py --count N [--family F ...] [--seed S] [--json PATH] [--save DIR]
                              [--jobs J] [--limit SECONDS] [--memory GIB] [--process-every K]

Families (tensorgen/testing/fuzz.py): opyaml (mutated examples/*.yaml), schedule (mutated
schedules/*.py, within the schedule API), tgb (mutated binaries), npy (`--in` arrays), cli (command
lines). Each case runs in-process in a pool of worker processes (each under RLIMIT_AS, a
per-case wall-clock limit, killed and replaced when silent past it); every K-th case also runs as
a real process (`python -m tensorgen.cli`). Classes: ok, refused (exit 2, one line) and the
contract breaks exit-3, traceback, hang, signal, memory, multi-line, stray-output,
suspicious-accept, mismatch, bad-output, bad-exit. `--save DIR` keeps the first reproducer of
each (class, family) as DIR/CLASS-FAMILY/cmd.sh with its files; the exit status is 1 if anything
broke the contract.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tensorgen.testing.fuzz import FAMILIES, generate
from tensorgen.testing.fuzzrun import BREAKS, CLASSES, WorkerPool, save_reproducer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100, help="inputs per family")
    ap.add_argument(
        "--family", action="append", choices=FAMILIES, help="only these families (repeatable)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--kinds", help="only these mutators, comma-separated (tensorgen/testing/fuzz*.py)"
    )
    ap.add_argument("--json", type=Path, help="write the tally and the first reproducers here")
    ap.add_argument("--save", type=Path, help="save the first reproducer of each class here")
    ap.add_argument(
        "--jobs", type=int, default=1, help="worker processes, each running one case at a time"
    )
    ap.add_argument("--limit", type=float, default=20.0, help="wall-clock seconds per case")
    ap.add_argument("--memory", type=float, default=4.0, help="address-space limit per worker, GiB")
    ap.add_argument(
        "--process-every",
        type=int,
        default=250,  # a process imports torch again: 3 CPU-s, 20x an in-process case
        metavar="K",
        help="also run every K-th case as a real process (0: never)",
    )
    return ap.parse_args(argv)


def cases(args: argparse.Namespace):
    tasks, index = [], {}
    for i in range(args.count):  # families interleaved: a partial run is a sample of each
        for family in args.family or FAMILIES:
            kinds = frozenset(args.kinds.split(",")) if args.kinds else None
            case = generate(family, random.Random(f"{args.seed}:{family}:{i}"), kinds)
            index[len(tasks)] = (family, i, "in-process", case)
            tasks.append((len(tasks), case, False))
            if args.process_every and i % args.process_every == 0:
                index[len(tasks)] = (family, i, "process", case)
                tasks.append((len(tasks), case, True))
    return tasks, index


def table(tally: dict, title: str) -> Table:
    used = [c for c in CLASSES if any(t[c] for t in tally.values())]
    tab = Table(title=title, title_justify="left")
    tab.add_column("family")
    for c in used:
        tab.add_column(c, justify="right", style="red" if c in BREAKS else None)
    total = Counter()
    for family, counts in tally.items():
        tab.add_row(family, *(str(counts[c]) for c in used))
        total.update(counts)
    tab.add_row("total", *(str(total[c]) for c in used), style="bold")
    return tab


def projection(seconds_of: dict, args: argparse.Namespace, wall: float, runs: int) -> str:
    """Seconds per case by family (in-process, and as a process), and what `--count 10000` would
    take at this rate with the same --jobs and --process-every."""
    parts, total = [], 0.0
    for family in args.family or FAMILIES:
        inproc = seconds_of.get(("in-process", family), [])
        proc = seconds_of.get(("process", family), [])
        mean = sum(inproc) / len(inproc) if inproc else 0.0
        pmean = sum(proc) / len(proc) if proc else 0.0
        share = 1 / args.process_every if args.process_every else 0.0
        ten_k = 10000 * (mean + share * pmean) / max(1, args.jobs)
        total += ten_k
        parts.append(f"{family} {mean:.3f}" + (f" ({pmean:.1f} as a process)" if proc else ""))
    busy = sum(sum(v) for v in seconds_of.values())
    overhead = wall / busy * max(1, args.jobs) if busy else 1.0  # materializing, the pool, imports
    return (
        f"seconds per case: {', '.join(parts)}; projected for --count 10000 with --jobs "
        f"{args.jobs}: {total / 60:.0f} min of cases, {total * overhead / 60:.0f} min of wall "
        f"clock at this run's overhead ({overhead:.2f}x)"
    )


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C or kill (a background job ignores SIGINT): stop and report what ran so far
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    tasks, index = cases(args)
    tally = {"in-process": defaultdict(Counter), "process": defaultdict(Counter)}
    first: dict[str, dict] = {}
    examples: dict[str, list] = defaultdict(list)
    t0 = time.perf_counter()

    seconds_of: dict[tuple[str, str], list[float]] = defaultdict(list)

    def done(i: int, outcome) -> None:
        family, n, mode, case = index[i]
        tally[mode][family][outcome.cls] += 1
        seconds_of[mode, family].append(outcome.seconds)
        finished = sum(sum(c.values()) for m in tally.values() for c in m.values())
        if finished % 100 == 0:
            print(
                f"{finished}/{len(tasks)} runs, {time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        if not outcome.broken:
            return
        key = f"{outcome.cls}-{family}"
        if len(examples[key]) < 12 and all(e["detail"] != outcome.detail for e in examples[key]):
            examples[key].append(
                {
                    "case": n,
                    "mode": mode,
                    "kinds": case.kinds,
                    "argv": case.argv,
                    "detail": outcome.detail,
                    "err": outcome.err[-600:],
                }
            )
        if key not in first:
            first[key] = {
                "case": n,
                "mode": mode,
                "kinds": case.kinds,
                "argv": case.argv,
                "detail": outcome.detail,
            }
            if args.save:
                save_reproducer(case, outcome, args.save / key)
                first[key]["saved"] = str(args.save / key)

    with tempfile.TemporaryDirectory(prefix="tgfuzz") as work:
        pool = WorkerPool(args.jobs, Path(work), args.limit, int(args.memory * (1 << 30)))
        try:
            pool.map(tasks, done)
        except KeyboardInterrupt:  # Ctrl-C (SIGINT): report what ran so far
            print("interrupted: the tally covers the runs that finished", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - a harness failure must not lose the tally
            print(
                f"harness failure ({exc!r}): the tally covers the runs that finished",
                file=sys.stderr,
            )
        finally:
            pool.close()
    seconds = time.perf_counter() - t0
    console = Console(width=200)
    console.print(
        table(tally["in-process"], f"{args.count} inputs per family, in-process (seed {args.seed})")
    )
    if tally["process"]:
        console.print(table(tally["process"], f"every {args.process_every}th input as a process"))
    breaks = sum(c[b] for mode in tally.values() for c in mode.values() for b in BREAKS)
    print(f"{len(tasks)} runs in {seconds:.0f} s; {breaks} broke the contract")
    print(projection(seconds_of, args, seconds, len(tasks)))
    for key, info in sorted(first.items()):
        print(
            f"  first {key}: {'+'.join(info['kinds'])}: {info['detail']}"
            + (f" -> {info['saved']}/cmd.sh" if "saved" in info else "")
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "count": args.count,
                    "seed": args.seed,
                    "seconds": round(seconds, 1),
                    "breaks": breaks,
                    "tally": tally,
                    "first": first,
                    "examples": examples,
                },
                indent=1,
                default=list,
            )
        )
    return 1 if breaks else 0


if __name__ == "__main__":
    sys.exit(main())
