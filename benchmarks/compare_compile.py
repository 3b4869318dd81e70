"""DSA compile time of two revisions of the project, measured side by side in one run.

A restructuring must not slow the compiler down. Wall-clock figures from different
runs are meaningless on a shared machine, so this script exports the base revision
(``git archive``) next to the working tree and times both in alternating child
processes (same machine, same minute), best of ``--repeat``::

    python benchmarks/compare_compile.py --base 1f632af            # default nets, default preset
    python benchmarks/compare_compile.py --base main~3 resnet50 --size 224 --repeat 3

Each child compiles the QDQ network with ``tvm.compile(mod, target=dsa_tvm.target(...))``
(import time excluded) and prints the seconds; the table shows both revisions and
their ratio (new / base: below 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NETS = ("resnet18", "resnet50", "mobilenet_v2", "transformer_encoder")

_CHILD = """
import json, sys, time
import tvm
from tvm.relax.frontend.onnx import from_onnx
import dsa_tvm
from dsa_tvm.models.zoo import get_model
net, preset, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
kw = {} if net == "transformer_encoder" else {"input_size": size}
model = get_model(net, quantized=True, **kw)
cfg = dsa_tvm.load_config(preset)
t0 = time.perf_counter()
tvm.compile(from_onnx(model, keep_params_in_input=False), target=dsa_tvm.target(cfg))
print(json.dumps({"seconds": time.perf_counter() - t0, "file": dsa_tvm.__file__}))
"""


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (a commit, tag or branch of this repository) under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def time_compile(tree: Path, net: str, preset: str, size: int) -> float:
    """Seconds one compile of ``net`` takes with the project at ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _CHILD, net, preset, str(size)], env=env,
                         capture_output=True, text=True, cwd=tree)
    if out.returncode:
        raise RuntimeError(f"compile of {net} at {tree} failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["file"].startswith(str(tree)):
        raise RuntimeError(f"the child imported {res['file']}, not the tree {tree}")
    return res["seconds"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nets", nargs="*", default=list(NETS))
    ap.add_argument("--base", required=True, help="the revision to compare against")
    ap.add_argument("--hw", default="default", help="preset name")
    ap.add_argument("--size", type=int, default=224, help="CNN input size")
    ap.add_argument("--repeat", type=int, default=2, help="compiles per net and revision")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="dsa-base-") as tmp:
        base = export(a.base, Path(tmp))
        print(f"base {a.base} at {base}, new: working tree {ROOT}; preset {a.hw}, "
              f"best of {a.repeat}", flush=True)
        print(f"{'network':<20} {'base s':>8} {'new s':>8} {'new/base':>9}")
        total = {"base": 0.0, "new": 0.0}
        for net in a.nets:
            best = {"base": float("inf"), "new": float("inf")}
            for _ in range(a.repeat):  # alternate so both see the same machine load
                for which, tree in (("base", base), ("new", ROOT)):
                    best[which] = min(best[which], time_compile(tree, net, a.hw, a.size))
            for k in total:
                total[k] += best[k]
            print(f"{net:<20} {best['base']:>8.2f} {best['new']:>8.2f} "
                  f"{best['new'] / best['base']:>9.3f}", flush=True)
        print(f"{'total':<20} {total['base']:>8.2f} {total['new']:>8.2f} "
              f"{total['new'] / total['base']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
