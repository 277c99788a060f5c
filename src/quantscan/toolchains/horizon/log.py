"""Horizon / D-Robotics `hb_mapper` logs (checker and makertbin; X3 bernoulli2, J5/X5 bayes OpenExplorer).

What hb_mapper prints (fixtures in tests/fixtures/vendorlog/hb_mapper-*, from published logs):
- phases as `Start to <phase>.` / `End to <phase>.` (parse/prepare, optimize, calibrate, quantize,
  compile the model with march X): the last phase started and not ended is where a run stopped;
- `ERROR ...` lines (the older `<time> ERROR <message>` format), or a crash ("core dump") after a
  `Start to` line, and "Layer `name` will be executed on CPU" notices (as the D-Robotics FAQ
  documents them);
- "The converted model node information:" a fixed-width table `Node ON Subgraph Type [Cosine
  Similarity Threshold] [In/Out DataType]`, where ON is BPU or CPU, Subgraph `id(N)` the BPU
  subgraph (`--` on the CPU), and long node names are cut from the left with `...`;
- "The quantify model output:" the cosine of each graph output.
"""

from __future__ import annotations

import re

from quantscan.toolchains.parsed import (
    Failure,
    LayerSimilarity,
    ParsedLog,
    Stage,
    VendorLayer,
    file_lines,
    parse_float,
)

TOOL = "hb_mapper"

_PHASE = re.compile(r"\b(?P<edge>Start|End) to (?P<phase>[^.\n]+)")
_ERROR = re.compile(r"\bERROR\b:?\s*(?P<msg>.*)$")
_NODE_IN_MESSAGE = re.compile(r"`(?P<name>[^`]+)`|nodes?:\s*\[?'(?P<listed>[^']+)'")
_OP_IN_MESSAGE = re.compile(r"cpu operators: (?P<op>\S+)", re.I)
# Words of a message that say which stage it belongs to, when no "Start to" line says so.
_MESSAGE_STAGE: tuple[tuple[str, Stage], ...] = (
    ("hbdk-cc", Stage.COMPILE), ("compile", Stage.COMPILE), ("calibrat", Stage.QUANTIZE),
    ("quantif", Stage.QUANTIZE), ("error in pass", Stage.BUILD), ("opset", Stage.LOAD),
    ("shape of model input", Stage.LOAD), ("parse", Stage.LOAD),
)
_VERSIONS = (re.compile(r"hb_mapper version (\S+)"), re.compile(r"HorizonNN version:? (\S+)"),
             re.compile(r"horizon_nn version:? (\S+)"))
_MARCH = re.compile(r"(?:with march|-{2}march|march:)\s*'?(?P<march>[\w-]+)")  # -{2}: hb_mapper's flag
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d ")
_SUBGRAPH = re.compile(r"id\((\d+)\)")
_CPU_NOTICE = re.compile(r"Layer `(?P<name>[^`]+)` will be executed on CPU")
_CRASH = re.compile(r"core dump|Segmentation fault", re.I)
_COLUMNS = ("Node", "ON", "Subgraph", "Type", "Cosine Similarity", "Threshold", "In/Out DataType")
_PLACES = {"BPU": "npu", "CPU": "cpu"}


def looks_like_hb_mapper(text: str) -> bool:
    """True when the text carries a marker only hb_mapper prints."""
    markers = ("hb_mapper", "Horizon NN", "The converted model node information", "HzSQuantized",
               "HZ_PREPROCESS_FOR_", "The quantify model output")
    return any(m in text for m in markers) or bool(re.search(r"^Node\s+ON\s+Subgraph\s+Type", text, re.M))


def parse_hb_mapper(text: str) -> ParsedLog:
    """The whole log (or a published excerpt of it) as a `ParsedLog`."""
    lines = file_lines(text)
    failure, reached = _phases(lines)
    layers = _node_table(lines)
    tabled = {row.layer for row in layers}
    layers += [row for row in _cpu_notices(lines) if row.layer not in tabled]
    if reached is None and failure is None and layers:
        reached = Stage.COMPILE  # hb_mapper prints the node table once the model is compiled
    similarity = [LayerSimilarity(layer=row.layer, vendor_op=row.vendor_op, entire_cosine=row.cosine,
                                  line=row.line) for row in layers if row.cosine is not None]
    return ParsedLog(
        tool=TOOL,
        version=_version(text),
        target=(m.group("march") if (m := _MARCH.search(text)) else ""),
        stage_reached=reached,
        failure=failure,
        layers=layers,
        similarity=similarity + _output_table(lines),
    )


def _version(text: str) -> str:
    for pattern in _VERSIONS:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return ""


def _phase_stage(phase: str) -> Stage | None:
    """hb_mapper's phase words on the shared stages; None for the whole-run "Horizon NN Model Convert"."""
    words = phase.lower()
    for key, stage in (("parse", Stage.LOAD), ("prepare", Stage.LOAD), ("optimize", Stage.BUILD),
                       ("calibrat", Stage.QUANTIZE), ("quantiz", Stage.QUANTIZE), ("compile", Stage.COMPILE)):
        if key in words:
            return stage
    return None


def _phases(lines: list[str]) -> tuple[Failure | None, Stage | None]:
    """The first ERROR (in the phase that was running) and the last phase that ended before it."""
    running: Stage | None = None
    reached: Stage | None = None
    for number, line in enumerate(lines, start=1):
        error = _ERROR.search(line) or _CRASH.search(line)
        if error is not None:
            message = (error.groupdict().get("msg") or line).strip()
            return _failure(message, running or _message_stage(message) or _next_stage(reached), number), reached
        for match in _PHASE.finditer(line):
            stage = _phase_stage(match.group("phase"))
            if stage is None:
                continue
            if match.group("edge") == "Start":
                running = stage
            else:
                reached, running = stage, None
    return None, reached


def _failure(message: str, stage: Stage, line: int) -> Failure:
    node = _NODE_IN_MESSAGE.search(message)
    op = _OP_IN_MESSAGE.search(message)
    layer = (node.group("name") or node.group("listed")) if node else ""
    return Failure(stage=stage, message=message, layer=layer, vendor_op=op.group("op") if op else "", line=line)


def _message_stage(message: str) -> Stage | None:
    lowered = message.lower()
    return next((stage for words, stage in _MESSAGE_STAGE if words in lowered), None)


def _next_stage(reached: Stage | None) -> Stage:
    order = [Stage.LOAD, Stage.BUILD, Stage.QUANTIZE, Stage.COMPILE]
    if reached is None or reached not in order or reached is order[-1]:
        return Stage.LOAD if reached is None else Stage.COMPILE
    return order[order.index(reached) + 1]


def _node_table(lines: list[str]) -> list[VendorLayer]:
    """The rows of the last node table: placement, subgraph, Horizon op, cosine, dtype."""
    rows: list[VendorLayer] = []
    starts: dict[str, int] | None = None
    for number, line in enumerate(lines, start=1):
        if re.match(r"^Node\s+ON\s+Subgraph\s+Type", line):
            starts, rows = _column_starts(line), []
            continue
        if starts is None or not line.strip() or set(line.strip()) <= {"-", "="}:
            continue
        row = _node_row(line, starts, number)
        if row is None:
            starts = None
            continue
        rows.append(row)
    return rows


def _cpu_notices(lines: list[str]) -> list[VendorLayer]:
    """The "Layer `name` will be executed on CPU" notices (a layer over a BPU limit falls back)."""
    return [VendorLayer(layer=m.group("name"), vendor_op="", target="cpu", line=number)
            for number, line in enumerate(lines, start=1) if (m := _CPU_NOTICE.search(line))]


def _column_starts(header: str) -> dict[str, int]:
    return {name: header.find(name) for name in _COLUMNS if header.find(name) >= 0}


def _cells(line: str, starts: dict[str, int]) -> dict[str, str]:
    """Fixed-width cells cut at the header's column starts (names may hold spaces, figures may be blank)."""
    ordered = sorted(starts.items(), key=lambda item: item[1])
    cells: dict[str, str] = {}
    for i, (name, start) in enumerate(ordered):
        end = ordered[i + 1][1] if i + 1 < len(ordered) else len(line)
        cells[name] = line[start:end].strip()
    return cells


def _node_row(line: str, starts: dict[str, int], number: int) -> VendorLayer | None:
    if _TIMESTAMP.match(line) or line.startswith("```"):
        return None
    cells = _cells(line, starts)
    if cells.get("ON") not in _PLACES:
        tokens = line.split()  # a row not aligned with its header: the first four columns by whitespace
        if len(tokens) < 4 or tokens[1] not in _PLACES:
            return None
        cells = dict(zip(("Node", "ON", "Subgraph", "Type"), tokens[:4], strict=True))
    subgraph = _SUBGRAPH.search(cells.get("Subgraph", ""))
    return VendorLayer(
        layer=cells["Node"],
        vendor_op=cells.get("Type", ""),
        target=_PLACES[cells["ON"]],
        dtype=cells.get("In/Out DataType", "").lower(),
        partition=int(subgraph.group(1)) if subgraph else None,
        cosine=parse_float(cells.get("Cosine Similarity", "")),
        line=number,
    )


def _output_table(lines: list[str]) -> list[LayerSimilarity]:
    """"The quantify model output:" rows: the cosine of each graph output (quantized vs float)."""
    rows: list[LayerSimilarity] = []
    in_table = False
    for number, line in enumerate(lines, start=1):
        if "The quantify model output" in line:
            in_table, rows = True, []
            continue
        tokens = line.split()
        if not in_table or not tokens or set(line.strip()) <= {"-", "="} or tokens[0] == "Node":
            continue
        cosine = parse_float(tokens[1]) if len(tokens) > 1 else None
        if cosine is None:
            in_table = False
            continue
        rows.append(LayerSimilarity(layer=tokens[0], vendor_op="", entire_cosine=cosine, is_output=True,
                                    line=number))
    return rows
