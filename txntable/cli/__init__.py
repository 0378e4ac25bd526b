"""The ``txntable`` console script (one module for now: main)."""
