"""How work is cut into shards, one rule for every sharded stage: rows of a Parquet table (vocabulary,
encoding, co-occurrence) and bytes of a large text file (ingestion)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

# Shard counts above this are a multiple of it: 1, 2, 4 or 8 workers then end their last wave together.
WAVE = 8


def shard_count(total: int, most: int) -> int:
    """How many shards of at most `most` units cover `total`: a power of two up to `WAVE`, else a multiple
    of it. With 14 co-occurrence shards 4 workers ran waves of 4, 4, 4 and 2, the last half idle (2.67x of
    one process); 16 end together. The count follows the data alone, never the runner, because the shards
    are the artifacts' row groups and those must not depend on where they ran."""
    n = max(1, math.ceil(total / most))
    return 1 << (n - 1).bit_length() if n <= WAVE else math.ceil(n / WAVE) * WAVE


def equal_ranges(total: int, most: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most `most` units covering `total` (one range when empty), `shard_count`
    of them, of equal sizes to a unit: a short last shard left one of 2 workers idle while the other ran
    its last full one."""
    n = shard_count(total, most)
    return [(i * total // n, (i + 1) * total // n) for i in range(n)]


def aligned(ranges: list[tuple[int, int]], starts: Sequence[int], slack: float = 1 / 32) -> list[tuple[int, int]]:
    """`ranges` with each cut between two moved to the nearest of `starts` (a table's row-group starts, sorted)
    when one lies within `slack` of a shard's size of it. A shard reads whole row groups (`read_rows`), so a
    cut a few rows off a group boundary made two shards decode that group: the documents' groups are the
    ingestion shards, the vocabulary shards are cut by bytes, and 2 of the 4 shards of a 256 MB corpus read
    two or three 64 MiB groups for one (0.23-0.98 s against 0.10 s, most of it the fresh memory). A small
    `slack` keeps the shards within a few % of equal: at 1/8, co-occurrence's 500 000-sentence shards over
    the tokens' 65 536-row groups moved by up to 14 %, and its 2-worker run fell from 1.69-1.73x of one
    process to 1.55x. With `slack` < 1/2 the cuts stay in order and no shard is empty."""
    if len(ranges) < 2 or not starts:
        return ranges
    width = (ranges[-1][1] - ranges[0][0]) / len(ranges)
    cuts = []
    for _, cut in ranges[:-1]:
        i = bisect.bisect_left(starts, cut)
        nearest = min(starts[max(0, i - 1):i + 1], key=lambda start: abs(start - cut))
        cuts.append(nearest if abs(nearest - cut) <= slack * width else cut)
    bounds = [ranges[0][0], *cuts, ranges[-1][1]]
    return list(zip(bounds[:-1], bounds[1:], strict=True))
