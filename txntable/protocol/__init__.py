"""The table protocol as pure functions of actions: log actions, replay, producer state, append
planning, aborted filtering, records and schemas. No I/O, no client.
"""
