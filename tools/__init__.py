"""Tools beside the packages: the demo, and the test bed shared by tests/ and bench/."""
