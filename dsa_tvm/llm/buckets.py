"""Static shape buckets: which compiled step serves a prompt or a context length."""

from __future__ import annotations

#: prompt lengths a prefill step is compiled for (a prompt is padded to the next one)
PREFILL = (16, 64, 256, 512)
#: cache capacities a decode step is compiled for (the context's next one)
CONTEXT = (128, 512, 2048)


def bucket(n: int, sizes: tuple[int, ...], what: str) -> int:
    """The smallest of ``sizes`` that holds ``n``."""
    for s in sizes:
        if n <= s:
            return s
    raise ValueError(f"{what} of {n} tokens exceeds the largest bucket ({sizes[-1]}); "
                     f"shorten it or pass larger buckets")


def check_buckets(sizes, what: str) -> tuple[int, ...]:
    """Bucket sizes as a sorted tuple of positive whole numbers, or a ValueError."""
    out = tuple(sorted({int(s) for s in sizes})) if sizes else ()
    if not out or out[0] < 1 or any(float(s) != int(s) for s in sizes):
        raise ValueError(f"{what} must be positive whole numbers, got {sizes!r}")
    return out
