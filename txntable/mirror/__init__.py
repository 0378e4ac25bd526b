"""The Delta Lake mirror of read_committed: publishing (:mod:`txntable.mirror.publisher`)."""
