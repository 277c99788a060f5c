"""`bisect --verify rknn` and `--evaluator rknn` through the real driver protocol, with a stand-in toolkit.

The driver runs in a subprocess exactly as with rknn-toolkit2; only `rknn.api` is fake
(tests/toolchains/fake_rknn_api.py): its step 1 keeps every tensor but the Adds (folded), its step 2
refuses a name step 1 did not list (as 2.5.0 does), and its simulator rounds outputs to a grid
2**k finer than 1/16 when k tensors were set to float16. So the cosine of any set of float sites has a
numpy oracle: a chain site (MatMul+Add+Relu) names 2 tensors, the head MatMul 1.
"""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import run, write_chain
from quantscan.cli import main

FAKE = Path(__file__).parents[1] / "toolchains" / "fake_rknn_api.py"


def _fake_python(tmp: Path) -> Path:
    pkg = tmp / "fake_site" / "rknn"
    pkg.mkdir(parents=True, exist_ok=True)  # the module-scoped chain folder: several tests make it
    (pkg / "__init__.py").write_text("")
    shutil.copy(FAKE, pkg / "api.py")
    wrapper = tmp / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp / "fake_site"}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def _oracle(model: Path, calib: Path, samples: int | list[int]) -> dict[int, float]:
    """k tensors float16 -> the fake simulator's pooled output cosine over `samples` (a count: the first
    ones; a list: those indices), computed with numpy."""
    xs = np.load(calib / "x.npy")
    picked = range(samples) if isinstance(samples, int) else samples
    ys = np.concatenate([run(onnx.load(model), {"x": xs[i:i + 1]})[0].ravel() for i in picked])
    ys = ys.astype(np.float64)
    out = {}
    for k in range(8):
        sim = np.round(ys * 16.0 * 2.0**k) / (16.0 * 2.0**k)
        out[k] = float(sim @ ys / np.sqrt((sim @ sim) * (ys @ ys)))
    return out


def _names(sites: list[str]) -> int:
    """Float16 tensors the fake toolkit is told about: the head names one tensor, a chain site two, the
    model input `x` (a site of its own) none: step 2 takes operator outputs only, so it vanishes."""
    return sum(0 if s == "x" else 1 if s == "head" else 2 for s in sites)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, dict[int, float]]:
    tmp = tmp_path_factory.mktemp("chain")
    model, calib = write_chain(tmp, samples=6, layers=2)
    return tmp, model, calib, _oracle(model, calib, 6)


def _bisect(tmp: Path, model: Path, calib: Path, out: str, target: float, *extra: str) -> int:
    return main(["bisect", str(model), "--calib", str(calib), "--profile", "rk3588", "--target-cosine",
                 f"{target:.9f}", "--quiet", "--out", str(tmp / out), "--export", "rknn", *extra])


def test_evaluator_rknn_searches_on_the_toolchains_figures(chain: tuple[Path, Path, Path, dict[int, float]],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    tmp, model, calib, cos = chain
    target = (cos[2] + cos[3]) / 2  # needs 3 float16 tensors: a chain site and the head, or both chain sites
    code = _bisect(tmp, model, calib, "ev", target, "--evaluator", "rknn", "--verify", "rknn",
                   "--vendor-python", str(_fake_python(tmp)))
    assert code == 0, capsys.readouterr().err
    plan = json.loads((tmp / "ev" / "plan.json").read_text())
    sites = [s["node"] for s in plan["sites"]]
    assert _names(sites) == 3 and plan["achieved"]["cosine"] == pytest.approx(cos[3], abs=1e-9)
    for step in plan["steps"]:  # every value the search saw is the toolchain's, not quantscan's simulation
        assert step["value"] == pytest.approx(cos[_names(step["sites"])], abs=1e-9)
    builds = sorted((tmp / "ev" / "toolchain").glob("eval-*"))
    assert len(builds) == plan["evaluations"]  # one build per evaluation, none repeated
    assert plan["verified"]["value"] == pytest.approx(cos[3], abs=1e-9) and plan["verified"]["vanished"] == []
    assert plan["verified"]["tool"] == "rknn" and plan["verified"]["version"] == "0.0.0-fake"
    assert all(p["verified"]["value"] == pytest.approx(p["value"], abs=1e-9) for p in plan["pareto"])
    assert "pareto (0 float sites): claimed" in capsys.readouterr().out
    session = json.loads((tmp / "ev" / "session.json").read_text())
    assert session["options"]["evaluator"] == "rknn"
    # a finished session resumed with the same evaluator runs no build; with another one it is refused
    assert main(["bisect", "--resume", str(tmp / "ev" / "session.json"), "--quiet", "--evaluator", "rknn",
                 "--vendor-python", str(tmp / "python")]) == 0
    assert len(sorted((tmp / "ev" / "toolchain").glob("eval-*"))) == len(builds)
    capsys.readouterr()
    assert main(["bisect", "--resume", str(tmp / "ev" / "session.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured with --evaluator rknn, found --evaluator quantscan" in err


def test_verify_puts_the_toolchains_figure_beside_each_claim(chain: tuple[Path, Path, Path, dict[int, float]],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    tmp, model, calib, cos = chain
    code = _bisect(tmp, model, calib, "ver", 0.999, "--verify", "rknn", "--vendor-python", str(tmp / "python"))
    assert code in (0, 1), capsys.readouterr().err
    plan = json.loads((tmp / "ver" / "plan.json").read_text())
    points = [(plan["sites"] and [s["node"] for s in plan["sites"]], plan.get("verified"))] if plan["reached"] else []
    points += [(p["sites"], p["verified"]) for p in plan["pareto"]]
    assert points and all(got["value"] == pytest.approx(cos[_names(list(sites or []))], abs=1e-9)
                          for sites, got in points)
    claims = {p["float_sites"]: p["value"] for p in plan["pareto"]}
    assert all(p["verified"]["claimed"] == claims[p["float_sites"]] for p in plan["pareto"])
    # one build per distinct set, and the search itself ran no build
    built = sorted(p.name for p in (tmp / "ver" / "toolchain").iterdir() if p.name.startswith(("verify-", "eval-")))
    # all-int8 is built too (the toolchain's gain baseline on the held-out samples)
    distinct = {tuple(s or []) for s, _ in points} | {()}
    assert all(b.startswith("verify-") for b in built) and len(built) == len(distinct)


def test_verify_scores_the_toolchain_on_the_claims_held_out_samples(
        chain: tuple[Path, Path, Path, dict[int, float]], capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38 part 3: `verified.held_out` is the toolchain on the odd (held-out) samples only, for the
    plan and for all-int8, beside the claim measured on those same samples."""
    tmp, model, calib, _ = chain
    _fake_python(tmp)
    code = _bisect(tmp, model, calib, "held", 0.999, "--verify", "rknn", "--vendor-python", str(tmp / "python"))
    out = capsys.readouterr().out
    assert code in (0, 1)
    plan = json.loads((tmp / "held" / "plan.json").read_text())
    held = plan["verified"]["held_out"]
    on_held = _oracle(model, calib, [1, 3, 5])
    assert held["samples"] == [1, 3, 5]
    assert held["vendor"] == pytest.approx(on_held[_names([s["node"] for s in plan["sites"]])], abs=1e-9)
    assert held["vendor_all_int8"] == pytest.approx(on_held[0], abs=1e-9)
    assert held["claimed"] == plan["achieved"]["cosine"] and held["claimed_all_int8"] == plan["all_int8"]["cosine"]
    assert held["vendor_gain"] == pytest.approx(held["vendor"] - held["vendor_all_int8"], abs=1e-12)
    assert held["interval"] == plan["interval"]
    assert f"rknn {held['vendor']:.5f}" in out and "same 3 held-out samples" in out


def test_tpu_mlir_needs_a_python_that_imports_it(chain: tuple[Path, Path, Path, dict[int, float]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """tpu-mlir is a judge now (tests/bisect/test_bisect_tpumlir.py); a Python without it is refused before any
    search time is spent."""
    tmp, model, calib, _ = chain
    assert _bisect(tmp, model, calib, "tpu", 0.99, "--verify", "tpu-mlir", "--vendor-python", sys.executable) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a Python that imports tpu_mlir" in err
    assert not (tmp / "tpu" / "plan.json").exists()


def test_evaluator_search_resumes_after_a_failed_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The toolkit fails on the 4th build: exit 2 with the finished steps kept; the resumed search runs
    only what was left (no finished step is built twice) and ends where an uninterrupted one ends."""
    model, calib = write_chain(tmp_path, samples=6, layers=2)
    cos = _oracle(model, calib, 6)
    python = _fake_python(tmp_path)
    api = tmp_path / "fake_site" / "rknn" / "api.py"
    counter = tmp_path / "builds.txt"
    api.write_text(api.read_text().replace(
        "        assert self.model is None, \"step 2 on an RKNN object that loaded a model fails in 2.5.0\"\n",
        "        assert self.model is None, \"step 2 on an RKNN object that loaded a model fails in 2.5.0\"\n"
        f"        count = Path({str(counter)!r})\n"
        "        done = int(count.read_text()) + 1 if count.exists() else 1\n"
        "        count.write_text(str(done))\n"
        "        if done == 4:\n"
        "            return -1\n"))
    target = (cos[2] + cos[3]) / 2
    args = ["--evaluator", "rknn", "--vendor-python", str(python)]
    assert _bisect(tmp_path, model, calib, "ev", target, *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped in hybrid_step2" in err and "keeps every finished step" in err
    session = json.loads((tmp_path / "ev" / "session.json").read_text())
    before = [e for e in session["events"] if e.get("kind") == "eval"]
    assert len(before) == 3  # the builds that finished
    assert main(["bisect", "--resume", str(tmp_path / "ev" / "session.json"), "--quiet", *args]) == 0
    plan = json.loads((tmp_path / "ev" / "plan.json").read_text())
    assert [s["sites"] for s in plan["steps"][:3]] == [e["sites"] for e in before]
    assert int(counter.read_text()) == plan["evaluations"] + 1  # every step built once, plus the failed build
    assert _names([s["node"] for s in plan["sites"]]) == 3
    assert plan["achieved"]["cosine"] == pytest.approx(cos[3], abs=1e-9)


def test_evaluator_builds_side_by_side_give_the_serial_search(chain: tuple[Path, Path, Path, dict[int, float]],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`--workers 2`: the real hybrid driver protocol with two step-2 builds at once (threads, each build its
    own subprocess and folder; step 1 once, before them): the same steps and plan as one build at a time,
    in fewer rounds, and every build still a figure of the numpy oracle."""
    tmp, model, calib, cos = chain
    target = (cos[2] + cos[3]) / 2
    python = str(_fake_python(tmp))
    plans = {}
    for workers in (1, 2):
        code = _bisect(tmp, model, calib, f"w{workers}", target, "--evaluator", "rknn", "--vendor-python", python,
                       "--workers", str(workers))
        assert code == 0, capsys.readouterr().err
        plans[workers] = json.loads((tmp / f"w{workers}" / "plan.json").read_text())
    one, two = plans[1], plans[2]
    assert [(s["sites"], s["value"], s["passed"]) for s in two["steps"]] == [
        (s["sites"], s["value"], s["passed"]) for s in one["steps"]]
    assert two["sites"] == one["sites"] and two["achieved"] == one["achieved"]
    assert two["speculation"]["rounds"] < one["evaluations"] and "speculation" not in one
    builds = sorted((tmp / "w2" / "toolchain").glob("eval-*"))
    assert len(builds) == one["evaluations"] + two["speculation"]["unused"]
    assert len(list((tmp / "w2" / "toolchain").glob("step1"))) == 1
    assert "rounds of up to 2" in capsys.readouterr().out
