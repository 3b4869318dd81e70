"""Argument checks shared by the quantizer's API, its Relax path and ``dsa-tvm quantize``.

Every bad value is an error naming the argument, the value and what is valid: an
argument that is silently ignored (a ``keep_fp32`` name that matches no node, a negative
layer budget) would leave the user believing something happened that did not.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable


def check_keep_fp32(names: Iterable[str], known: Iterable[str], folded: Iterable[str] = (),
                    what: str = "node") -> None:
    """Every name in ``keep_fp32`` must name a ``what`` of the model (closest matches listed);
    ``folded``: names that existed but were folded away (batch norms into convolutions)."""
    known = sorted(set(known))
    folded = set(folded)
    for n in names:
        if n in known:
            continue
        if n in folded:
            raise ValueError(f"keep_fp32: '{n}' was folded into the layer before it (batch "
                             "norm or per-channel scale folding); name that layer instead")
        close = difflib.get_close_matches(n, known, n=5, cutoff=0.4)
        hint = f"closest: {', '.join(close)}" if close else \
            f"{len(known)} exist, e.g. {', '.join(known[:5])}"
        raise ValueError(f"keep_fp32: no {what} named '{n}' in the model ({hint})")


def check_target_cosine(target: float) -> None:
    if not (isinstance(target, (int, float)) and math.isfinite(target) and 0 < target <= 1):
        raise ValueError(f"target cosine must be in (0, 1] (a cosine similarity), got {target!r}")


def check_max_fp32(max_fp32: int) -> None:
    if isinstance(max_fp32, bool) or not isinstance(max_fp32, int) or max_fp32 < 1:
        raise ValueError(f"max_fp32 (layers mixed precision may keep in FP32) must be a positive "
                         f"integer, got {max_fp32!r}")


def check_percentile(percentile: float) -> None:
    if not (isinstance(percentile, (int, float)) and 0 < percentile <= 100):
        raise ValueError(f"percentile must be in (0, 100], got {percentile!r}")
