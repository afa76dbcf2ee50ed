"""The model subcommands: compile, and check of a model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tensorgen.cli.common import factory_params, write_file, write_files
from tensorgen.errors import TensorgenError


def compile_model_args(args):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tensorgen.frontend.load import load_model
    from tensorgen.model import compile_model
    from tensorgen.target import load_target

    model, example = load_model(
        args.model if hasattr(args, "model") else args.op, factory_params(args.param)
    )
    target = load_target(args.target or "tg1")
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} layers"),
        TimeElapsedColumn(),
        transient=True,
        disable=not sys.stderr.isatty(),
    ) as bar:
        task = bar.add_task("compiling", total=None)

        def progress(i, n, layer):
            bar.update(task, total=n, completed=i, description=f"{layer.op} {layer.path}"[:48])

        cm = compile_model(
            model,
            example,
            target,
            engine=args.engine,
            seed=args.seed,
            progress=progress,
            jobs=getattr(args, "jobs", 1),
            quantizer=getattr(args, "quantizer", "fx"),
            fuse=getattr(args, "fuse", True),
            overlap=getattr(args, "overlap", True),
            objective=getattr(args, "objective", "cycles"),
        )
    if getattr(args, "dump_layers", None):
        out = Path(args.dump_layers)
        out.mkdir(parents=True, exist_ok=True)
        for layer in cm.graph.layers:
            write_file(out / f"{layer.name}.yaml", layer.text(target.name).encode())
    return cm


def _print_model_table(cm, explain: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    tgt = cm.target
    what = f"{len(cm.layers)} layers"
    if len(cm.layers) != len(cm.graph.layers):  # fused groups are one row each
        what = f"{len(cm.graph.layers)} layers in {len(cm.layers)} units"
    table = Table(title=f"{what} on {tgt.name}", title_justify="left")
    for col in ("#", "layer", "op", "output", "MACs", "cycles", "util", "DRAM B", "schedule"):
        table.add_column(
            col, justify="right" if col in ("#", "MACs", "cycles", "util", "DRAM B") else "left"
        )
    for i, r in enumerate(cm.layers):
        op = r.op + "".join(f"+{e}" for e in r.epilogue)
        table.add_row(
            str(i),
            r.path,
            op,
            "x".join(map(str, r.shape)),
            f"{r.macs:,}",
            f"{r.cycles:,}",
            f"{r.utilization(tgt):.1%}" if r.macs else "-",
            f"{r.dram_bytes:,}",
            r.schedule,
        )
    macs, cycles = sum(r.macs for r in cm.layers), sum(r.cycles for r in cm.layers)
    table.add_row(
        "",
        "total",
        "",
        "",
        f"{macs:,}",
        f"{cycles:,}",
        f"{macs / (cycles * tgt.rows * tgt.cols):.1%}" if cycles else "-",
        f"{sum(r.dram_bytes for r in cm.layers):,}",
        "",
    )
    Console(width=160).print(table)
    pl = cm.linked.placement
    print(
        f"DRAM: activations and scratch {pl.peak_bytes:,} B with lifetimes shared "
        f"(sum of all tensors {pl.total_bytes:,} B, {pl.total_bytes / max(pl.peak_bytes, 1):.2f}x), "
        f"weights {pl.const_bytes:,} B"
    )
    if explain:
        for note in cm.fusion_notes:
            print(f"fusion: {note}")
    elif cm.fusion_notes:
        fused = sum(note.startswith("fused ") for note in cm.fusion_notes)
        print(
            f"fusion: {fused} of {len(cm.fusion_notes)} groups tried fused "
            "(--explain names each group and why)"
        )
    _print_overlap(cm, explain)
    print(
        f"compiled {what} in {cm.compile_s:.2f} s "
        f"({sum(1 for r in cm.layers if r.schedule in ('auto', 'fused'))} scheduled automatically)"
    )


def _print_overlap(cm, explain: bool) -> None:
    """How many unit boundaries overlap (codegen/overlap.py); with --explain, which do not."""
    linked = cm.linked
    if not linked.apart:
        return
    if linked.onchip is None:
        print(f"link: {len(linked.apart)} unit boundaries, each a full barrier (--no-overlap)")
        return
    barriers = len(linked.apart) - linked.overlaps
    print(
        f"link: {linked.overlaps} of {len(linked.apart)} unit boundaries overlap "
        f"({linked.early_loads} loads may start while the unit before computes)"
        + (f"; {barriers} full barriers" if barriers else "")
        + (" (--explain names them)" if barriers and not explain else "")
    )
    if explain:
        rows = cm.layers if len(cm.layers) == len(linked.apart) + 1 else None
        for i, joined in enumerate(linked.overlapped):
            if not joined:
                names = f" ({rows[i].path} -> {rows[i + 1].path})" if rows else ""
                print(
                    f"link: barrier between units {i} and {i + 1}{names}: their buffers do not "
                    "fit the scratchpad side by side"
                )


def cmd_compile(args) -> int:
    from tensorgen.mc.binary import disassemble, encode

    cm = compile_model_args(args)
    _print_model_table(cm, getattr(args, "explain", False))
    data = encode(cm.binary)
    files = [(args.asm, disassemble(cm.binary).encode())] if args.asm else []
    write_files(files + [(args.output, data)])  # both or neither, as emit
    ins = ", ".join(cm.input_names)
    outs = ", ".join(cm.output_names)
    print(
        f"{args.output}: {len(cm.binary.code)} instructions, {len(data):,} bytes, target {cm.target.name}; "
        f"inputs {ins}, outputs {outs}"
    )
    return 0


def cmd_check_model(args) -> int:
    import torch

    from tensorgen.model import check_model

    given = []
    for item in args.input or []:  # read before compiling: a bad path fails fast
        try:
            given.append(
                (item, (torch.from_numpy(np.load(item, allow_pickle=False).astype(np.float32)),))
            )
        except (OSError, ValueError, EOFError) as err:
            raise TensorgenError(f"--input {item}: cannot load ({err})") from None
    if not given and args.trials < 1:
        raise TensorgenError("--trials 0 without --input: nothing to check")
    cm = compile_model_args(args)
    _print_model_table(cm, getattr(args, "explain", False))
    if cm.engine != "qnnpack":  # its integer behaviour depends on the CPU: say which one applies
        from tensorgen.frontend.probe import x86_behaviour

        print(x86_behaviour(cm.engine).describe())
    trials = list(given)
    for trial in range(args.trials):
        gen = torch.Generator().manual_seed(args.seed + trial)
        trials.append(
            (
                f"seed {args.seed + trial}",
                tuple(torch.randn(x.shape, generator=gen) for x in cm.example_inputs),
            )
        )
    status = 0
    for i, (label, inputs) in enumerate(trials):
        if tuple(inputs[0].shape) != tuple(cm.example_inputs[0].shape):
            raise TensorgenError(
                f"--input {label}: shape {list(inputs[0].shape)}, the model takes "
                f"{list(cm.example_inputs[0].shape)}"
            )
        cmp, result = check_model(cm, inputs)
        how = "pt2e" if cm.reference is not None else cm.engine
        print(f"trial {i + 1} ({label}, {how}): {cmp.message}")
        if not cmp.exact:
            status = 1
            break
    s = result.stats
    macs = sum(r.macs for r in cm.layers)
    util = macs / (s.cycles * cm.target.peak_macs_per_cycle) if s.cycles else 0.0
    print(
        f"cycles {s.cycles:,}  MACs {macs:,}  MAC utilization {util:.1%}  DRAM {s.dram_bytes:,} B  "
        f"energy {s.energy_pj / 1e6:.3f} uJ"
    )
    return status
