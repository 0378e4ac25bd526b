"""The transaction log on a store: reading, committing and checkpointing versions (the only writer
of log files).
"""
