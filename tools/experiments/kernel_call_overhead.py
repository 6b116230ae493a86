"""The cost of calling one kernel: the plain C library through ctypes (what eager code calls: ``native.Kernels``, a
product bound to its weight and the unbound one) and through its torch operator (``torch.ops.redline.*``,
``torch.library.custom_op``), against the torch C++ extension it replaced, in one process, interleaved.

The old extension is built from an earlier commit's kernels with its operators renamed ``redline_old::*`` so both
load side by side, e.g.::

    git archive HEAD~1 inference/kernels | tar -x -C /tmp/oldk
    sed -i 's/TORCH_LIBRARY\\(_[A-Z]*\\)\\?(redline,/TORCH_LIBRARY\\1(redline_old,/' /tmp/oldk/inference/kernels/*.cpp
    g++ -O3 -mavx2 -mfma -mf16c -fopenmp -std=c++20 -ffp-contract=off -fPIC -shared -I$TORCH/include \\
        -I$TORCH/include/torch/csrc/api/include /tmp/oldk/inference/kernels/*.cpp -L$TORCH/lib -ltorch -ltorch_cpu \\
        -lc10 -Wl,-rpath,$TORCH/lib -o /tmp/oldk/redline_old.so
    python tools/experiments/kernel_call_overhead.py --old /tmp/oldk/redline_old.so --rounds 7

Tiny shapes (a product of 1×64 by 64×64, an RMSNorm of 576), so the time is the call, not the arithmetic: each
figure is the median over rounds of the mean of ``--calls`` calls, in µs; the ratios are medians of per-round
ratios (new ÷ old: < 1 is cheaper).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="the old torch extension (.so), operators named redline_old::*")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch's threads (default 1: no parallel region's wake-up in the figure)"
    )
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)

    from redline.inference.kernels import block_quant
    from redline.inference.kernels.cpu import library as native

    torch.ops.load_library(args.old)
    k = native.native()
    if k is None:
        raise SystemExit(f"the kernels do not load here: {native.status()['reason']}")
    old = torch.ops.redline_old
    torch.manual_seed(0)
    x = torch.randn(1, 64)
    b = block_quant.quantize_q8(torch.randn(64, 64) * 0.05)
    w, s = b.qweight, b.scales
    h, g = torch.randn(1, 576), torch.rand(576)
    bound = k.bind_q8(w, s)
    assert torch.equal(old.linear_q8(x, w, s), bound(x)) and torch.equal(old.linear_q8(x, w, s), k.linear_q8(x, w, s))
    assert torch.equal(old.rms_norm(h, g, 1e-5), k.rms_norm(h, g, 1e-5))
    cases = {
        "linear_q8 1×64·64×64": {
            "old extension (torch.ops, C++ dispatcher)": lambda: old.linear_q8(x, w, s),
            "ctypes, bound to the weight (the fast path's call)": lambda: bound(x),
            "ctypes, unbound": lambda: k.linear_q8(x, w, s),
            "custom_op (torch.ops.redline)": lambda: torch.ops.redline.linear_q8(x, w, s),
        },
        "rms_norm 1×576": {
            "old extension (torch.ops, C++ dispatcher)": lambda: old.rms_norm(h, g, 1e-5),
            "ctypes (the fast path's call)": lambda: k.rms_norm(h, g, 1e-5),
            "custom_op (torch.ops.redline)": lambda: torch.ops.redline.rms_norm(h, g, 1e-5),
        },
    }
    load_before = os.getloadavg()
    per_case = {case: {name: [] for name in fns} for case, fns in cases.items()}
    for fns in cases.values():
        for fn in fns.values():
            for _ in range(200):
                fn()
    for r in range(args.rounds):
        for case, fns in cases.items():
            names = list(fns) if r % 2 == 0 else list(fns)[::-1]  # A B C D, then D C B A
            for name in names:
                fn = fns[name]
                t = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                per_case[case][name].append((time.perf_counter() - t) / args.calls * 1e6)
    load_after = os.getloadavg()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, kernels {native.status()['variant']}; "
        f"{args.rounds} rounds × {args.calls} calls; load average {load_before[0]:.2f} → {load_after[0]:.2f}"
    )
    print()
    print("| call | µs per call (median) | ÷ old extension (median of per-round ratios) |")
    print("|---|---|---|")
    for case, times in per_case.items():
        old_name = next(iter(times))
        for name, values in times.items():
            ratio = statistics.median(v / o for v, o in zip(values, times[old_name]))
            print(f"| {case}: {name} | {statistics.median(values):.2f} | {ratio:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
