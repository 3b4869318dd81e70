"""Program bytes of the bundled networks, hashed: a restructuring must leave them identical.

Compiles ResNet-18, ResNet-50, MobileNetV2 and the transformer encoder block (QDQ int8)
for each preset and hashes every region's program (``compile_region(...).to_bytes``:
default schedules, no per-compile id), so two revisions can be compared byte for byte::

    python benchmarks/program_hashes.py --write hashes.json     # before the change
    python benchmarks/program_hashes.py --check hashes.json     # after: exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

NETS = ("resnet18", "resnet50", "mobilenet_v2", "transformer_encoder")
PRESETS = ("default", "edge", "large")
#: builder arguments: CNNs at a small input (the same layer kinds and code paths as 224)
SIZES = {"resnet18": {"input_size": 64}, "resnet50": {"input_size": 64},
         "mobilenet_v2": {"input_size": 64}, "transformer_encoder": {}}


def _program_bytes(prog, cfg) -> bytes:
    """The program's bytes without the id of the compile that last handed it out (the
    program cache shares one program between compiles, each stamping its own id)."""
    saved = prog.meta
    prog.meta = {k: v for k, v in saved.items() if k != "compile"}
    try:
        return prog.to_bytes(cfg)
    finally:
        prog.meta = saved


def region_hashes(net: str, preset: str) -> dict[str, str]:
    """Region name -> sha256 of its program bytes, for ``net`` compiled for ``preset``."""
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.lowering.region import compile_region
    from dsa_tvm.models.zoo import get_model

    cfg = dsa_tvm.load_config(preset)
    mod = from_onnx(get_model(net, quantized=True, **SIZES[net]), keep_params_in_input=False)
    tvm.compile(mod, target=dsa_tvm.target(cfg))
    out = {}
    for d in dsa_tvm.last_compile_report().regions:
        if d.region is None:
            continue
        try:
            data = _program_bytes(compile_region(d.region, cfg).program, cfg)
        except Exception as e:  # noqa: BLE001 - a region the codegen refuses: its reason is the record
            out[d.name] = f"refused: {type(e).__name__}"
            continue
        out[d.name] = hashlib.sha256(data).hexdigest()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", nargs="*", default=list(NETS))
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="JSON", help="save the hashes")
    g.add_argument("--check", metavar="JSON", help="compare with saved hashes (exit 1 on a difference)")
    a = ap.parse_args(argv)
    hashes: dict[str, dict[str, str]] = {}
    for net in a.nets:
        for preset in a.presets:
            t0 = time.perf_counter()
            hashes[f"{net}@{preset}"] = h = region_hashes(net, preset)
            digest = hashlib.sha256(json.dumps(h, sort_keys=True).encode()).hexdigest()[:16]
            print(f"{net:<20} {preset:<8} {len(h):>3} regions  {digest}  "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    if a.write:
        with open(a.write, "w") as f:
            json.dump(hashes, f, indent=1, sort_keys=True)
        print(f"wrote {a.write}")
    if a.check:
        with open(a.check) as f:
            want = json.load(f)
        bad = [f"{k}: {r}" for k in sorted(set(want) | set(hashes)) if k in hashes
               for r in sorted(set(want.get(k, {})) | set(hashes[k]))
               if want.get(k, {}).get(r) != hashes[k].get(r)]
        print("identical program bytes" if not bad else "DIFFERENT:\n  " + "\n  ".join(bad))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
