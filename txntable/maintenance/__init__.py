"""Table maintenance, one module per operation: merge, retention, vacuum, verify, and the
scheduler.
"""
