"""The mechanism's own modules, private to ``zeal`` (the edge, the server, benchmarks and tools
use the names ``zeal`` and its public modules export; a test holds them to that): the
mechanism and its samplers, the code width, randomness, the exact sums, the privacy audit,
the firmware profiles."""
