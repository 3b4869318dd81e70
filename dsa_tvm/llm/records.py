"""What a decoder's run reports: each step's record (cycles, launches, DRAM bytes by kind,
MACs, the host's modelled share) and a generation's summary of them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepRecord:
    """One step on the device: what it computed and what it cost."""

    kind: str                 # "sink" (the first token, host FP32), "prefill" or "decode"
    tokens: int               # real tokens (the bucket may be larger)
    bucket: tuple[int, int]   # (tokens, cache slots) of the compiled step
    context: int              # cache length before the step
    cycles: int = 0
    launches: int = 0
    dram_read: int = 0
    dram_written: int = 0
    #: dram_read by what it is (llm.traffic): weights, the KV cache, activations
    read_weights: int = 0
    read_kv: int = 0
    read_activations: int = 0
    macs_dsa: int = 0
    macs_cpu: int = 0
    #: the host's share of the step on the modelled system: a launch overhead per launch
    #: plus its MACs at the host's rate (both from the hardware description)
    host_us: float = 0.0
    wall_s: float = 0.0             # the simulator's (or torch's) wall time on this machine


def bandwidth_use(steps: list[StepRecord], bytes_per_cycle: float) -> float:
    """DRAM bytes the steps moved over what the DRAM could move in their cycles."""
    cyc = sum(s.cycles for s in steps)
    moved = sum(s.dram_read + s.dram_written for s in steps)
    return moved / (cyc * bytes_per_cycle) if cyc else 0.0


@dataclass
class Generation:
    text: str
    ids: list[int]
    prompt_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    mhz: float = 0.0
    bandwidth_bytes_per_cycle: float = 0.0

    def bandwidth_use(self, steps: list[StepRecord]) -> float:
        return bandwidth_use(steps, self.bandwidth_bytes_per_cycle)

    @property
    def prefill(self) -> list[StepRecord]:
        return [s for s in self.steps if s.kind == "prefill"]

    @property
    def decode(self) -> list[StepRecord]:
        return [s for s in self.steps if s.kind == "decode"]

    def summary(self) -> str:
        lines = [f"prompt {len(self.prompt_ids)} tokens, generated {len(self.ids)}"]
        p = self.prefill
        if p:
            cyc = sum(s.cycles for s in p)
            lines.append(f"  prefill: {sum(s.tokens for s in p)} tokens in {cyc:,} cycles "
                         f"({cyc / self.mhz / 1e3:.3f} ms), {sum(s.launches for s in p)} "
                         f"launch(es), DRAM {sum(s.dram_read for s in p) / 1e6:.2f} MB read "
                         f"(the first token on the host)")
        d = self.decode
        if d:
            cyc = float(np.mean([s.cycles for s in d]))
            wall = float(np.mean([s.wall_s for s in d]))
            if cyc:
                mean = {k: float(np.mean([getattr(s, k) for s in d])) / 1e6
                        for k in ("dram_read", "read_weights", "read_kv", "read_activations")}
                host = float(np.mean([s.host_us for s in d]))
                lines.append(f"  decode: {cyc:,.0f} cycles/token ({self.mhz * 1e6 / cyc:,.1f} "
                             f"tokens/s at {self.mhz:g} MHz), {d[-1].launches} launch(es)/token, "
                             f"simulator {wall:.2f} s/token")
                lines.append(f"    DRAM read/token {mean['dram_read']:.2f} MB: weights "
                             f"{mean['read_weights']:.2f}, KV cache {mean['read_kv']:.2f}, "
                             f"activations {mean['read_activations']:.2f}; bandwidth "
                             f"{self.bandwidth_use(d):.0%} used")
                lines.append(f"    time/token: DSA {cyc / self.mhz:,.0f} us, host {host:,.0f} "
                             f"us (launch overheads and CPU ops, modelled)")
            else:
                lines.append(f"  decode: no DSA launch (the compiler's cost model kept every "
                             f"region on the CPU, or quant fp32), {wall:.2f} s/token on the host")
        return "\n".join(lines)
