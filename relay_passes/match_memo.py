"""Each candidate match of one compile described and checked once.

Two stages ask the same question of the same graph nodes: the partition report
(``partition.pattern_decisions``: why each op stays on the CPU) and the
FuseOpsByPattern check functions (``partition.fusion_patterns``: which matches
become DSA layers). Both ask "does pattern ``i`` rooted at this quantize describe a
layer the DSA runs?". A :class:`MatchMemo` answers once per (pattern, root) and
remembers the answer for the rest of the compile.

The check functions see nodes of the very module ``pattern_decisions`` walked
(FuseOpsByPattern hands over its ``annotated_expr["root"]``, the same object), so the
key is the pattern's index and the root's identity. Asked first by FuseOpsByPattern
(a root ``pattern_decisions`` never reached), the memo describes it from the match's
own bindings, as the check function always did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tvm import relax

from dsa_tvm.hw.config import HardwareConfig

from .kinds import check, describe, pattern_specs
from .kinds.match import Match, NotAMatch, UnsupportedShape
from .kinds.spec import PatternSpec

Lookup = Mapping[relax.Var, relax.Expr] | Callable[[relax.Var], "relax.Expr | None"]


@dataclass(frozen=True)
class Verdict:
    """What one (pattern, root) pair is: a layer the DSA runs, or why not.

    Only a refused match keeps its :class:`Match` (the report names its ops); an accepted
    one is not read again, and keeping its weights would hold a second copy of the
    model's for the rest of the compile."""

    ok: bool
    why: str = ""               # the failed constraint ("<name>: <reason>") or the shape problem
    match: Match | None = None  # the refused match (None when accepted or ``bad_shape``)
    bad_shape: bool = False     # the structure matched, a shape did not


class MatchMemo:
    """describe + check of every (pattern, root) pair at most once, for one ``cfg``."""

    def __init__(self, cfg: HardwareConfig) -> None:
        self.cfg = cfg
        self.specs: list[PatternSpec] = pattern_specs()
        # (pattern index, hash(root)) -> (root, verdict or None for "not this kind"); the
        # root is kept so its address (the hash) cannot be reused by another node
        self._seen: dict[tuple[int, int], tuple[relax.Expr, Verdict | None]] = {}

    def verdict(self, index: int, root: relax.Expr, lookup: Lookup) -> Verdict | None:
        """The verdict of pattern ``index`` at quantize ``root`` (bindings read through
        ``lookup``), or None when ``root`` is not a match of that pattern's kind."""
        key = (index, hash(root))
        hit = self._seen.get(key)
        if hit is not None and hit[0].same_as(root):
            return hit[1]
        verdict = self._decide(self.specs[index], root, lookup)
        self._seen[key] = (root, verdict)
        return verdict

    def _decide(self, spec: PatternSpec, root: relax.Expr, lookup: Lookup) -> Verdict | None:
        try:
            m = describe(spec.kind, root, lookup)
        except UnsupportedShape as e:  # the structure matches, the shape does not
            return Verdict(False, str(e), bad_shape=True)
        except NotAMatch:
            return None
        ok, why = check(m, self.cfg)
        return Verdict(True) if ok else Verdict(False, why, m)

    def __len__(self) -> int:
        return len(self._seen)
