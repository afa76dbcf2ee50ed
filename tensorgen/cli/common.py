"""What the subcommands share: reading and writing files, argument types and options."""

from __future__ import annotations

import argparse
from pathlib import Path

from tensorgen.errors import BinaryError, TensorgenError


def read_binary(path: str):
    from tensorgen.inputs import read_bytes
    from tensorgen.mc.binary import decode

    data = read_bytes(path, "a .tgb binary", BinaryError)  # no FIFO or device, a size limit
    try:
        return decode(data)
    except BinaryError as err:
        raise BinaryError(f"{path}: {err}") from None


def write_file(path: str | Path, data: bytes) -> None:
    write_files([(path, data)])


def write_files(files: list[tuple[str | Path, bytes]]) -> None:
    """Write every file or none of them (a second that fails removes the first)."""
    from tensorgen.outputs import write_files_atomic

    try:
        write_files_atomic(files)
    except OSError as err:  # a missing directory or no permission is the user's to fix, not a bug
        raise TensorgenError(f"{err.filename}: cannot write ({err.strerror})") from None


def is_model(path: str) -> bool:
    """A model is a Python file with a factory (`file.py[:build]`) or a saved torch.export program."""
    base = path.split(":", 1)[0]
    return base.endswith((".py", ".pt2"))


def factory_params(items: list[str] | None) -> dict[str, int]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        try:
            out[key] = int(value)
        except ValueError:
            raise TensorgenError(f"--param {item}: expected KEY=INTEGER") from None
        if not sep or not key.isidentifier():
            raise TensorgenError(f"--param {item}: expected KEY=INTEGER")
    return out


MAX_TRIALS = (
    1000  # a check is a test, not a soak: more trials are more runs with other --seed values
)


MAX_SEED = 2**32 - 1  # numpy's and torch's generators take any seed + trial up to far beyond this


def bounded_int(lo: int, hi: int, what: str):
    """An argparse type: an integer in [lo, hi], refused (exit 2, argparse's one error) otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi} ({what})")
        return value

    parse.__name__ = "integer"
    return parse


MAX_JOBS = 64


def model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-p",
        "--param",
        action="append",
        metavar="KEY=INT",
        help="for a model: an argument of its factory, e.g. -p size=224",
    )
    p.add_argument(
        "--engine",
        default="qnnpack",
        choices=("qnnpack", "x86", "fbgemm"),
        help="for a model: PyTorch's quantized engine whose qconfig and kernels are the reference",
    )
    p.add_argument(
        "--quantizer",
        default="fx",
        choices=("fx", "pt2e"),
        help="for a float model: PyTorch's FX flow (default), or torch.export + torchao's PT2E "
        "flow with tensorgen's quantizer (checked against tensorgen's PT2E integer rule)",
    )
    p.add_argument(
        "--dump-layers", metavar="DIR", help="for a model: write each layer's op.yaml here"
    )
    p.add_argument(
        "--jobs",
        type=bounded_int(1, MAX_JOBS, "processes compiling a model's layers"),
        default=1,
        metavar="N",
        help="for a model: compile its layers in N processes (the same binary whatever N)",
    )
    p.add_argument(
        "--fuse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="for a model: compile each run of layers joined by activations only the next reads "
        "as one program, the activations kept on chip (the default; --no-fuse compiles layer by "
        "layer)",
    )
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="for a model: let each unit (layer or fused group) load its weights, and the "
        "activations the unit before it does not store, while that one computes, where the two "
        "fit the on-chip memories together (the default; --no-overlap puts a full barrier "
        "between every two units)",
    )


def objective_option(p: argparse.ArgumentParser) -> None:
    from tensorgen.autosched.objective import OBJECTIVES

    p.add_argument(
        "--objective",
        default="cycles",
        choices=OBJECTIVES,
        help="what the automatic scheduler minimises: cycles (the default; of candidates within "
        "0.5%% of the fastest, the one that moves the least DRAM) or energy (DRAM traffic and "
        "leakage: a few %% more cycles can halve a layer's DRAM bytes)",
    )


def max_steps_option(p: argparse.ArgumentParser) -> None:
    """`--max-steps N` of run and check: SimLimits.max_steps, the simulator's one limit object."""
    from tensorgen.mc.verify import SimLimits

    default = SimLimits().max_steps
    p.add_argument(
        "--max-steps",
        type=int,
        default=default,
        metavar="N",
        help=f"refuse programs that execute more than N instructions (default {default:,})",
    )


def sim_limits(args):
    from tensorgen.mc.verify import SimLimits

    if args.max_steps < 1:
        raise TensorgenError(f"--max-steps {args.max_steps}: at least one instruction")
    return SimLimits(max_steps=args.max_steps)


def seconds(text: str) -> float:
    """An argparse type: a time limit in seconds, > 0 and finite (0 would mean no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 86400] seconds")
    return value


def schedule_time_limit_option(p: argparse.ArgumentParser) -> None:
    from tensorgen.schedule.files import DEFAULT_TIME_LIMIT_S

    p.add_argument(
        "--schedule-time-limit",
        type=seconds,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help="seconds a schedule file may run before it is stopped with a one-line error "
        f"(default {DEFAULT_TIME_LIMIT_S:g})",
    )
