"""Profile loading: shipped profiles validate, and every defect is one line naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantscan.compat import list_profiles, load_profile
from quantscan.errors import ProfileError

SHIPPED = [
    "ascend310", "ax650", "bm1684x", "ethos-u", "generic-npu", "hailo8", "hisilicon-svp", "horizon-x3", "neutron",
    "onnxruntime", "qnn-htp", "rk3568", "rk3576", "rk3588", "rk3588-llm", "tda4-tidl",
]


def test_shipped_profiles_listed_name_first() -> None:
    infos = list_profiles()
    assert [p.name for p in infos] == SHIPPED
    assert all(p.vendor and p.description for p in infos)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_limit_cites_a_source(name: str) -> None:
    p = load_profile(name)
    assert p.documents and "last word" in p.note
    assert all(limit.origin.source for limit in p.limits)
    assert p.opset.source and p.ops.source and p.quantization.source


def test_published_figures_are_shipped() -> None:
    x3 = {(lim.attribute, lim.when): lim for lim in load_profile("horizon-x3").limits if "Conv" in lim.ops}
    assert x3[("kernel", "any")].max == 7 and x3[("channels_per_group", "grouped")].max == 2048
    assert load_profile("horizon-x3").max_batch == 128
    rk = {(lim.attribute, lim.when): lim for lim in load_profile("rk3568").limits if "Conv" in lim.ops}
    assert (rk[("kernel", "any")].max, rk[("stride", "any")].max, rk[("pads", "any")].max) == (31, 7, 15)
    assert rk[("kernel", "depthwise")].max == 8


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "chip.toml"
    path.write_text('[meta]\nname = "chip"\n' + body)
    return path


@pytest.mark.parametrize(
    ("body", "key", "expected"),
    [
        ("[ops]\nnpux = []\n", "ops.npux", "unknown key"),
        ('[tensor]\nmax_rank = "4"\n', "tensor.max_rank", "expects an integer"),
        ('[ops]\nnpu = ["Conv2D"]\n', "ops.npu", "ONNX op types"),
        ('[[limit]]\nop = "Conv"\nattribute = "kernel"\nmax = "7"\nsource = "x"\n', "limit[0].max", "number"),
        (
            '[[limit]]\nop = "Conv"\nattribute = "kernal"\nmax = 7\nsource = "x"\n',
            "limit[0].attribute",
            "one of",
        ),
        ('[[limit]]\nop = "Conv"\nattribute = "kernel"\nmax = 7\n', "limit[0].source", "string"),
        ('[quantization]\nfallback_precision = "int4"\n', "quantization.fallback_precision", "one of"),
        ("[bogus]\n", "bogus", "unknown key"),
    ],
)
def test_malformed_profile_names_file_key_and_type(
    tmp_path: Path, body: str, key: str, expected: str
) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and f"'{key}'" in message and expected in message


def test_unknown_name_lists_known_profiles() -> None:
    with pytest.raises(ProfileError, match="unknown profile 'x5'.*generic-npu.*rk3568"):
        load_profile("x5")


def test_bad_toml_is_a_profile_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[meta\nname=")
    with pytest.raises(ProfileError, match="broken.toml"):
        load_profile(path)


def test_user_profile_by_path(tmp_path: Path) -> None:
    p = load_profile(write(tmp_path, '[ops]\nnpu = ["Conv", "Relu"]\nsource = "my datasheet"\n'))
    assert p.name == "chip" and p.npu_ops == {"Conv", "Relu"}
