"""What an older NVIDIA card is told before a load, checked without one: the refusal is computed from the card's
compute capability, and q8's kernel is asked of the card itself."""

import pytest

from redline.inference.errors import UnsupportedConfiguration
from redline.inference.precision import cuda_refusal, parse_precision

TURING, AMPERE, ADA = (7, 5), (8, 6), (8, 9)


@pytest.mark.parametrize("name", ["bf16", "q4", "gguf", "nf4", "q8"])
def test_ampere_and_newer_run_every_precision(name):
    for card in (AMPERE, ADA):
        assert cuda_refusal(parse_precision(name), card) is None


def test_an_rtx_20_card_is_refused_bf16_and_int4_with_what_runs_instead():
    bf16 = cuda_refusal(parse_precision("bf16"), TURING)
    assert isinstance(bf16, UnsupportedConfiguration)
    assert "compute capability 7.5" in bf16.message and "emulate" in bf16.message and "fp16" in bf16.hint
    q4 = cuda_refusal(parse_precision("q4"), TURING)
    assert "int4 kernel" in q4.message and "Ampere" in q4.message and "nf4" in q4.hint
    assert cuda_refusal(parse_precision("nf4", compute_dtype="bf16"), TURING) is not None  # computes in bf16
    for runs in ("fp16", "fp32", "int8+compute=fp16"):
        assert cuda_refusal(parse_precision(runs), TURING) is None
    assert cuda_refusal(parse_precision("nf4", compute_dtype="fp16"), TURING) is None
