"""Cost-benefit analysis for architects: `tensorgen report`, `sweep` and `compare`."""
