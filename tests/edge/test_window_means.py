"""Window-mean reporting (zeal_edge.sources.WindowMeans): one clipped mean per UTC-aligned
window, stamped at its start, carrying the source position of its last reading."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zeal_edge.sources import Reading, WindowMeans


class Listed:
    description = "test readings"

    def __init__(self, readings: list[Reading], skipped: int = 0) -> None:
        self.readings, self.skipped = readings, skipped

    def __iter__(self) -> Iterator[Reading]:
        yield from self.readings


HOUR = 3_600_000


def test_one_clipped_mean_per_window_stamped_at_its_start() -> None:
    readings = [
        Reading(10.0, 5 * HOUR + 1000, 1),
        Reading(20.0, 5 * HOUR + 2000, 2),
        Reading(200.0, 5 * HOUR + HOUR - 1, 3),  # clipped to 110 first
        Reading(30.0, 6 * HOUR, 4),
        Reading(-5.0, 8 * HOUR + 7, 5),  # a window later, clipped to 0
    ]
    means = list(WindowMeans(Listed(readings, skipped=2), 3600, (0.0, 110.0)))
    assert means == [
        Reading(pytest.approx((10 + 20 + 110) / 3), 5 * HOUR, 3),
        Reading(30.0, 6 * HOUR, 4),
        Reading(0.0, 8 * HOUR, 5),
    ]


def test_sixty_minutes_make_one_reading_and_nothing_is_lost_at_the_end() -> None:
    minutes = [Reading(float(m % 60), m * 60_000, m) for m in range(150)]
    source = WindowMeans(Listed(minutes, skipped=4), 3600, (0.0, 110.0))
    means = list(source)
    assert [r.timestamp_ms for r in means] == [0, HOUR, 2 * HOUR]
    assert [r.value for r in means] == [29.5, 29.5, 14.5]  # the last window holds 30 minutes
    assert source.skipped == 4  # the source's count of readings that were not numbers
    assert "one mean per 3600 s window" in source.description
