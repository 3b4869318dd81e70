"""Load a hardware description into one frozen, validated config object.

Every hardware number used anywhere in dsa-tvm (ISA field widths, scratchpad
sizes the scheduler tiles for, partitioner limits, simulator timing) is read
from a :class:`HardwareConfig`; nothing restates one by hand.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from . import area
from .schema import FIELDS, FINGERPRINT_OMIT_AT_DEFAULT, SECTIONS, FieldSpec
from .sparsity import n_m_tile_bytes, parse_n_m


class ConfigError(ValueError):
    """A hardware description broke a rule; the message names the field and the rule."""


def presets_dir() -> Path:
    """The folder of bundled presets: ``dsa_tvm/_presets`` in an installed wheel (the build
    copies ``target/*.toml`` there, see ``setup.py``), else ``target/`` at the top of the
    source tree (the presets' source of truth)."""
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "_presets", here.parents[1] / "target"):
        if cand.is_dir() and any(cand.glob("*.toml")):
            return cand
    raise ConfigError("cannot find the bundled presets folder 'target/' (nor dsa_tvm/_presets); "
                      "reinstall dsa-tvm (pip install .) or run from its source tree")


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


@dataclass(frozen=True)
class HardwareConfig:
    """A validated hardware description plus the quantities derived from it.

    Raw fields are attributes named as in the TOML file without their section
    (``cfg.block_in``, ``cfg.acc_kib``, ``cfg.mhz``). Use :func:`load_config`.
    """

    values: Mapping[str, Any]
    source: str = field(default="<dict>", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        # raw fields become plain attributes: hot simulator loops read them
        for k, v in self.values.items():
            object.__setattr__(self, k, v)

    # --- element / vector sizes
    @cached_property
    def inp_row_bytes(self) -> int:
        return self.block_in

    @cached_property
    def wgt_tile_bytes(self) -> int:
        return self.block_in * self.block_out

    @cached_property
    def acc_row_bytes(self) -> int:
        return 4 * self.block_out

    # --- scratchpad depths, in their addressing units
    @cached_property
    def inp_depth(self) -> int:
        """Rows of block_in int8 elements in the input scratchpad."""
        return self.inp_kib * 1024 // self.inp_row_bytes

    @cached_property
    def wgt_depth(self) -> int:
        """Tiles of block_out x block_in int8 weights in the weight scratchpad."""
        return self.wgt_kib * 1024 // self.wgt_tile_bytes

    @cached_property
    def acc_depth(self) -> int:
        """Rows of block_out int32 lanes in the accumulator scratchpad."""
        return self.acc_kib * 1024 // self.acc_row_bytes

    @cached_property
    def _element_bytes(self) -> tuple[int, int, int, int, int, int, int]:
        return (self.inp_row_bytes, self.wgt_tile_bytes, self.acc_row_bytes, self.block_out,
                self.wgt_tile_bytes // 2, self.sparse_tile_bytes, 2 * self.block_out)

    def element_bytes(self, buffer: int) -> int:
        """Bytes of one addressing unit of a LOAD/STORE ``Buffer`` (INP, WGT, ACC, ACC8,
        WGT4: a weight tile of int4 codes, two a byte; WGTS: a compressed N:M tile; ACC16:
        a row of block_out int16 values)."""
        return self._element_bytes[buffer]

    # --- structured sparsity
    @cached_property
    def sparse_n_m(self) -> tuple[int, int] | None:
        """(N, M) of ``array.sparsity`` (None: a dense array)."""
        return parse_n_m(self.values.get("sparsity", "dense"))

    @cached_property
    def sparse_tile_bytes(self) -> int:
        """DRAM bytes of one compressed N:M weight tile (WGTS): the kept int8 values, then
        log2(M) index bits per kept value, rounded up to whole bytes (0 on a dense array)."""
        if self.sparse_n_m is None:
            return 0
        n, m = self.sparse_n_m
        return n_m_tile_bytes(self.block_out, self.block_in, n, m)

    @cached_property
    def dram_align(self) -> int:
        """Alignment of DRAM regions: every buffer's element size divides it."""
        return max(64, self.wgt_tile_bytes, self.acc_row_bytes)

    @cached_property
    def dram_bytes(self) -> int:
        return self.size_mib * 1024 * 1024

    # --- throughput
    @cached_property
    def peak_macs_per_cycle(self) -> int:
        return self.block_in * self.block_out

    @property
    def peak_gops(self) -> float:
        """Peak int8 giga-operations per second (a MAC counts as 2 operations)."""
        return 2 * self.peak_macs_per_cycle * self.mhz / 1e3

    @cached_property
    def alu_cycles_per_row(self) -> float:
        """Cycles per ALU step: whole cycles up to a row per cycle, a fraction for a unit
        wider than a row (lanes > block_out)."""
        if self.lanes > self.block_out:
            return self.block_out / self.lanes
        return math.ceil(self.block_out / self.lanes)

    def alu_step_cycles(self, steps: int) -> int:
        """Cycles ``steps`` ALU steps of one instruction take (without the pipeline)."""
        if self.lanes > self.block_out:
            return math.ceil(steps * self.block_out / self.lanes)
        return steps * math.ceil(self.block_out / self.lanes)

    @cached_property
    def dot_ways(self) -> int:
        """Products a MAC8 lane adds per step: ``mac8_ways``, capped so that the vector unit
        never multiplies faster than the MAC array (the compute bound every layer is held to
        stays a bound when a sweep narrows the array)."""
        return max(1, min(self.mac8_ways, self.peak_macs_per_cycle // self.lanes))

    def mac8_steps(self, loops) -> int:
        """ALU steps of a MAC8 over ``loops`` ((extent, dst stride) pairs): each destination
        row takes ceil(reduction points / dot_ways) steps, the reduction points being the
        levels of destination stride 0."""
        red = out = 1
        for extent, dst in loops:
            if dst == 0:
                red *= extent
            else:
                out *= extent
        return out * math.ceil(red / self.dot_ways)

    @cached_property
    def table_present(self) -> bool:
        """The vector unit has the activation table unit (ALU LUT)."""
        return bool(self.table_unit)

    @cached_property
    def lut_lookups_per_cycle(self) -> int:
        """Table lookups per cycle: the field, or one per vector lane when it is 0."""
        return self.table_lookups_per_cycle or self.lanes

    @cached_property
    def lut_cycles_per_row(self) -> int:
        """Cycles of one ALU LUT step over an accumulator row."""
        return math.ceil(self.block_out / self.lut_lookups_per_cycle)

    @cached_property
    def gemm_fill_drain_cycles(self) -> int:
        """Cycles to fill and drain the systolic array, paid once per GEMM instruction."""
        return self.block_in + self.block_out

    @cached_property
    def _sparse_ways(self) -> int:
        """Loop points a sparse GEMM runs per cycle (M / N; 1 on a dense array)."""
        return self.sparse_n_m[1] // self.sparse_n_m[0] if self.sparse_n_m else 1

    @cached_property
    def wgt_port(self) -> int:
        """Weight-scratchpad read bytes per cycle (0 in the description: one tile a cycle,
        or the M / N compressed tiles a sparse array takes a cycle)."""
        if self.wgt_port_bytes:
            return self.wgt_port_bytes
        return max(self.wgt_tile_bytes, self._sparse_ways * self.sparse_tile_bytes)

    @cached_property
    def inp_port(self) -> int:
        """Input-scratchpad read bytes per cycle (0 in the description: one row a cycle, or
        the M / N rows a sparse array takes a cycle)."""
        return self.inp_port_bytes or self._sparse_ways * self.inp_row_bytes

    @property
    def is_cim(self) -> bool:
        """An analog in-memory-compute part: constant-weight GEMMs run on crossbars."""
        return self.crossbars > 0

    @property
    def packs_sparse_weights(self) -> bool:
        """The compiler stores N:M-sparse constant weights compressed (WGTS loads) and
        runs their GEMMs sparse: the array declares ``array.sparsity``."""
        return self.sparse_n_m is not None and not self.is_cim

    @property
    def packs_int4_weights(self) -> bool:
        """The compiler stores int4-fitting constant weights two a byte (WGT4 loads): the
        part unpacks them and is not a CIM part (whose weights live in its crossbars)."""
        return bool(self.int4_weights) and not self.is_cim

    @property
    def energy_modelled(self) -> bool:
        return any(self.values[k] > 0 for k in ("mac_pj", "alu_lane_op_pj", "sram_byte_pj",
                                                 "dram_byte_pj", "table_lookup_pj", "mvm_pj",
                                                 "adc_pj"))

    @cached_property
    def area_mm2(self) -> float:
        """Estimated silicon area from the [area] costs (dsa_tvm.hw.area), for sweeps that
        weigh cycles against area."""
        return area.area_mm2(self)

    # --- identity
    @cached_property
    def fingerprint(self) -> bytes:
        """16-byte digest of every field; programs carry it and refuse other configs.
        Fields added later are left out while at their default (FINGERPRINT_OMIT_AT_DEFAULT)."""
        omit = {f.name for f in FIELDS
                if f.key in FINGERPRINT_OMIT_AT_DEFAULT and self.values[f.name] == f.default}
        canon = json.dumps({k: v for k, v in sorted(self.values.items()) if k not in omit},
                           sort_keys=True)
        return hashlib.sha256(canon.encode()).digest()[:16]

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """The description as nested sections, as it would be written in TOML. Fields added
        later are left out while at their default (as in the fingerprint): loading the dict
        gives them back, and programs and tuning records written before they existed
        carry the same description."""
        out: dict[str, dict[str, Any]] = {}
        for f in FIELDS:
            v = self.values[f.name]
            if f.key in FINGERPRINT_OMIT_AT_DEFAULT and v == f.default:
                continue
            if f.section:
                out.setdefault(f.section, {})[f.name] = v
            else:
                out[f.name] = v  # type: ignore[assignment]
        return out

    def to_toml(self) -> str:
        """The description as a TOML file ``load_config`` reads back as the same description
        (a design picked from a sweep, saved for ``--hw``)."""
        def value(v: Any) -> str:
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, str):
                return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            return repr(v)  # int or float (inf and nan are TOML floats too)

        doc = self.as_dict()
        lines = [f"{k} = {value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
        for section, fields in doc.items():
            if isinstance(fields, dict):
                lines += ["", f"[{section}]", *(f"{k} = {value(v)}" for k, v in fields.items())]
        return "\n".join(lines) + "\n"

    def replace(self, **changes: Any) -> "HardwareConfig":
        """A new validated config with some fields changed (flat names: ``block_in=32``)."""
        nested = self.as_dict()
        for f in FIELDS:  # the fields as_dict leaves out at their default
            if f.section:
                nested.setdefault(f.section, {}).setdefault(f.name, self.values[f.name])
        spec_by_name = {f.name: f for f in FIELDS}
        for k, v in changes.items():
            if k not in spec_by_name:
                raise ConfigError(f"unknown hardware field '{k}'")
            f = spec_by_name[k]
            if f.section:
                nested.setdefault(f.section, {})[k] = v
            else:
                nested[k] = v
        return config_from_dict(nested, source=f"{self.source} (modified)")

    def summary(self) -> str:
        return (f"{self.name}: {self.block_out}x{self.block_in} int8 array "
                f"({self.peak_macs_per_cycle} MACs/cycle), SRAM inp/wgt/acc "
                f"{self.inp_kib}/{self.wgt_kib}/{self.acc_kib} KiB, DRAM "
                f"{self.bandwidth_bytes_per_cycle:g} B/cycle + {self.latency_cycles} cycles, "
                f"{self.lanes} vector lanes, {self.mhz:g} MHz")

    def __repr__(self) -> str:
        return f"HardwareConfig({self.summary()})"

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HardwareConfig) and self.fingerprint == other.fingerprint


def _coerce(spec: FieldSpec, value: Any, source: str) -> Any:
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec.type is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: field '{spec.key}' must be true or false, got {value!r}")
        return value
    if not isinstance(value, spec.type) or isinstance(value, bool):
        raise ConfigError(f"{source}: field '{spec.key}' must be "
                          f"{spec.type.__name__}, got {value!r}")
    return value


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> HardwareConfig:
    """Validate a nested description (sections as tables) into a HardwareConfig."""
    flat: dict[str, Any] = {}
    known_sections = set(SECTIONS) - {""}
    for key, value in data.items():
        if isinstance(value, Mapping):
            if key not in known_sections:
                raise ConfigError(f"{source}: unknown section [{key}] "
                                  f"(known: {', '.join(sorted(known_sections))})")
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        else:
            flat[f".{key}"] = value
    values: dict[str, Any] = {}
    by_key = {f"{f.section}.{f.name}": f for f in FIELDS}
    for k in flat:
        if k not in by_key:
            sec, name = k.split(".", 1)
            where = f"[{sec}]" if sec else "the top level"
            raise ConfigError(f"{source}: unknown field '{name}' in {where}")
    for k, spec in by_key.items():
        if k in flat:
            v = _coerce(spec, flat[k], source)
        elif spec.default is not None:
            v = spec.default
        else:
            raise ConfigError(f"{source}: missing required field '{spec.key}' ({spec.doc})")
        if not spec.check(v):
            raise ConfigError(f"{source}: field '{spec.key}' = {v!r} breaks the rule: {spec.rule}")
        values[spec.name] = v
    cfg = HardwareConfig(values=values, source=source)
    _check_cross_field_rules(cfg, source)
    return cfg


def _check_cross_field_rules(cfg: HardwareConfig, source: str) -> None:
    if cfg.lanes > cfg.block_in * cfg.block_out:  # never above the array: the compute bound
        raise ConfigError(f"{source}: field 'vector.lanes' = {cfg.lanes} breaks the rule: "
                          f"at most array.block_in * array.block_out "
                          f"({cfg.block_in * cfg.block_out})")
    for fld, unit in (("inp_kib", cfg.inp_row_bytes), ("wgt_kib", cfg.wgt_tile_bytes),
                      ("acc_kib", cfg.acc_row_bytes)):
        if (cfg.values[fld] * 1024) % unit:
            raise ConfigError(f"{source}: field 'sram.{fld}' = {cfg.values[fld]} breaks the rule: "
                              f"must hold a whole number of {unit}-byte rows/tiles")
    if cfg.crossbars:
        _check_cim_rules(cfg, source)
    if cfg.sparse_n_m is not None:
        _check_sparsity_rules(cfg, source)
    for key, rule in _RULES_ABOVE:
        problem = rule(cfg)
        if problem:
            raise ConfigError(f"{source}: field '{key}' = {cfg.values[key.split('.')[-1]]} "
                              f"breaks the rule: {problem}")


def _check_cim_rules(cfg: HardwareConfig, source: str) -> None:
    """The [cim] fields that constrain each other (only for a part with crossbars)."""
    rules = (
        ("crossbar_rows", cfg.crossbar_rows % cfg.block_in == 0,
         f"must be a multiple of array.block_in ({cfg.block_in}): a read sums whole input rows"),
        ("bits_per_cell", cfg.bits_per_cell * cfg.cells_per_weight >= 8,
         f"bits_per_cell x cells_per_weight ({cfg.bits_per_cell} x {cfg.cells_per_weight}) "
         f"must be >= 8 to hold |w| up to 128"),
        ("cols_per_adc", cfg.cols_per_adc <= cfg.crossbar_cols,
         f"at most cim.crossbar_cols ({cfg.crossbar_cols})"),
        ("cells_per_weight", cfg.cells_per_weight <= cfg.crossbar_cols,
         f"at most cim.crossbar_cols ({cfg.crossbar_cols})"),
    )
    for name, ok, why in rules:
        if not ok:
            raise ConfigError(f"{source}: field 'cim.{name}' = {cfg.values[name]} breaks the "
                              f"rule: {why}")


def _check_sparsity_rules(cfg: HardwareConfig, source: str) -> None:
    """``array.sparsity`` against the fields it depends on."""
    n, m = cfg.sparse_n_m
    problem = None
    if cfg.block_in % m:
        problem = f"M = {m} must divide array.block_in ({cfg.block_in}): a group lies in one tile"
    elif cfg.dataflow == "weight-stationary":
        problem = ('a weight-stationary array streams points past a preloaded tile, which '
                   'sparsity does not shorten; use dataflow "matrix-vector" or '
                   '"output-stationary", or sparsity "dense"')
    elif cfg.crossbars:
        problem = "a CIM part keeps its weights in crossbars; use sparsity \"dense\""
    if problem:
        raise ConfigError(f"{source}: field 'array.sparsity' = {cfg.sparsity!r} breaks the "
                          f"rule: {problem}")


#: (field key, rule) added by the layers sized from a config, which this module must not
#: import: the ISA checks that its instruction formats fit ``isa.instruction_bits``.
_RULES_ABOVE: list[tuple[str, Callable[[HardwareConfig], "str | None"]]] = []


def add_rule(key: str, rule: Callable[[HardwareConfig], "str | None"]) -> None:
    """Check every description loaded from now on with ``rule`` (None, or the problem with
    field ``key``); called once by the module that owns the rule, when it is imported."""
    if (key, rule) not in _RULES_ABOVE:
        _RULES_ABOVE.append((key, rule))


def load_config(spec: "str | Path | HardwareConfig | None" = None) -> HardwareConfig:
    """A preset name (``"default"``, ``"edge"``, ``"large"``), a TOML file path, or a config.

    A name without the ``.toml`` suffix is a preset when one has that name, even if a file
    or folder of the same name is in the current directory (:func:`shadowed_by`)."""
    if isinstance(spec, HardwareConfig):
        return spec
    if spec is None:
        spec = "default"
    path = Path(spec)
    if path.suffix != ".toml":
        preset = presets_dir() / f"{path.name}.toml"
        if str(spec) == path.name and preset.is_file():
            path = preset   # even if a file or folder here has that name (see shadowed_by)
        elif not path.is_file():
            what = "a folder, not a hardware description" if path.is_dir() else "not found"
            raise ConfigError(f"unknown hardware preset '{spec}' ({what}); use one of the "
                              f"presets {', '.join(preset_names())} or a .toml file")
    if path.is_dir():
        raise ConfigError(f"hardware description '{path}' is a folder; pass a .toml file or one "
                          f"of the presets {', '.join(preset_names())}")
    if not path.exists():
        raise ConfigError(f"hardware description file not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the hardware description: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    return config_from_dict(data, source=str(path))


def with_overrides(cfg: HardwareConfig, assignments: "list[str] | tuple[str, ...]") -> HardwareConfig:
    """``cfg`` with ``section.field=value`` (or ``field=value``) assignments applied, as the
    CLI's ``--set`` gives them: the value is read as a TOML value (``32``, ``true``,
    ``16.0``) and taken as text when it is not one (``weight-stationary``)."""
    changes: dict[str, Any] = {}
    by_key = {f.key: f.name for f in FIELDS} | {f.name: f.name for f in FIELDS}
    for text in assignments:
        key, sep, raw = text.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or key not in by_key:
            raise ConfigError(f"--set {text!r}: expected section.field=value with a field of "
                              f"the hardware description (docs/hardware.md)")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        changes[by_key[key]] = value
    return cfg.replace(**changes) if changes else cfg


def shadowed_by(spec: str) -> Path | None:
    """The file or folder in the current directory that has the name of preset ``spec``
    (``load_config`` takes the preset; a caller may say so), else None."""
    path = Path(spec)
    if (path.suffix != ".toml" and spec == path.name and path.exists()
            and (presets_dir() / f"{spec}.toml").is_file()):
        return path.resolve()
    return None
