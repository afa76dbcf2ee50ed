"""The automatic scheduler: it recognises a layer (layer.py), builds its search space from the
Schedule primitives (its loop nests: shapes.py, their probes: probe.py) and picks the cheapest
candidate (search.py), and explains its choice (explain.py). It sits above codegen because
it costs candidates with the lowering's own facts (vector_profile); codegen never imports it."""
