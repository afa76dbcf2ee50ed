"""The random-model property test's long profile: N random CNNs (examples/models/random_cnn.py)
quantized, compiled, simulated and compared bit for bit under an engine; prints the tally --
bit-exact, refusals by kind, mismatches and tracebacks (which must be 0).

    PYTHONPATH=. python benchmarks/random_models.py --models 200 --engine qnnpack
    PYTHONPATH=. python benchmarks/random_models.py --models 200 --quantizer pt2e
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "frontend"))

from test_random_models import outcome  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=200)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--engine", default="qnnpack", choices=("qnnpack", "x86"))
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--quantizer", default="fx", choices=("fx", "pt2e"))
    p.add_argument("--progress", action="store_true", help="one line per model as it ends")
    args = p.parse_args(argv)
    tally: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()
    for seed in range(args.first_seed, args.first_seed + args.models):
        try:
            kind = outcome(seed, args.engine, args.size, args.quantizer)
            tally[kind] += 1
            if args.progress:
                print(f"seed {seed}: {kind}", flush=True)
        except AssertionError as err:
            tally["MISMATCH or undocumented refusal"] += 1
            print(f"seed {seed}: {err}", file=sys.stderr)
        except Exception:  # a tensorgen bug: counted, shown, and the run goes on
            tally["TRACEBACK"] += 1
            print(f"seed {seed}:\n{traceback.format_exc()}", file=sys.stderr)
    under = "pt2e (tensorgen's rule)" if args.quantizer == "pt2e" else args.engine
    print(f"{args.models} random models under {under} in {time.perf_counter() - t0:.0f} s")
    for kind, n in tally.most_common():
        print(f"  {n:5d}  {kind}")
    bad = tally["TRACEBACK"] + tally["MISMATCH or undocumented refusal"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
