"""Consumer groups: committed offsets, membership state (pure), assignors and the subscribing
member.
"""
