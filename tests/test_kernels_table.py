"""The kernels' device table (inference/kernels/ops.py): each operator runs what is registered for its tensors' device
type, a device with nothing registered runs torch's operators (reference.py), and the CPU's row holds the native
kernels when their library loads, the reference operators when it is turned off."""

import pytest
import torch
from test_architecture import copy_tree, lint

from redline.inference.kernels import block_quant, ops, reference
from redline.inference.kernels.cpu import library

needs_native = pytest.mark.usefixtures("native_kernels")


@pytest.fixture
def fresh_table(monkeypatch):
    """The table as in a fresh process, and what a test registers gone with the test."""
    monkeypatch.setattr(ops, "_table", {})
    monkeypatch.setattr(ops, "_registered", {})


def test_a_registered_device_runs_its_operator(fresh_table):
    """ "meta" tensors stand for a device with a backend of its own (a CUDA or Triton one): what is registered for
    the device type runs, the operators it does not register stay the reference ones."""
    calls = []

    def linear(x, w):
        calls.append((tuple(x.shape), tuple(w.shape)))
        return x.new_empty((*x.shape[:-1], w.shape[0]))

    ops.register("meta", linear=linear)
    x, w = torch.empty(3, 64, device="meta"), torch.empty(16, 64, device="meta")
    assert ops.linear(x, w).shape == (3, 16)
    assert ops.bind_linear(w)(x).shape == (3, 16)  # a product bound to a weight runs the device's own product
    assert calls == [((3, 64), (16, 64))] * 2
    assert ops.implementation("meta", "rms_norm") is reference.rms_norm
    assert ops.rms_norm(x, torch.empty(64, device="meta"), 1e-6).shape == (3, 64)
    ops.unregister("meta")
    assert ops.implementation("meta", "linear") is reference.linear


def test_a_device_with_nothing_registered_runs_the_reference_operators(fresh_table):
    for name in ("linear", "linear_blocks", "rms_norm", "silu_mul", "attend", "quantize_blocks"):
        assert ops.implementation("some-accelerator", name) is getattr(reference, name)
    torch.manual_seed(0)
    x, w = torch.randn(2, 8, device="meta"), torch.randn(4, 8, device="meta")
    assert ops.linear(x, w).device.type == "meta"


def test_a_device_backend_is_asked_once_at_its_first_operator(fresh_table, monkeypatch):
    """The backend (a library to load, or build) is asked at the device's first operator, not at import and not
    at every call; one that cannot run here leaves the reference operators."""
    asked = []
    monkeypatch.setitem(ops.BACKENDS, "meta", lambda: asked.append(1))
    assert asked == []
    x = torch.empty(2, 16, device="meta")
    for _ in range(3):
        ops.silu_mul(x)
    assert asked == [1]
    assert ops.implementation("meta", "silu_mul") is reference.silu_mul


def test_an_unknown_operator_is_refused_with_the_names_there_are(fresh_table):
    with pytest.raises(ValueError, match="no operator named gelu in the device table; it has linear, linear_blocks"):
        ops.register("meta", gelu=lambda x: x)


@needs_native
def test_a_cpu_tensor_runs_the_native_kernel(fresh_table, native_kernels, monkeypatch):
    """With the library loaded, a bf16 product on the CPU is the native kernel's (same bits as calling it), and a
    product the kernels do not take (an fp32 weight) is torch's."""
    torch.manual_seed(1)
    x, w = torch.randn(3, 64), (torch.randn(16, 64) * 0.05).bfloat16()
    expected = native_kernels.linear_bf16(x, w)
    calls = []

    def spy(*args):
        calls.append(len(args))
        return expected

    monkeypatch.setattr(native_kernels, "linear_bf16", spy)
    assert torch.equal(ops.linear(x, w), expected) and calls == [2]
    w32 = w.float()
    assert torch.equal(ops.linear(x, w32), reference.linear(x, w32)) and calls == [2]
    blocks = block_quant.quantize_q8(torch.randn(16, 64))
    assert torch.equal(ops.linear_blocks(x, blocks), native_kernels.linear_q8(x, blocks.qweight, blocks.scales))


def test_kernels_turned_off_leave_the_cpu_the_reference_operators(fresh_table, monkeypatch):
    """REDLINE_NATIVE_KERNELS=0 (in a fresh process: the library's state as before its first load)."""
    monkeypatch.setenv("REDLINE_NATIVE_KERNELS", "0")
    monkeypatch.setattr(library, "_state", {"loaded": False, "reason": "not loaded yet"})
    calls = []
    real = reference.linear
    monkeypatch.setattr(reference, "linear", lambda x, w: calls.append(1) or real(x, w))
    x, w = torch.randn(3, 64), (torch.randn(16, 64) * 0.05).bfloat16()
    assert torch.equal(ops.linear(x, w), real(x, w)) and calls == [1]
    assert library.status()["reason"] == "turned off (REDLINE_NATIVE_KERNELS=0)"


@needs_native
def test_the_cpu_row_follows_the_library_whatever_ran_first(fresh_table, native_kernels, monkeypatch):
    """A CPU operator first called while a test turns the kernels off (its row made then) runs the native kernel
    again once they are back: the row is made once, the library is asked at each call."""
    x, w = torch.randn(3, 64), (torch.randn(16, 64) * 0.05).bfloat16()
    calls = []
    real = native_kernels.linear_bf16
    monkeypatch.setattr(native_kernels, "linear_bf16", lambda *a: calls.append(1) or real(*a))
    with monkeypatch.context() as off:
        off.setenv("REDLINE_NATIVE_KERNELS", "0")
        off.setattr(library, "_state", {"loaded": False, "reason": "not loaded yet"})
        assert torch.equal(ops.linear(x, w), reference.linear(x, w)) and calls == []
    assert torch.equal(ops.linear(x, w), real(x, w)) and calls == [1]


def test_a_backend_that_imports_the_table_breaks_the_kernels_contract(tmp_path):
    """The table asks the backends for their operators; a backend importing the table back (a cycle) is refused by
    import-linter (pyproject.toml, "Kernels: the device table above its backends")."""
    pkg = copy_tree(tmp_path)
    (pkg / "inference" / "kernels" / "cpu" / "sneaky.py").write_text("from .. import ops\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "Kernels: the device table above its backends BROKEN" in broken.stdout
    assert "redline.inference.kernels.cpu.sneaky -> redline.inference.kernels.ops" in broken.stdout
