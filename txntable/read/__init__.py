"""Reading: planning which segment slices a read needs (pure), and reading them from the store."""
