"""The scan's samples: calibration and evaluation sets loaded against the model's inputs, the input dims
fixed from the data and the user's settings, and the recurrent state fed through `--state`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.recurrent import check_state, state_consts, with_state
from quantscan.errors import CalibrationError, UsageError
from quantscan.model import LoadedModel
from quantscan.runner import Runner
from quantscan.scanning.options import ScanOptions
from quantscan.specs import Dim, InputSpec


def dims_from_data(
    model: LoadedModel, calib: CalibSet, overrides: Mapping[str, Sequence[int]], consts: Mapping[str, float]
) -> tuple[dict[str, tuple[Dim, ...]], int | None]:
    """Concrete input dims from the data (or --input-shape); a free batch dim stays symbolic.

    Returns the dims and the fixed batch size (None when the batch dim is free).
    """
    shapes = calib.sample_shapes()
    dims: dict[str, tuple[Dim, ...]] = {}
    fixed_batch: int | None = None
    for spec in model.inputs:
        if spec.name in overrides:
            dims[spec.name] = tuple(int(v) for v in overrides[spec.name])
            if spec.name not in consts and fixed_batch is None and dims[spec.name]:
                fixed_batch = int(dims[spec.name][0])  # type: ignore[arg-type]
            continue
        data = shapes.get(spec.name)
        if data is None:
            continue
        if len(data) != len(spec.shape):
            raise CalibrationError(
                f"input '{spec.name}': expected rank {len(spec.shape)} {list(spec.shape)}, "
                f"found data of shape {list(data)}"
            )
        new: list[Dim] = []
        for axis, (declared, found) in enumerate(zip(spec.shape, data, strict=True)):
            if axis == 0 and not isinstance(declared, int):
                new.append(declared if isinstance(declared, str) and declared else "N")
                continue
            if isinstance(declared, int) and declared > 0 and declared != found and axis != 0:
                raise CalibrationError(
                    f"input '{spec.name}': expected dim {axis} = {declared}, found {found} in the calibration data"
                )
            new.append(int(found) if not (axis == 0 and isinstance(declared, int)) else declared)
        if spec.shape and isinstance(spec.shape[0], int) and spec.name not in consts and fixed_batch is None:
            fixed_batch = int(spec.shape[0])
        if not spec.shape and spec.name not in consts and fixed_batch is None:
            fixed_batch = 1  # a rank-0 input fed per sample (`sr.npy`) has no axis to stack samples on
        dims[spec.name] = tuple(new)
    return dims, fixed_batch


def apply_dim_settings(
    model: LoadedModel, dims: dict[str, tuple[Dim, ...]], fixed_batch: int | None, settings: Sequence[str]
) -> tuple[dict[str, tuple[Dim, ...]], int | None]:
    """Apply `--input-shape INPUT:AXIS=V / DIMPARAM=V / batch=V` on top of the dims the data gave.

    Axis 0 settings fix the batch (samples are grouped by V); other axes must agree with the data.
    """
    from quantscan.rewrites.fix_dim import parse_dim_spec

    declared = {s.name: s.shape for s in model.inputs}
    for text in settings:
        setting = parse_dim_spec(text)
        hits = []
        for name, shape in declared.items():
            for axis, dim in enumerate(shape):
                if (setting.batch and axis == 0 and not isinstance(dim, int)) or (
                    setting.input == name and setting.axis == axis) or (setting.param and dim == setting.param):
                    hits.append((name, axis))
        if not hits:
            raise UsageError(
                f"--input-shape {text}: expected a dim of an input ({', '.join(declared)}) to match, found none"
            )
        for name, axis in hits:
            current = list(dims.get(name, declared[name]))
            if axis == 0:
                fixed_batch = setting.value
            elif isinstance(current[axis], int) and current[axis] != setting.value:
                raise CalibrationError(
                    f"--input-shape {text}: expected the data's dim {axis} of '{name}' to be {setting.value}, "
                    f"found {current[axis]}"
                )
            current[axis] = setting.value
            dims[name] = tuple(current)
    return dims, fixed_batch


def stateful_sets(
    loaded: LoadedModel, cset: CalibSet, eval_set: CalibSet, pairs: Mapping[str, str], runner: Runner
) -> tuple[CalibSet, CalibSet]:
    """Both sample sets with the recurrent state carried by the FP32 model (`--state`, calib.recurrent)."""
    check_state(pairs, loaded.inputs, [o.name for o in loaded.proto.graph.output])
    session = runner.session(loaded.proto)

    def step(sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return session.run(sample, list(pairs))

    stateful = with_state(cset, pairs, step)
    return stateful, stateful if eval_set is cset else with_state(eval_set, pairs, step)


def given_input_specs(
    inputs: Sequence[InputSpec], input_shape: Mapping[str, Sequence[int]], input_dims: Sequence[str]
) -> list[InputSpec]:
    """The declared inputs with the sizes `--input-shape` gives (whole shapes, and `INPUT:AXIS=V` /
    `DIMPARAM=V` on axes other than the batch).

    Why: a `--const` input has no data to take its sizes from; without this, the error that asks for
    `--input-shape state:1=N` came back unchanged when the user gave exactly that.
    """
    from quantscan.rewrites.fix_dim import parse_dim_spec

    settings = [parse_dim_spec(text) for text in input_dims]
    out = []
    for spec in inputs:
        if spec.name in input_shape:
            out.append(replace(spec, shape=tuple(int(v) for v in input_shape[spec.name])))
            continue
        shape = list(spec.shape)
        for axis, dim in enumerate(shape):
            for st in settings:
                if axis > 0 and ((st.input == spec.name and st.axis == axis) or (st.param and dim == st.param)):
                    shape[axis] = st.value
        out.append(replace(spec, shape=tuple(shape)))
    return out


def sample_sets(loaded: LoadedModel, calib: str | Path | CalibSet, opts: ScanOptions) -> tuple[CalibSet, CalibSet]:
    """The calibration set and the evaluation set (`--eval`, else the same object)."""
    consts = state_consts(opts.state, opts.const, calib)
    specs = given_input_specs(loaded.inputs, opts.input_shape, opts.input_dims)
    cset = calib if isinstance(calib, CalibSet) else load_calibration(
        calib, specs, preprocess=opts.preprocess, overrides=opts.preprocess_overrides,
        consts=consts, limit=opts.limit,
    )
    if opts.eval is None:
        return cset, cset
    eval_set = load_calibration(
        opts.eval, specs, preprocess=opts.preprocess, overrides=opts.preprocess_overrides,
        consts=state_consts(opts.state, opts.const, opts.eval), limit=opts.limit,
    )
    return cset, eval_set


def check_eval_shapes(eval_set: CalibSet, cset: CalibSet, dims: Mapping[str, tuple[Dim, ...]]) -> None:
    """An `--eval` set must feed the sizes the calibration set fixed: its samples run through the same
    analysis graph. A mismatch is bad input, said before any pass (it used to surface as onnxruntime
    refusing a graph quantscan built: exit 3)."""
    if eval_set is cset:
        return
    shapes = eval_set.sample_shapes()
    for name, fixed in dims.items():
        found = shapes.get(name)
        if found is None or len(found) != len(fixed):
            continue
        if any(isinstance(d, int) and d != f for d, f in zip(fixed[1:], found[1:], strict=True)):
            raise CalibrationError(
                f"--eval {eval_set.source}: expected samples whose '{name}' is {list(fixed)} (the sizes the "
                f"calibration set fixes), found {list(found)}"
            )
