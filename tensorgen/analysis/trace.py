"""The simulated run as a Chrome Trace Event file (opens in Perfetto and chrome://tracing).

One track (tid) per queue and one for the DRAM channel, plus a track of layer boundaries;
`ph: "X"` complete events with `ts`/`dur` in microseconds at the target's clock.
"""

from __future__ import annotations

import json

from tensorgen.analysis.core import Analysis
from tensorgen.mc import isa

DRAM_TID = len(isa.QUEUES) + 1
LAYER_TID = 0


def _metadata(a: Analysis, tids: dict[str, int]) -> list[dict]:
    """The process and thread names (one thread per queue, the layers and the DRAM channel)."""
    events: list[dict] = [
        {
            "ph": "M",
            "pid": 1,
            "name": "process_name",
            "args": {"name": f"tensorgen {a.target.name}"},
        }
    ]
    for name, tid in [("layers", LAYER_TID), *tids.items(), ("DRAM channel", DRAM_TID)]:
        events.append(
            {"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )
        events.append(
            {
                "ph": "M",
                "pid": 1,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
        )
    return events


def trace_events(a: Analysis) -> list[dict]:
    if a.recorder is None:
        raise ValueError("trace_events needs an analysis run with record=True")
    us = 1.0 / a.target.clock_mhz  # one cycle in microseconds
    tids = {q: i + 1 for i, q in enumerate(isa.QUEUES)}
    events = _metadata(a, tids)
    for row in a.layers:
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": LAYER_TID,
                "name": row.name,
                "cat": "layer",
                "ts": row.start * us,
                "dur": row.cycles * us,
                "args": {
                    "op": row.op,
                    "macs": row.macs,
                    "cycles": row.cycles,
                    "dram_bytes": row.dram_bytes,
                },
            }
        )
    for q, _ready, start, end, pc, mnemonic in a.recorder.events:
        if end > start:
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": tids[q],
                    "name": mnemonic,
                    "cat": q,
                    "ts": start * us,
                    "dur": (end - start) * us,
                    "args": {"pc": pc, "cycles": end - start},
                }
            )
    for begin, end in a.recorder.channel:
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": DRAM_TID,
                "name": "DMA",
                "cat": "dram",
                "ts": begin * us,
                "dur": (end - begin) * us,
            }
        )
    return events


def trace_json(a: Analysis) -> bytes:
    return json.dumps(
        {
            "traceEvents": trace_events(a),
            "displayTimeUnit": "ns",
            "otherData": {
                "target": a.target.name,
                "clock_mhz": a.target.clock_mhz,
                "source": a.source,
            },
        }
    ).encode()
