"""The passes of the scheduled lowering (codegen/scheduled.py), one module each."""
