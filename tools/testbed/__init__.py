"""Real brokers, servers and devices for tests/ and bench/ (not installed)."""
