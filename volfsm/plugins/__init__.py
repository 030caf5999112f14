"""Volume plugins: the interface the operation executor drives, and its implementations."""
