"""RKNN-Toolkit2 (2.x) console logs: failing API call, the compiler's layer table, accuracy_analysis.

What the toolkit prints (verbose=True; recorded with 2.5.0 in tests/fixtures/vendorlog/rknn-2.5.0):
- `E build: The input 0 of NonZero('result') need to be constant! ...`: the API call that failed
  (load_onnx, build, export_rknn, accuracy_analysis) and the node, as `Op('name')`;
- the compiler's "Network Layer Information Table" (`D RKNN: [time] ID OpType DataType Target ...
  FullName`), where `Target` is NPU or CPU and `DataType` FLOAT16 marks a layer kept in float;
- accuracy_analysis' `simulator_error` table: `[OpType] tensor  entire cos | euc  single cos | euc`,
  named by output tensor; rows of layers fused into the next one print no figures.

`parse_accuracy_analysis` is a pure function of the table text (the console or the snapshot's
error_analysis.txt), for callers that only need the per-layer cosines (the vendor backend).
"""

from __future__ import annotations

import re

from quantscan.toolchains.parsed import (
    Failure,
    LayerSimilarity,
    ParsedLog,
    Stage,
    VendorLayer,
    WeightOutlier,
    parse_float,
    strip_ansi,
)

TOOL = "rknn-toolkit2"

_VERSION = re.compile(r"rknn-toolkit2 version: (\S+)")
_API_ERROR = re.compile(r"^E (?P<api>[a-z_0-9]+): (?P<msg>.*)$")
_NAMED_NODE = re.compile(r"\b(?P<op>[A-Z][A-Za-z0-9]*)\('(?P<name>[^']+)'\)")
_COMPILER_PREFIX = re.compile(r"^[DIWE] RKNN: \[[^\]]*\] ?")
_SIM_ROW = re.compile(r"^\[(?P<op>[^\]]+)\]\s+(?P<name>\S+)(?P<rest>.*)$")
_NUMBER = r"(-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf)"
_PAIR = re.compile(_NUMBER + r"\s*\|\s*" + _NUMBER)
_BAR_END = re.compile(r"(?<=it/s\])(?=[DIWE] [a-z_0-9]+: )")
_OUTLIER_ROW = re.compile(r"^\s+(?P<name>\S+)\s+(?P<mean>[-\d.]+)\s+(?P<std>[-\d.]+)\s+(?P<values>[-\d., ]+?)\s*$")
_HYBRID = re.compile(r"Meet hybrid type, dtype: (?P<dtype>\w+), tensor: (?P<tensor>\S+)")
_IO_OPERATORS = frozenset({"InputOperator", "OutputOperator"})

_API_STAGE = {
    "config": Stage.LOAD,
    "build": Stage.BUILD,
    "hybrid_quantization_step1": Stage.QUANTIZE,
    "hybrid_quantization_step2": Stage.QUANTIZE,
    "export_rknn": Stage.EXPORT,
    "accuracy_analysis": Stage.ANALYSIS,
    "init_runtime": Stage.ANALYSIS,
    "inference": Stage.ANALYSIS,
}

# Lines that show a stage finished, in the order a build runs them.
_PROGRESS: tuple[tuple[str, Stage], ...] = (
    ("D base_optimize done", Stage.LOAD),
    ("I Quantize calibration include", Stage.LOAD),
    ("I rknn building ...", Stage.QUANTIZE),
    ("I rknn building done", Stage.COMPILE),
    ("The error analysis results save to", Stage.ANALYSIS),
)


def looks_like_rknn(text: str) -> bool:
    """True when the text carries a marker only RKNN-Toolkit2 prints."""
    markers = ("rknn-toolkit2 version", "D RKNN: [", "I RKNN: [", "Network Layer Information Table",
               "simulator_error", "rknn.api.")
    return any(m in text for m in markers)


def parse_rknn(text: str) -> ParsedLog:
    """The whole console log (or a part of it) as a `ParsedLog`."""
    numbers, lines = _segments(text)
    version = _VERSION.search("\n".join(lines[:50]) if lines else "")
    failure = _first_failure(numbers, lines)
    stop = numbers.index(failure.line) if failure is not None else len(lines)
    return ParsedLog(
        tool=TOOL,
        version=version.group(1) if version else "",
        stage_reached=_stage_reached(lines[:stop]),
        failure=failure,
        layers=_layer_table(numbers, lines),
        similarity=parse_accuracy_analysis(text),
        float_tensors=[m.group("tensor") for line in lines if (m := _HYBRID.search(line))],
        weight_outliers=_weight_outliers(numbers, lines),
    )


def _segments(text: str) -> tuple[list[int], list[str]]:
    """The log's messages with the file line each starts on.

    A progress bar redraws itself with carriage returns and the next message follows its last
    redraw on the same line (`... 0/72 [00:00<?, ?it/s]E build: The input ...`): both split it.
    """
    numbers: list[int] = []
    segments: list[str] = []
    for number, line in enumerate(strip_ansi(text).split("\n"), start=1):
        for part in _BAR_END.split(line):
            for piece in part.split("\r"):
                numbers.append(number)
                segments.append(piece)
    return numbers, segments


def parse_accuracy_analysis(text: str) -> list[LayerSimilarity]:
    """accuracy_analysis' per-layer rows: entire/single cosine and Euclidean distance, in log order.

    A row with no figures (a layer RKNN fused into the next one) keeps None; a third and fourth
    figure pair (the on-device runtime_error columns when a target was given) is ignored.
    """
    numbers, lines = _segments(text)
    rows: list[LayerSimilarity] = []
    in_table = False
    for number, line in zip(numbers, lines, strict=True):
        stripped = line.strip()
        if stripped.startswith("layer_name") and "error" in stripped:
            in_table, rows = True, []
            continue
        if not in_table:
            continue
        match = _SIM_ROW.match(stripped)
        if match is None:
            if rows and stripped and not set(stripped) <= {"-", "="}:
                in_table = False
            continue
        pairs = _PAIR.findall(match.group("rest"))
        entire = pairs[0] if pairs else (None, None)
        single = pairs[1] if len(pairs) > 1 else (None, None)
        rows.append(LayerSimilarity(
            layer=match.group("name"),
            vendor_op=match.group("op"),
            entire_cosine=_num(entire[0]),
            entire_euclidean=_num(entire[1]),
            single_cosine=_num(single[0]),
            single_euclidean=_num(single[1]),
            line=number,
        ))
    return rows


def _num(text: str | None) -> float | None:
    return None if text is None else parse_float(text)


def _first_failure(numbers: list[int], lines: list[str]) -> Failure | None:
    """The first `E <api>: <message>` line (tracebacks and the version echo are not the message)."""
    for index, line in enumerate(lines):
        match = _API_ERROR.match(line)
        if match is None or match.group("msg").startswith("Traceback"):
            continue
        message = " ".join([match.group("msg").strip(), *_continuation(lines, index + 1)])
        node = _NAMED_NODE.search(message)
        return Failure(
            stage=_failure_stage(match.group("api"), lines[:index]),
            message=message,
            layer=node.group("name") if node else "",
            vendor_op=node.group("op") if node else "",
            line=numbers[index],
        )
    return None


def _continuation(lines: list[str], start: int) -> list[str]:
    """The indented lines RKNN prints under an error message (its second sentence, its advice)."""
    more: list[str] = []
    for line in lines[start:]:
        if not line.startswith(" ") or not line.strip() or line.lstrip().startswith("File "):
            break
        more.append(line.strip())
    return more


def _failure_stage(api: str, before: list[str]) -> Stage:
    """Which stage the failing call was in: `build` covers quantization and compilation too."""
    if api.startswith("load"):
        return Stage.LOAD
    stage = _API_STAGE.get(api, Stage.BUILD)
    if stage is Stage.BUILD:
        reached = _stage_reached(before)
        if reached is Stage.QUANTIZE:
            return Stage.COMPILE
        if any("Quantizating" in line or "I Quantize calibration" in line for line in before):
            return Stage.QUANTIZE
    return stage


def _stage_reached(lines: list[str]) -> Stage | None:
    """The furthest stage these lines show as finished."""
    reached: Stage | None = None
    order = list(Stage)
    for line in lines:
        for marker, stage in _PROGRESS:
            if marker in line and (reached is None or order.index(stage) > order.index(reached)):
                reached = stage
    return reached


def _weight_outliers(numbers: list[int], lines: list[str]) -> list[WeightOutlier]:
    """The `W build: found outlier value` table: const name, abs_mean, abs_std, outlier value(s)."""
    rows: list[WeightOutlier] = []
    in_table = False
    for number, line in zip(numbers, lines, strict=True):
        if "found outlier value" in line:
            in_table = True
            continue
        if not in_table or line.strip().startswith("const name"):
            continue
        match = _OUTLIER_ROW.match(line)
        if match is None:
            in_table = False
            continue
        values = tuple(v for v in (parse_float(t) for t in match.group("values").split(",")) if v is not None)
        rows.append(WeightOutlier(tensor=match.group("name"), abs_mean=parse_float(match.group("mean")),
                                  abs_std=parse_float(match.group("std")), values=values, line=number))
    return rows


def _layer_table(numbers: list[int], lines: list[str]) -> list[VendorLayer]:
    """The rows of the last "Network Layer Information Table" the compiler printed."""
    layers: list[VendorLayer] = []
    in_table = False
    for number, raw in zip(numbers, lines, strict=True):
        line = _COMPILER_PREFIX.sub("", raw).strip()
        if "Network Layer Information Table" in line:
            in_table, layers = True, []
            continue
        if not in_table or not line or set(line) <= {"-"} or line.startswith("ID "):
            continue
        tokens = line.split()
        if len(tokens) < 5 or not tokens[0].isdigit() or tokens[3].lower() not in ("npu", "cpu"):
            in_table = False  # a row whose Target is neither NPU nor CPU is not a row of this table
            continue
        vendor_op, _, name = tokens[-1].partition(":")
        layers.append(VendorLayer(
            layer=name or vendor_op,
            vendor_op=tokens[1],
            target=tokens[3].lower(),
            dtype=tokens[2].lower(),
            io_operator=tokens[1] in _IO_OPERATORS,
            line=number,
        ))
    return layers
