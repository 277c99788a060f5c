"""Hand-built SiteFacts for the cause-rule tests: ranges written out, nothing measured."""

from __future__ import annotations

from typing import Any

import numpy as np

from quantscan.diagnose import SiteFacts


def facts(ch_lo: list[float] | None = None, ch_hi: list[float] | None = None, *, scheme: str = "uint8",
          **kw: Any) -> SiteFacts:
    """A site whose range is its channels' hull, quantized by the textbook formulas for `scheme`."""
    lo_a = np.asarray(ch_lo if ch_lo is not None else [], np.float64)
    hi_a = np.asarray(ch_hi if ch_hi is not None else [], np.float64)
    lo = kw.pop("lo", float(lo_a.min()) if lo_a.size else -1.0)
    hi = kw.pop("hi", float(hi_a.max()) if hi_a.size else 1.0)
    if scheme == "int8":
        scale, zp, qmin, qmax = max(abs(lo), abs(hi)) / 127.0, 0, -128, 127
    else:
        rlo, rhi = min(lo, 0.0), max(hi, 0.0)
        scale, qmin, qmax = (rhi - rlo) / 255.0, 0, 255
        zp = int(round(-rlo / scale)) if scale > 0 else 0
    base: dict[str, Any] = {"node": "n", "op_type": "Conv", "output": "t", "scale": scale,
                            "zero_point": zp, "qmin": qmin, "qmax": qmax}
    base.update(kw)
    return SiteFacts(lo=lo, hi=hi, ch_lo=lo_a, ch_hi=hi_a, **base)
