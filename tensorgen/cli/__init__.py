"""The `tensorgen` command line.

Exit codes: 0 success, 1 a check found a mismatch, 2 bad input (one line, no
traceback), 3 an internal error (a bug: please report it with the traceback).
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
import traceback
from typing import NoReturn

from tensorgen.cli.analysis import analysis_parsers
from tensorgen.cli.common import (
    MAX_SEED,
    MAX_TRIALS,
    bounded_int,
    max_steps_option,
    model_options,
    objective_option,
    schedule_time_limit_option,
)
from tensorgen.cli.models import cmd_compile
from tensorgen.cli.ops import cmd_check, cmd_disasm, cmd_emit, cmd_isa_doc, cmd_run
from tensorgen.errors import TensorgenError


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's options, in the order `--help` lists them: the operator's (emit, check),
    the model's (compile), the binary's (run, disasm), the reference (isa-doc), the architect's."""
    p = argparse.ArgumentParser(
        prog="tensorgen", description="Compile tensor operators to accelerator microcode."
    )
    sub = p.add_subparsers(dest="command", required=True)
    _emit_parser(sub)
    _check_parser(sub)
    _compile_parser(sub)
    _run_parser(sub)
    _disasm_and_isa_doc_parsers(sub)
    analysis_parsers(sub)
    return p


def _emit_parser(sub) -> None:
    e = sub.add_parser("emit", help="compile an op.yaml to a .tgb binary")
    e.add_argument("op")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--asm", help="also write readable microcode here")
    e.add_argument(
        "--target",
        help="target name (tensorgen/target/isa/NAME.yaml) or a path (default: the op.yaml's)",
    )
    e.add_argument(
        "--schedule",
        help="a schedule file, 'auto' or 'default' (default: the op.yaml's schedule: key)",
    )
    schedule_time_limit_option(e)
    objective_option(e)
    e.set_defaults(func=cmd_emit)


def _check_parser(sub) -> None:
    c = sub.add_parser(
        "check", help="compile, simulate on random inputs, compare with PyTorch bit for bit"
    )
    c.add_argument("op")
    c.add_argument("--target")
    c.add_argument(
        "--schedule",
        help="a schedule file, 'auto' or 'default' (default: the op.yaml's schedule: key); "
        "with a schedule other than the default, also prints the default's cycles",
    )
    c.add_argument(
        "--explain",
        action="store_true",
        help="with the automatic scheduler: print its choice as a schedule file, its bottleneck and "
        "how it beat its neighbours",
    )
    c.add_argument("--seed", type=bounded_int(0, MAX_SEED, "a 32-bit seed"), default=0)
    c.add_argument(
        "--trials",
        type=bounded_int(
            0,
            MAX_TRIALS,
            "MAX_TRIALS in tensorgen/cli/common.py; run again with another --seed for more",
        ),
        default=1,
    )
    schedule_time_limit_option(c)
    max_steps_option(c)
    objective_option(c)
    model_options(c)
    c.add_argument(
        "--input",
        action="append",
        metavar="FILE.npy",
        help="for a model: also check on this input (float32, the model's input shape)",
    )
    c.set_defaults(func=cmd_check)


def _compile_parser(sub) -> None:
    m = sub.add_parser("compile", help="compile a quantized PyTorch model to one .tgb binary")
    m.add_argument(
        "model", help="FILE.py[:FACTORY] (default factory: build) or a saved torch.export FILE.pt2"
    )
    m.add_argument("-o", "--output", required=True)
    m.add_argument("--asm", help="also write readable microcode here")
    m.add_argument(
        "--target", help="target name (tensorgen/target/isa/NAME.yaml) or a path (default tg1)"
    )
    m.add_argument(
        "--seed",
        type=bounded_int(0, MAX_SEED, "a 32-bit seed"),
        default=0,
        help="seed of the calibration data",
    )
    m.add_argument(
        "--explain",
        action="store_true",
        help="name every fused group: what it keeps on chip, what that saves, why (not) fused",
    )
    objective_option(m)
    model_options(m)
    m.set_defaults(func=cmd_compile)


def _run_parser(sub) -> None:
    r = sub.add_parser("run", help="simulate a .tgb on given inputs")
    r.add_argument("binary")
    r.add_argument("--in", dest="inputs", action="append", metavar="NAME=FILE.npy")
    r.add_argument(
        "--out", required=True, help="directory for the output .npy files (created after the run)"
    )
    r.add_argument(
        "--target",
        help="the target's description (FILE.yaml) when the binary's target is not built in; "
        "its name and parameter hash must match the binary's",
    )
    max_steps_option(r)
    r.set_defaults(func=cmd_run)


def _disasm_and_isa_doc_parsers(sub) -> None:
    d = sub.add_parser("disasm", help="print a .tgb as assembly text")
    d.add_argument("binary")
    d.set_defaults(func=cmd_disasm)

    i = sub.add_parser("isa-doc", help="print the instruction set reference (Markdown)")
    i.set_defaults(func=cmd_isa_doc)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TensorgenError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tensorgen ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush stays quiet
        return 141
    except Exception:  # a bug in tensorgen, not in the input
        traceback.print_exc()
        print(
            "internal error: this is a tensorgen bug; please report it with the traceback above",
            file=sys.stderr,
        )
        return 3


def run() -> NoReturn:
    """The `tensorgen` command (and `python -m tensorgen.cli`): `main`, then the process ends
    as soon as its output is out. Once the atexit handlers have run and stdout and stderr are
    flushed, nothing is left to do but the interpreter's teardown: freeing a compile's few
    hundred thousand objects and torch's two thousand modules one by one, 0.3-1.7 s of a
    ResNet-18 compile's wall time by the load. Another thread still running (none of ours
    outlives its command) gets the ordinary exit, which waits for it."""
    code = main()
    if threading.active_count() == 1:
        atexit._run_exitfuncs()  # what the ordinary exit runs first: logging, temp dirs
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (BrokenPipeError, ValueError):  # the ordinary exit reports it as it always did
            sys.exit(code)
        os._exit(code)
    sys.exit(code)
