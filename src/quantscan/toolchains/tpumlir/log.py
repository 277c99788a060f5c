"""Sophgo tpu-mlir console output (model_transform, run_calibration, model_deploy, npz_tool compare).

What tpu-mlir prints (fixtures in tests/fixtures/vendorlog/tpu-mlir, published excerpts):
- three steps, each its own script: `model_transform` (ONNX to the float "top" MLIR), `run_calibration`
  (the calibration table, with its tuning runs `-o X.INT8.tune.mlir`) and `model_deploy` (lowering
  with `tpuc-opt --convert-top-to-tpu`, the bmodel/cvimodel); each shells out with `[Running]: cmd`
  / `[Success]: cmd` / `[CMD]: cmd` lines;
- a failure is a Python traceback ending in `XxxError: message` (the converter's
  `KeyError: 'operand NAME not found'`, `Op not support:{'Cos', 'Sin'}`), or tpuc-opt aborting
  (`UNREACHABLE executed at ...` after a one-line reason, or `Assertion ... failed.`), or the correctness check
  failing (`npz compare FAILED.`);
- the correctness check `npz_tool.py compare TARGET REFERENCE -vv` prints one row per tensor,
  `[name] VERDICT [PASSED|FAILED]` followed by `cosine_similarity = c`, `euclidean_similarity = e`,
  `sqnr_similarity = s` (SIMILAR/NOT_SIMLIAR rows; EQUAL/CLOSE rows print no figures), then
  `min_similiarity = (c, e, s)` (the tool's spelling). A name is the ONNX output tensor followed by
  `_<OpType>` (`/text_model/Flatten_output_0_Flatten`, `1197_MatMul`).

The comparison runs the whole quantized model against the float one, so its cosines are accumulated
(`entire`), like quantscan's cumulative column.
"""

from __future__ import annotations

import re

from quantscan.toolchains.parsed import Failure, LayerSimilarity, ParsedLog, Stage, file_lines, parse_float
from quantscan.toolchains.tpumlir.kit import DTYPE, OP_TYPE

TOOL = "tpu-mlir"

STEP_STAGES = {"model_transform": Stage.LOAD, "run_calibration": Stage.QUANTIZE, "model_deploy": Stage.COMPILE}
"""Each tpu-mlir script on the shared stages; the script's name stays in `Failure.step`."""

_STEP_ORDER = tuple(STEP_STAGES)
_MARKERS = ("TPU-MLIR", "tpu_mlir", "tpu-mlir", "model_transform", "model_deploy", "run_calibration",
            "tpuc-opt", "npz_tool.py", "npz compare", "min_similiarity", "Op not support")
# Words of a line that say which script printed it, most specific first (a tuning run of
# run_calibration also imports the calibration table and lowers to tpu, like model_deploy). tpuc-opt
# pass names are matched without their leading dashes, so no string here reads as one of our flags.
_STEP_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run_calibration", ("run_calibration", ".tune.mlir", "tune op:")),
    ("model_deploy", ("model_deploy", "convert-top-to-tpu", "_tpu.mlir", "_tpu_outputs.npz", ".bmodel",
                      ".cvimodel", "processor-assign", "_final.mlir")),
    ("model_transform", ("model_transform", "_origin.mlir", "shape-infer", "Mlir file generated",
                         "OnnxConverter", "onnxsim", "Onnxsim")),
)
_TRACEBACK_SCRIPT = re.compile(r'File "[^"]*\b(?P<step>model_transform|run_calibration|model_deploy)\.py"')
_VERSION = re.compile(r"TPU-MLIR v?(?P<version>\S+)")
_CHIP = re.compile(r"(?:chip|processor)[= ]+(?P<chip>(?:bm|cv|sg|mars)\w+)")
_ROW = re.compile(r"^\[(?P<name>[^\]]+?)\s*\]\s+(?P<verdict>[A-Z_]+)\s+\[(?P<result>PASSED|FAILED)\]")
_FIGURE = re.compile(r"^\s+(?P<key>cosine|euclidean|sqnr)_similarity\s*=\s*(?P<value>\S+)")
_MIN_SIMILARITY = re.compile(r"^min_similiarity = \((?P<values>[^)]*)\)")
_EXCEPTION = re.compile(r"^(?P<kind>[A-Za-z_.]*(?:Error|Exception)): (?P<message>.*)$")
_NOT_SUPPORTED = re.compile(r"Op not support:?\s*\{(?P<ops>[^}]*)\}")
_OPERAND = re.compile(r"operand (?P<name>\S+) not found")
_CONVERTER_ENTRY = re.compile(r'^\s+"(?P<op>\w+)": lambda node')
_CRASH = re.compile(r"UNREACHABLE executed at (?P<where>\S+?)!?$|^Stack dump:|Segmentation fault|core dumped")
_PROGRESS = re.compile(r"^compare (?P<name>\S+?):\s+100%\|.*\|\s*(?P<done>\d+)/(?P<total>\d+)\b")
_ASSERTION = re.compile(r"^tpuc-opt: (?P<file>[^:]+:\d+): (?P<function>.*?): Assertion (?P<condition>.*) failed\.$")
_TOP_CLASS = re.compile(r"::(?:top|tpu)::(?P<op>\w+?)Op::")
_DUMPED_OP = re.compile(r'"(?:top|tpu)\.(?P<op>\w+)".*\bloc\("(?P<loc>[^"]+)"\)')
_DTYPE_SUFFIX = re.compile(f"{DTYPE.pattern}$")
_OP_SUFFIX = re.compile(f"_(?P<op>{OP_TYPE.pattern.removeprefix('_')})$")


def looks_like_tpu_mlir(text: str) -> bool:
    """True when the text carries a marker only tpu-mlir prints (its scripts, tpuc-opt, npz_tool)."""
    return any(marker in text for marker in _MARKERS)


def parse_tpu_mlir(text: str) -> ParsedLog:
    """The whole console output (or a published excerpt of it) as a `ParsedLog`."""
    lines = file_lines(text)
    similarity = _compare_rows(lines)
    failure = _failure(lines, similarity)
    unsupported = _unsupported_ops(text)
    chip = _CHIP.search(text)
    version = _VERSION.search(text)
    return ParsedLog(
        tool=TOOL,
        version=version.group("version") if version else "",
        target=chip.group("chip") if chip else "",
        stage_reached=_stage_reached(lines, failure),
        failure=failure,
        similarity=similarity,
        unsupported_ops=unsupported,
        notes=[f"min_similiarity (cosine, euclidean, sqnr) = ({m.group('values')})"
               for line in lines if (m := _MIN_SIMILARITY.match(line))],
    )


def log_version(text: str) -> str:
    """The tpu-mlir version its scripts print (`TPU-MLIR v1.30.2-...`), "" when none does."""
    found = _VERSION.search(text)
    return found.group("version") if found else ""


def op_of(name: str) -> str:
    """The op type tpu-mlir appends to a tensor's name (`1197_MatMul` is a MatMul); "" when none."""
    match = _OP_SUFFIX.search(_DTYPE_SUFFIX.sub("", name))
    return match.group("op") if match else ""


def step_of(line: str) -> str:
    """The tpu-mlir script a line belongs to, by the words only that script prints; "" when none."""
    script = _TRACEBACK_SCRIPT.search(line)
    if script:
        return script.group("step")
    return next((step for step, words in _STEP_WORDS if any(w in line for w in words)), "")


def _compare_rows(lines: list[str]) -> list[LayerSimilarity]:
    """Every `[name] VERDICT [PASSED|FAILED]` row with the figures printed under it."""
    rows: list[LayerSimilarity] = []
    for number, line in enumerate(lines, start=1):
        match = _ROW.match(line)
        if match is None:
            continue
        figures = _figures(lines[number:])
        name = match.group("name").strip()
        rows.append(LayerSimilarity(layer=name, vendor_op=op_of(name), entire_cosine=figures.get("cosine"),
                                    entire_euclidean=figures.get("euclidean"), line=number,
                                    passed=match.group("result") == "PASSED"))
    return rows


def _figures(following: list[str]) -> dict[str, float | None]:
    """The `x_similarity = v` lines under a row, up to the next row."""
    figures: dict[str, float | None] = {}
    for line in following:
        if _ROW.match(line) or not line.startswith(" "):
            break
        figure = _FIGURE.match(line)
        if figure:
            figures[figure.group("key")] = parse_float(figure.group("value"))
    return figures


def _failure(lines: list[str], similarity: list[LayerSimilarity]) -> Failure | None:
    """The first thing in the log that stopped the run: a failed comparison, a traceback, a crash."""
    candidates = [f for f in (_compare_failure(lines, similarity), _traceback_failure(lines),
                              _crash_failure(lines), _not_supported_failure(lines)) if f is not None]
    return min(candidates, key=lambda f: f.line) if candidates else None


def _failure_at(lines: list[str], line: int, message: str, layer: str = "", vendor_op: str = "",
                step: str = "") -> Failure:
    """A Failure in the script the line belongs to (compile when no line says which: the last step)."""
    step = step or _step_near(lines, line)
    stage = STEP_STAGES.get(step, Stage.COMPILE)
    return Failure(stage=stage, message=message, layer=layer, vendor_op=vendor_op, line=line, step=step)


def _step_near(lines: list[str], line: int) -> str:
    """The script the failing line belongs to: the nearest step word before it, else after it."""
    before = (step_of(text) for text in reversed(lines[:line]))
    after = (step_of(text) for text in lines[line:])
    return next((s for s in before if s), "") or next((s for s in after if s), "")


def _compare_failure(lines: list[str], similarity: list[LayerSimilarity]) -> Failure | None:
    failed = [row for row in similarity if row.passed is False]
    summary = next((n for n, line in enumerate(lines, start=1) if line.startswith("npz compare FAILED")), 0)
    if not failed and not summary:
        return None
    minimum = next((m.group("values") for line in lines if (m := _MIN_SIMILARITY.match(line))), "")
    first = failed[0] if failed else None
    worst = f" at {first.layer} (cosine {first.entire_cosine:g})" if first and first.entire_cosine is not None \
        else (f" at {first.layer}" if first else "")
    message = f"npz compare FAILED{worst}" + (f"; min similarity (cosine, euclidean, sqnr) = ({minimum})"
                                             if minimum else "")
    line = first.line if first else summary
    step = "model_deploy" if _compares_lowered(lines) else ""
    layer = first.layer if first else _only_tensor_compared(lines)
    return _failure_at(lines, line, message, layer, op_of(layer), step)


def _only_tensor_compared(lines: list[str]) -> str:
    """Without -vv rows, the progress bar still names the tensors; when it compared one, that one failed."""
    bars = [m for line in lines if (m := _PROGRESS.match(line))]
    return bars[-1].group("name") if bars and bars[-1].group("total") == "1" else ""


def _compares_lowered(lines: list[str]) -> bool:
    """model_deploy's check compares the lowered model (`*_tpu_outputs.npz`) or the bmodel it wrote."""
    targets = [line for line in lines if line.startswith(("Target ", "[CMD]: model_runner.py"))]
    return any(word in line for line in targets for word in ("_tpu_outputs", ".bmodel", ".cvimodel"))


def _traceback_failure(lines: list[str]) -> Failure | None:
    # A progress bar without a newline can run into it: "... 2.83it/s]Traceback (most recent call last):".
    start = next((n for n, line in enumerate(lines) if "Traceback (most recent call last)" in line), None)
    if start is None:
        return None
    step, vendor_op = "", ""
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        script = _TRACEBACK_SCRIPT.search(line)
        step = step or (script.group("step") if script else "")
        entry = _CONVERTER_ENTRY.match(line)
        vendor_op = entry.group("op") if entry else vendor_op
        error = _EXCEPTION.match(line)
        if error is None:
            continue
        message = line.strip()
        operand = _OPERAND.search(message)
        return _failure_at(lines, number, message, operand.group("name") if operand else "", vendor_op, step)
    return None


def _crash_failure(lines: list[str]) -> Failure | None:
    """tpuc-opt aborting: an assertion names its op class; `UNREACHABLE executed at` follows a one-line
    reason, and a shape-inference abort prints the op it was inferring with its `loc("name")` first."""
    for number, line in enumerate(lines, start=1):
        assertion = _ASSERTION.match(line)
        if assertion:
            op = _TOP_CLASS.search(assertion.group("function"))
            message = (f"Assertion {assertion.group('condition')} failed in {assertion.group('function')} "
                       f"({assertion.group('file').rsplit('/', 1)[-1]})")
            return _failure_at(lines, number, message, vendor_op=op.group("op") if op else "")
        crash = _CRASH.search(line)
        if crash is None:
            continue
        where = crash.group("where") or ""
        if not where or number < 2:
            return _failure_at(lines, number, line.strip())
        reason = lines[number - 2].strip()
        dumped = _DUMPED_OP.search(lines[number - 3]) if number >= 3 else None
        return _failure_at(lines, number - 1, f"{reason} (tpuc-opt aborted at {where.rsplit('/', 1)[-1]})",
                           layer=dumped.group("loc") if dumped else "", vendor_op=dumped.group("op") if dumped else "")
    return None


def _not_supported_failure(lines: list[str]) -> Failure | None:
    for number, line in enumerate(lines, start=1):
        match = _NOT_SUPPORTED.search(line)
        if match:
            ops = ", ".join(_op_names(match.group("ops")))
            return _failure_at(lines, number, f"Op not support: {ops}", vendor_op=ops, step="model_transform")
    return None


def _unsupported_ops(text: str) -> list[str]:
    names = [op for match in _NOT_SUPPORTED.finditer(text) for op in _op_names(match.group("ops"))]
    return list(dict.fromkeys(names))


def _op_names(listed: str) -> list[str]:
    """`'Cos', 'Sin'` as ["Cos", "Sin"] (the converter prints a Python set)."""
    return [name.strip().strip("'\"") for name in listed.split(",") if name.strip().strip("'\"")]


def _stage_reached(lines: list[str], failure: Failure | None) -> Stage | None:
    """The stage of the last script the log shows finishing: one that ran before the failing one, or
    model_transform once its MLIR file is written, or model_deploy once it reports the bmodel."""
    steps = [s for s in (step_of(line) for line in lines) if s]
    if failure is not None:
        earlier = [s for s in steps if failure.step and _STEP_ORDER.index(s) < _STEP_ORDER.index(failure.step)] \
            if failure.step else []
        if earlier:
            return STEP_STAGES[max(earlier, key=_STEP_ORDER.index)]
        return Stage.LOAD if failure.step in ("run_calibration", "model_deploy") else None
    if any(line.startswith("[Success]") and (".bmodel" in line or ".cvimodel" in line) for line in lines):
        return Stage.COMPILE
    if steps:
        return STEP_STAGES[max(steps, key=_STEP_ORDER.index)]
    return None
