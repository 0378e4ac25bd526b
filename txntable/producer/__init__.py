"""The producer client: accumulator, send futures, partitioner and its transaction state machine."""
