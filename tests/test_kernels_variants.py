"""The kernel library's builds for other CPUs, its C ABI, and how a build is chosen (inference/kernels/cpu/library.py,
build.py). tests/test_kernels.py and test_whole_step.py test the build this CPU loads; here every build this CPU can
run is held to the same references, side by side."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from redline.inference.kernels import block_quant, reference
from redline.inference.kernels.cpu import build
from redline.inference.kernels.cpu import library as native

ROOT = Path(__file__).resolve().parent.parent
needs_native = pytest.mark.usefixtures("native_kernels")


def rel_error(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.fixture(scope="module")
def builds():
    """Every variant this CPU runs, loaded side by side (the portable one built here if need be)."""
    if native.why_not_here() is not None or not native.buildable_here():
        pytest.skip(f"no kernels here: {native.will_run()}")
    out = {}
    for variant in native.variants_here():
        try:
            out[variant] = native.library_for(variant)
        except RuntimeError as exc:  # no shipped library for it and no compiler
            pytest.skip(f"cannot load the {variant} build: {exc}")
    return out


def test_the_variant_follows_the_cpu_flags(monkeypatch):
    monkeypatch.delenv("REDLINE_KERNELS_VARIANT", raising=False)
    monkeypatch.setattr(build, "machine", lambda: "x86_64")
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"sse2", "avx", "avx2", "fma", "f16c"})
    assert native.variants_here() == ["avx2", "generic"]
    avx2 = {"sse2", "avx", "avx2", "fma", "f16c"}
    monkeypatch.setattr(native, "_cpu_flags", lambda: avx2 | {"avx_vnni"})  # Alder Lake, Zen 5 without AVX-512
    assert native.variants_here() == ["avx2-vnni", "avx2", "generic"]
    zen4 = avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # Zen 4, Ice Lake: AVX512-VNNI only
    monkeypatch.setattr(native, "_cpu_flags", lambda: zen4)
    assert native.variants_here() == ["avx512-vnni", "avx2", "generic"]
    monkeypatch.setattr(native, "_cpu_flags", lambda: zen4 | {"avx_vnni"})  # Sapphire Rapids: both
    assert native.variants_here() == ["avx512-vnni", "avx2-vnni", "avx2", "generic"]
    monkeypatch.setattr(native, "_cpu_flags", lambda: avx2 | {"avx512f", "avx512_vnni"})  # no VL: no 256-bit VNNI
    assert native.variants_here() == ["avx2", "generic"]
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"sse2", "avx", "f16c"})  # Ivy Bridge: AVX, no AVX2
    assert native.variants_here() == ["generic"]
    monkeypatch.setattr(build, "machine", lambda: "aarch64")
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"fp", "asimd", "asimddp"})
    assert native.variants_here() == ["neon-dotprod", "neon"]
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"fp", "asimd"})  # Cortex-A72 (Raspberry Pi 4)
    assert native.variants_here() == ["neon"]
    monkeypatch.setattr(build, "machine", lambda: "riscv64")
    assert native.variants_here() == [] and "riscv64" in native.cpu_supports_kernels()
    monkeypatch.setattr(build, "machine", lambda: "x86_64")
    monkeypatch.setenv("REDLINE_KERNELS_VARIANT", "neon")
    assert native.variants_here() == [] and "REDLINE_KERNELS_VARIANT=neon" in native.cpu_supports_kernels()


@needs_native
def test_the_library_is_plain_c_without_torch():
    """No libtorch, libc10 or Python symbol: the binary outlives a torch upgrade."""
    path = native.status()["path"]
    if sys.platform != "linux" or shutil.which("readelf") is None:
        pytest.skip("readelf on Linux only")
    dynamic = subprocess.run(["readelf", "-d", "--dyn-syms", "-W", path], capture_output=True, text=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert not [n for n in needed if "torch" in n or "c10" in n or "python" in n], needed
    undefined = [line.split()[-1] for line in dynamic.splitlines() if " UND " in line and line.split()[-1] != "UND"]
    assert not [u for u in undefined if "torch" in u or "c10" in u or u.startswith("Py")], undefined
    exported = {line.split()[-1] for line in dynamic.splitlines() if " GLOBAL " in line and " UND " not in line}
    assert {"redline_decode_step", "redline_step_plan", "redline_linear_q4", "redline_abi_version"} <= exported
    assert not [e for e in exported if not e.startswith(("redline_", "_ZSt", "_init", "_fini"))], exported


def test_every_build_gives_the_reference_results(builds):
    """Each variant this CPU runs, held to torch: products within their tolerance, the quantisers bit for bit,
    a row the same alone and in a batch, attention as torch's."""
    torch.manual_seed(0)
    w = (torch.randn(962, 576) * 0.05).bfloat16()
    x = torch.randn(9, 576)
    wq = torch.randn(98, 576) * 0.05
    for variant, k in builds.items():
        assert rel_error(k.linear_bf16(x, w), x @ w.float().T) < 1e-5, variant
        bf16 = k.bind_bf16(w)
        alone = torch.cat([bf16(x[i : i + 1]) for i in range(9)])
        assert torch.equal(bf16(x), alone), variant
        for kind in ("q8", "q4", "q4-symmetric"):
            blocks = (
                block_quant.quantize_q8(wq) if kind == "q8" else block_quant.quantize_q4(wq, kind == "q4-symmetric")
            )
            if kind == "q8":
                product = k.bind_q8(blocks.qweight, blocks.scales)
                q, s = k.quantize_q8(wq)
                assert torch.equal(q, blocks.qweight) and torch.equal(s, blocks.scales), variant
            else:
                mins = blocks.mins if blocks.mins is not None else blocks.scales.new_empty(0)
                product = k.bind_q4(blocks.qweight, blocks.scales, mins)
                p, s, m = k.quantize_q4(wq, kind == "q4-symmetric")
                assert torch.equal(p, blocks.qweight) and torch.equal(s, blocks.scales), (variant, kind)
            y = product(x)
            assert rel_error(y, x @ block_quant.dequantize(blocks).T) < 0.02, (variant, kind)
            assert torch.equal(y, torch.cat([product(x[i : i + 1]) for i in range(9)])), (variant, kind)
        h, g = torch.randn(3, 576), torch.rand(576)
        assert rel_error(k.rms_norm(h, g, 1e-5), reference.rms_norm(h, g, 1e-5)) < 1e-6, variant
        gate_up = torch.randn(2, 2 * 1540)  # 1540: a remainder past the vectors of eight
        assert rel_error(k.silu_mul(gate_up), reference.silu_mul(gate_up)) < 1e-6, variant
        heads, kv_heads, dim, page = 9, 3, 64, 16
        kp, kr = torch.zeros(40, kv_heads, page, dim), torch.zeros(40, kv_heads, page, dim)
        vp, vr = torch.zeros_like(kp), torch.zeros_like(kp)
        cos, sin = torch.randn(256, dim), torch.randn(256, dim)
        pages = torch.randperm(40)[:32].int().view(2, 16)
        for t in range(21):
            qkv = torch.randn(2, (heads + 2 * kv_heads) * dim)
            pos = torch.tensor([t, t + 3])
            got = k.attend(qkv, cos, sin, kp, vp, pages, pos, heads, kv_heads, dim**-0.5)
            want = reference.attend(qkv, cos, sin, kr, vr, pages, pos, heads, kv_heads, dim**-0.5)
        assert rel_error(got, want) < 1e-5 and torch.equal(kp, kr), variant


def test_the_vnni_builds_give_the_avx2_builds_bits(builds):
    """The VNNI builds change only how the byte products are summed (one vpdpbusd for maddubs and madd: the
    same integers), and avx512-vnni tiles bf16 rows four by four or six, and a prompt's (or a batch's) rows in
    512-bit registers two rows to a register (each output still one 8-lane sum in order; for Q8_0 the weights take
    vpdpbusd's offset and the activations' share of it is taken out), so products of every size, a batch and a
    prompt of many rows (odd counts, every tile size, the cache blocks of a wide one), are the AVX2 build's bits."""
    vnni = [v for v in builds if v.endswith("-vnni")]
    if "avx2" not in builds or not vnni:
        pytest.skip("this CPU has no VNNI (avx_vnni, or avx512_vnni with avx512vl)")
    avx2 = builds["avx2"]
    torch.manual_seed(2)
    wq = torch.randn(98, 576) * 0.05
    wq[0, :32] = -wq[0, :32].abs().max()  # a block whose every weight is the most negative: -127 in Q8_0
    b8, b4, b4s = block_quant.quantize_q8(wq), block_quant.quantize_q4(wq), block_quant.quantize_q4(wq, True)
    b8.qweight[1, 32:64] = -128  # not what our quantiser writes, but a GGUF file may hold it: int8's whole range
    empty = b4s.scales.new_empty(0)
    dense = (torch.randn(962, 576) * 0.05).bfloat16()  # 962: a remainder past the groups of four rows
    for rows in (1, 2, 3, 4, 5, 6, 7, 9, 10, 20, 44):
        x = torch.randn(rows, 576) * 3
        want = avx2.linear_bf16(x, dense)
        for variant in vnni:
            assert torch.equal(builds[variant].linear_bf16(x, dense), want), (variant, rows)
        want8 = avx2.linear_q8(x, b8.qweight, b8.scales)
        want4 = avx2.linear_q4(x, b4.qweight, b4.scales, b4.mins)
        want4s = avx2.linear_q4(x, b4s.qweight, b4s.scales, empty)
        for variant in vnni:
            k = builds[variant]
            assert torch.equal(k.linear_q8(x, b8.qweight, b8.scales), want8), (variant, rows)
            assert torch.equal(k.linear_q4(x, b4.qweight, b4.scales, b4.mins), want4), (variant, rows)
            assert torch.equal(k.linear_q4(x, b4s.qweight, b4s.scales, empty), want4s), (variant, rows)
    # 4-bit rows in lanes, sixteen to a register on avx512-vnni, their scales put in lanes sixteen blocks at a time:
    # whole chunks only (K = 2048: 64 blocks) and with a remainder (K = 576 above: 18 blocks); 70 and 98 weight rows
    # leave a last group short
    w4 = torch.randn(70, 2048) * 0.05
    q4, q4s = block_quant.quantize_q4(w4), block_quant.quantize_q4(w4, True)
    for rows in (9, 27, 100):
        x = torch.randn(rows, 2048)
        want4 = avx2.linear_q4(x, q4.qweight, q4.scales, q4.mins)
        want4s = avx2.linear_q4(x, q4s.qweight, q4s.scales, empty)
        for variant in vnni:
            assert torch.equal(builds[variant].linear_q4(x, q4.qweight, q4.scales, q4.mins), want4), (variant, rows)
            assert torch.equal(builds[variant].linear_q4(x, q4s.qweight, q4s.scales, empty), want4s), (variant, rows)
    # attention (avx512-vnni: keys two to a register, eight reduced together, the values sixteen outputs to a
    # register): every key count's remainders, groups of 3 (the starter's) and 4 heads, D of 64 and 128, fp32 and bf16
    for heads, kv_heads, dim, dtype in (
        (9, 3, 64, torch.float32),
        (8, 2, 128, torch.bfloat16),
        (4, 4, 64, torch.bfloat16),
    ):
        page = 16
        kp = (torch.randn(70, kv_heads, page, dim)).to(dtype)
        vp = torch.randn_like(kp.float()).to(dtype)
        cos, sin = torch.randn(1200, dim), torch.randn(1200, dim)
        pages = torch.randperm(70)[:68].int().view(1, 68)
        for n in (1, 2, 7, 9, 16, 17, 600, 1083):
            qkv = torch.randn(1, (heads + 2 * kv_heads) * dim)
            pos = torch.tensor([n - 1])
            want = avx2.attend(qkv, cos, sin, kp.clone(), vp.clone(), pages, pos, heads, kv_heads, dim**-0.5)
            for variant in vnni:
                got = builds[variant].attend(
                    qkv, cos, sin, kp.clone(), vp.clone(), pages, pos, heads, kv_heads, dim**-0.5
                )
                assert torch.equal(got, want), (variant, heads, kv_heads, dim, n)
    # bf16 rows eight weights a load (K % 16 == 8) and sixteen, over prompts read in cache blocks
    for shape, rows in (((130, 584), 9), ((130, 584), 44), ((70, 2048), 100), ((70, 8192), 27)):
        w = (torch.randn(*shape) * 0.05).bfloat16()
        x = torch.randn(rows, shape[1])
        want = avx2.linear_bf16(x, w)
        for variant in vnni:
            assert torch.equal(builds[variant].linear_bf16(x, w), want), (variant, shape, rows)


def test_avx512_without_its_wide_tiles_gives_the_avx2_bits_too(builds):
    """REDLINE_WIDE_TILES=0 runs avx512-vnni's 4-bit prompt products eight weight rows to a 256-bit register, as its
    decode rows always are, and its Q8_0 rows in 256-bit tiles, not paired (for measuring the 512-bit forms against):
    the same bits as the avx2 build, which the 512-bit forms are held to above. The switch is read once per process,
    so this runs in a process of its own."""
    if "avx512-vnni" not in builds or "avx2" not in builds:
        pytest.skip("this CPU has no avx512-vnni build")
    code = """
import torch
from redline.inference.kernels import block_quant
from redline.inference.kernels.cpu import library as native
wide, avx2 = native.library_for("avx512-vnni"), native.library_for("avx2")
torch.manual_seed(3)
for n, k in ((98, 576), (70, 2048)):
    for symmetric in (False, True):
        b = block_quant.quantize_q4(torch.randn(n, k) * 0.05, symmetric)
        mins = b.mins if b.mins is not None else b.scales.new_empty(0)
        for rows in (1, 3, 4, 5, 9, 44):
            x = torch.randn(rows, k)
            got, want = wide.linear_q4(x, b.qweight, b.scales, mins), avx2.linear_q4(x, b.qweight, b.scales, mins)
            assert torch.equal(got, want), (n, k, symmetric, rows)
    b = block_quant.quantize_q8(torch.randn(n, k) * 0.05)
    for rows in (2, 3, 4, 5, 9, 44):  # Q8_0 rows in 256-bit tiles (q8_tile), not paired
        x = torch.randn(rows, k)
        assert torch.equal(wide.linear_q8(x, b.qweight, b.scales), avx2.linear_q8(x, b.qweight, b.scales)), (n, k, rows)
print("same bits")
"""
    env = {**os.environ, "REDLINE_WIDE_TILES": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_the_portable_build_with_fused_multiply_adds_is_avx2_bit_for_bit(builds):
    """vec.h's portable operations do lane by lane what AVX2 does; built with REDLINE_EXACT_FMA (std::fma for the
    fused multiply-adds a CPU without FMA lacks) the portable build must give the AVX2 build's bits. This is what
    makes the ARM64 build, whose multiply-adds are fused, give the same bits too (test_kernels_arm64.py)."""
    if "avx2" not in builds:
        pytest.skip("this CPU has no AVX2")
    avx2, exact = builds["avx2"], native.library_for("generic", ("-DREDLINE_EXACT_FMA",))
    torch.manual_seed(1)
    for shape in ((98, 576), (17, 40), (33, 96)):
        w = (torch.randn(*shape) * 0.05).bfloat16()
        for rows in (1, 2, 3, 5, 9):
            x = torch.randn(rows, shape[1])
            assert torch.equal(avx2.linear_bf16(x, w), exact.linear_bf16(x, w)), (shape, rows)
    wq = torch.randn(98, 576) * 0.05
    for rows in (1, 3, 9, 20):
        x = torch.randn(rows, 576)
        b8, b4 = block_quant.quantize_q8(wq), block_quant.quantize_q4(wq)
        assert torch.equal(avx2.linear_q8(x, b8.qweight, b8.scales), exact.linear_q8(x, b8.qweight, b8.scales))
        assert torch.equal(
            avx2.linear_q4(x, b4.qweight, b4.scales, b4.mins), exact.linear_q4(x, b4.qweight, b4.scales, b4.mins)
        )
    g = torch.randn(3, 2 * 1540) * 4
    assert torch.equal(avx2.silu_mul(g), exact.silu_mul(g))
    h, n = torch.randn(3, 576), torch.rand(576)
    assert torch.equal(avx2.rms_norm(h, n, 1e-5), exact.rms_norm(h, n, 1e-5))
    for cache in (torch.float32, torch.bfloat16):
        pools = [torch.zeros(40, 2, 16, 64, dtype=cache) for _ in range(4)]
        cos, sin = torch.randn(256, 64), torch.randn(256, 64)
        pages = torch.randperm(40)[:32].int().view(2, 16)
        for t in range(37):
            qkv = torch.randn(2, (8 + 4) * 64)
            pos = torch.tensor([t, t + 5])
            a = avx2.attend(qkv, cos, sin, pools[0], pools[1], pages, pos, 8, 2, 0.125)
            b = exact.attend(qkv, cos, sin, pools[2], pools[3], pages, pos, 8, 2, 0.125)
            assert torch.equal(a, b), (cache, t)
        assert torch.equal(pools[0], pools[2]) and torch.equal(pools[1], pools[3])


@pytest.mark.slow
def test_the_portable_build_passes_the_kernel_and_whole_step_tests():
    """tests/test_kernels.py and test_whole_step.py again, on the portable x86-64 build (REDLINE_KERNELS_VARIANT=
    generic): what a CPU without AVX2 runs."""
    if native.why_not_here() is not None or "generic" not in native.variants_here() or not native.buildable_here():
        pytest.skip("no portable x86-64 build here")
    env = dict(os.environ, REDLINE_KERNELS_VARIANT="generic", QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_kernels.py",
            "tests/test_whole_step.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-500:]
