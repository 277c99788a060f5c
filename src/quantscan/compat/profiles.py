"""Chip profiles: TOML data files describing what an NPU converter accepts, loaded and validated.

Profiles are data, not code, so a user can describe their own chip (`--profile my_chip.toml`) and
every shipped limit can cite the vendor document it came from. Validation is strict (unknown key,
wrong type, unknown op name all fail) because a typo in a limit would otherwise silently disable it;
each error is one line naming the file, the key and the expected type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import tomllib

from quantscan.compat import profile_schema as schema
from quantscan.errors import FileError, ProfileError
from quantscan.readers.text import read_text
from quantscan.schemes import ChipSchemes, chip_schemes

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "profiles"
DEFAULT_PROFILE = "generic-npu"
ALL_PROFILES = "all"
"""`--profile all`: every shipped profile, checked on one analysis of the model (`check` only)."""
_ONNX_OPS = frozenset(s.name for s in onnx.defs.get_all_schemas_with_history())
# `npu = "*"` (the onnxruntime recipe runs every op): the inference domains only, not the training
# preview ops (Adam, Gradient, ...) no exported model carries.
_INFERENCE_OPS = frozenset(
    s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx", "ai.onnx.ml")
)


@dataclass(frozen=True)
class Sourced:
    """Where a section's facts come from; `unverified` caps its findings at warn."""

    source: str = ""
    unverified: bool = False


@dataclass(frozen=True)
class Limit:
    ops: frozenset[str]
    attribute: str
    min: float | None
    max: float | None
    allowed: tuple[Any, ...] | None
    when: str
    on_violation: str
    origin: Sourced
    note: str = ""

    def describe(self) -> str:
        """The limit as compat.csv shows it: `[1, 31]`, `<= 2048`, `one of [2, 4, 8]`."""
        if self.allowed is not None:
            return f"one of {list(self.allowed)}"
        if self.min is not None and self.max is not None:
            return f"[{_num(self.min)}, {_num(self.max)}]"
        if self.max is not None:
            return f"<= {_num(self.max)}"
        return f">= {_num(self.min or 0)}"


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    vendor: str
    description: str
    documents: tuple[str, ...]
    note: str
    activations: str
    weights: str
    per_channel_weights: bool
    weight_zero_point: bool
    """The chip's 8-bit weights carry a zero point per channel (asymmetric): its schemes' `w8` means that."""
    power_of_two_scales: bool
    fallback_precision: str
    quantization: Sourced
    opset_min: int | None
    opset_max: int | None
    opset: Sourced
    npu_ops: frozenset[str]
    cpu_ops: frozenset[str]
    folded_ops: frozenset[str]
    unsupported: str
    on_violation: str
    ops: Sourced
    fused_activations: frozenset[str]
    fusion_patterns: tuple[str, ...]
    fusion: Sourced
    npu_dtypes: frozenset[str]
    dtypes: Sourced
    max_rank: int | None
    max_dim: int | None
    max_batch: int | None
    max_elements: int | None
    static_shapes: bool
    tensor: Sourced
    limits: tuple[Limit, ...]
    recipe: str = "kernels"
    """Where quantization goes: "kernels" (the chip's fused kernels, CONTRACT "Quantization sites") or
    "onnxruntime" (quantize_static's QDQ placement, scanning/ort_recipe.py)."""
    float16_ops: frozenset[str] = frozenset()
    """Ops the toolkit runs in float16 on the NPU (int8 model): a recorded vendor run says so."""
    float16: Sourced | None = None
    consumer_range_ops: frozenset[str] = frozenset()
    """Pass-through ops whose *output* range sets the scale shared with their input: the kernel feeding
    one clips to it (rknn-toolkit2's quant_optimizer `adjust_no_change_node` on MaxPool)."""
    consumer_range: Sourced | None = None
    output_grid_ops: frozenset[str] = frozenset()
    """Activations whose int8 output grid the toolkit derives from their input grid, which holds 0: the grid
    reaches the op's value at 0 (Sigmoid 0.5) whatever calibration saw (rknn-toolkit2's quant_optimizer
    `adjust_tanh_sigmoid`; scanning/prepare.output_grid_points)."""
    output_grid: Sourced | None = None
    requantize_ops: frozenset[str] = frozenset()
    """Non-site ops the toolkit runs int8 on its own after a float region unless named (graph/requantize.py):
    a plan's exports name them with the float site before them."""
    requantize: Sourced | None = None
    input_follows_readers: bool = False
    """A model input is rounded to int8 only for an int8 reader: with every reader in float16 the toolkit feeds
    it unrounded (rknn-toolkit2's `fuse_two_dataconvert`), so keeping the input float is not a choice of its
    own (graph/mixed.MixedBuilder)."""
    input_rounding: Sourced | None = None
    depthwise_hardswish_point: bool = False
    """A depthwise Conv+HardSwish kernel rounds its pre-activation to int8 on its own grid (floored at -3,
    where HardSwish turns 0) before the HardSwish: a second int8 point inside the kernel (sites.Site.inner)."""
    kernel_points: Sourced | None = None
    schemes: Mapping[str, Any] | None = None
    """The `[schemes]` table: `names` the chip runs (shorthands, quantscan.schemes) and what its `a16`
    means (int16 or float); None: w8a8 only."""
    cost: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    """The `[cost]` table as written (figures, `sources`, `fitted`); None when the profile has none.
    `quantscan.cost.CostTable.of(profile)` reads it and names what is missing."""

    def supports(self, op_type: str) -> bool:
        return op_type in self.npu_ops or op_type in self.cpu_ops or op_type in self.folded_ops

    def chip_schemes(self) -> ChipSchemes:
        """The schemes this chip runs, as its shorthands mean them here (`[schemes]` and the weights'
        zero point)."""
        return chip_schemes(dict(self.schemes) if self.schemes else None, self.activations, self.weight_zero_point)


@dataclass(frozen=True)
class ProfileInfo:
    """What `quantscan profiles` lists: name first."""

    name: str
    vendor: str
    description: str
    path: Path


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.toml"))


def expand(specs: Sequence[str | Path]) -> list[str | Path]:
    """The profiles `specs` name, `all` replaced by every shipped name, each named once, in order."""
    out: list[str | Path] = []
    for spec in specs:
        names: list[str | Path] = [*shipped_names()] if spec == ALL_PROFILES else [spec]
        for name in names:
            if name not in out:
                out.append(name)
    return out


def list_profiles() -> list[ProfileInfo]:
    """Every shipped profile, sorted by name."""
    out = []
    for name in shipped_names():
        p = load_profile(name)
        out.append(ProfileInfo(p.name, p.vendor, p.description, p.path))
    return out


def resolve(spec: str | Path) -> Path:
    """A profile name (`rk3568`) or a path to a TOML file -> the file to read."""
    text = str(spec)
    path = Path(text)
    if isinstance(spec, Path) or text.endswith(".toml") or "/" in text or "\\" in text:
        if not path.is_file():
            raise ProfileError(f"expected a chip profile TOML file, found no file at {path}")
        return path
    if text == ALL_PROFILES:
        raise ProfileError(f"expected one chip profile, found '{ALL_PROFILES}' (every shipped profile: only "
                           f"`quantscan check` takes it)")
    candidate = SHIPPED_DIR / f"{text}.toml"
    if not candidate.is_file():
        known = ", ".join(shipped_names())
        raise ProfileError(f"unknown profile '{text}' (known: {known}; '{ALL_PROFILES}' in check; or give a path "
                           f"to a .toml file)")
    return candidate


def load_profile(spec: str | Path) -> Profile:
    """Read and validate one profile; every defect is a ProfileError naming file and key."""
    path = resolve(spec)
    try:
        data = tomllib.loads(read_text(path, f"profile {path}"))
    except FileError as exc:
        raise ProfileError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {path}: expected valid TOML, found a syntax error ({exc})") from exc
    _validate(path, data)
    return _build(path, data)


# --- validation -------------------------------------------------------------------------------


def _fail(path: Path, key: str, expected: str, found: object) -> ProfileError:
    return ProfileError(f"profile {path}: key '{key}' expects {expected}, found {found!r}")


def _validate(path: Path, data: Mapping[str, Any]) -> None:
    allowed = [*schema.SECTIONS, "limit"]
    for key, value in data.items():
        if key not in allowed:
            raise ProfileError(f"profile {path}: unknown key '{key}' (expected one of: {', '.join(allowed)})")
        if key == "limit":
            _validate_limits(path, value)
        else:
            _validate_table(path, key, value, schema.SECTIONS[key])
    name = data.get("meta", {}).get("name")
    if not name:
        raise _fail(path, "meta.name", "a string (the profile name)", name)
    _validate_scheme_names(path, data.get("schemes", {}).get("names", []))


def _validate_scheme_names(path: Path, names: Sequence[str]) -> None:
    """Every `[schemes] names` entry must be a shorthand quantscan.schemes reads (w4a16-g128, ...)."""
    from quantscan.errors import UsageError
    from quantscan.schemes import parse_scheme

    for name in names:
        try:
            parse_scheme(name)
        except UsageError:
            raise _fail(path, "schemes.names", "shorthands like w8a8, w8a16, w4a16-g128", name) from None


def _validate_table(path: Path, prefix: str, table: object, keys: Mapping[str, str]) -> None:
    if not isinstance(table, dict):
        raise _fail(path, prefix, "a table", table)
    for key, value in table.items():
        full = f"{prefix}.{key}"
        if key not in keys:
            raise ProfileError(f"profile {path}: unknown key '{full}' (expected one of: {', '.join(keys)})")
        _check_value(path, full, value, keys[key])


def _validate_limits(path: Path, limits: object) -> None:
    if not isinstance(limits, list):
        raise _fail(path, "limit", "an array of tables ([[limit]])", limits)
    for i, table in enumerate(limits):
        prefix = f"limit[{i}]"
        _validate_table(path, prefix, table, schema.LIMIT_KEYS)
        for required in ("op", "attribute", "source"):
            if required not in table:
                raise _fail(path, f"{prefix}.{required}", schema.LIMIT_KEYS[required], None)
        if not any(k in table for k in ("min", "max", "allowed")):
            raise _fail(path, f"{prefix}.max", "a number (or min/allowed)", None)


def _check_value(path: Path, key: str, value: Any, kind: str) -> None:
    ok = {
        schema.STR: isinstance(value, str),
        schema.INT: isinstance(value, int) and not isinstance(value, bool),
        schema.BOOL: isinstance(value, bool),
        schema.NUM: isinstance(value, int | float) and not isinstance(value, bool),
        schema.STR_LIST: isinstance(value, list) and all(isinstance(v, str) for v in value),
        schema.ANY_LIST: isinstance(value, list) and all(isinstance(v, int | float | str) for v in value),
        schema.OP_LIST: _is_op_list(value),
        schema.STR_TABLE: isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
    }[kind]
    if not ok:
        raise _fail(path, key, "an " + kind if kind == schema.INT else "a " + kind, value)
    _check_enum(path, key, value)
    if kind == schema.OP_LIST:
        ops = [value] if isinstance(value, str) else list(value)
        for op in ops:
            if op not in _ONNX_OPS and op != "*":
                raise _fail(path, key, "ONNX op types (e.g. 'Conv')", op)
    if key == "dtypes.npu":
        for d in value:
            if d not in schema.DTYPES:
                raise _fail(path, key, f"dtype names ({', '.join(schema.DTYPES)})", d)


def _is_op_list(value: object) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_enum(path: Path, key: str, value: object) -> None:
    generic = key.split("]", 1)[-1].lstrip(".")
    enum_key = f"limit.{generic}" if key.startswith("limit[") else key
    options = schema.ENUMS.get(enum_key)
    if options is not None and value not in options:
        raise _fail(path, key, f"one of {', '.join(options)}", value)


# --- building ---------------------------------------------------------------------------------


def _sourced(table: Mapping[str, Any]) -> Sourced:
    return Sourced(str(table.get("source", "")), bool(table.get("unverified", False)))


def _ops(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    return frozenset([value] if isinstance(value, str) else value)


def _limit(table: Mapping[str, Any], default_violation: str) -> Limit:
    allowed = table.get("allowed")
    return Limit(
        ops=_ops(table["op"]),
        attribute=table["attribute"],
        min=table.get("min"),
        max=table.get("max"),
        allowed=tuple(allowed) if allowed is not None else None,
        when=table.get("when", "any"),
        on_violation=table.get("on_violation", default_violation),
        origin=_sourced(table),
        note=table.get("note", ""),
    )


def _build(path: Path, d: Mapping[str, Any]) -> Profile:
    meta, q, opset = d.get("meta", {}), d.get("quantization", {}), d.get("opset", {})
    ops, fusion, dt, tensor = d.get("ops", {}), d.get("fusion", {}), d.get("dtypes", {}), d.get("tensor", {})
    on_violation = ops.get("on_violation", "cpu")
    return Profile(
        name=meta["name"],
        path=path,
        vendor=meta.get("vendor", ""),
        description=meta.get("description", ""),
        documents=tuple(meta.get("documents", ())),
        note=meta.get("note", ""),
        activations=q.get("activations", "int8"),
        weights=q.get("weights", "int8"),
        per_channel_weights=q.get("per_channel_weights", True),
        weight_zero_point=q.get("weight_zero_point", False),
        power_of_two_scales=q.get("power_of_two_scales", False),
        fallback_precision=q.get("fallback_precision", "float"),
        quantization=_sourced(q),
        opset_min=opset.get("min"),
        opset_max=opset.get("max"),
        opset=_sourced(opset),
        npu_ops=_INFERENCE_OPS if ops.get("npu") == "*" else _ops(ops.get("npu")),
        cpu_ops=_ops(ops.get("cpu")),
        folded_ops=_ops(ops.get("folded")),
        unsupported=ops.get("unsupported", "reject"),
        on_violation=on_violation,
        ops=_sourced(ops),
        fused_activations=_ops(fusion.get("activations")),
        fusion_patterns=tuple(fusion.get("patterns", ())),
        fusion=_sourced(fusion),
        npu_dtypes=frozenset(dt.get("npu", schema.DTYPES)),
        dtypes=_sourced(dt),
        max_rank=tensor.get("max_rank"),
        max_dim=tensor.get("max_dim"),
        max_batch=tensor.get("max_batch"),
        max_elements=tensor.get("max_elements"),
        static_shapes=tensor.get("static_shapes", True),
        tensor=_sourced(tensor),
        limits=tuple(_limit(t, on_violation) for t in d.get("limit", [])),
        recipe=q.get("recipe", "kernels"),
        float16_ops=_ops(d.get("float16", {}).get("ops")),
        float16=_sourced(d.get("float16", {})),
        consumer_range_ops=_ops(d.get("consumer_range", {}).get("ops")),
        consumer_range=_sourced(d.get("consumer_range", {})),
        output_grid_ops=_ops(d.get("output_grid", {}).get("ops")),
        output_grid=_sourced(d.get("output_grid", {})),
        requantize_ops=_ops(d.get("requantize", {}).get("ops")),
        requantize=_sourced(d.get("requantize", {})),
        input_follows_readers=bool(d.get("input", {}).get("follows_readers", False)),
        input_rounding=_sourced(d.get("input", {})),
        depthwise_hardswish_point=bool(d.get("kernel_points", {}).get("depthwise_hardswish", False)),
        kernel_points=_sourced(d.get("kernel_points", {})),
        schemes=d.get("schemes"),
        cost=d.get("cost"),
    )
