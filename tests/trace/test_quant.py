"""The 4-bit state mirrors bitsandbytes' quantize_4bit tensor for tensor."""

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")

from cabe.trace.quant import quant_tensor_specs  # noqa: E402

pytestmark = pytest.mark.trace


@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize("shape", [(64, 128), (96, 200), (300, 512)])
def test_specs_match_bitsandbytes(shape, double_quant):
    w = torch.randn(*shape, dtype=torch.bfloat16)
    packed, qs = bnb.functional.quantize_4bit(w, blocksize=64, compress_statistics=double_quant, quant_type="nf4")
    specs = quant_tensor_specs(shape[0], shape[1], double_quant)
    got = {"weight": packed, "code": qs.code, "absmax": qs.absmax}
    if double_quant:
        got.update({"offset": qs.offset, "state2.absmax": qs.state2.absmax, "state2.code": qs.state2.code})
    assert set(got) == set(specs)
    for k, t in got.items():
        assert (tuple(t.shape), t.dtype) == (tuple(specs[k][0]), specs[k][1]), k
