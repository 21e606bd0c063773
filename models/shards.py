"""How work is cut into shards, one rule for every sharded stage: rows of a Parquet table (vocabulary,
encoding, co-occurrence) and bytes of a large text file (ingestion)."""

from __future__ import annotations

import math

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
