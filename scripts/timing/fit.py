#!/usr/bin/python3
"""Fits a board's timing model to measured figures (docs/timing.md,
docs/porting.md: "A board's timing model").

    /usr/bin/python3 scripts/timing/fit.py [--profile FILE.json] [--out FILE.json] [--build build/dev]
        [--work DIR]

The structure of the model comes from the datasheet: clock, lanes, the
multiply-adds a lane does per cycle in each precision (the peaks), the
channel tiles, the vector unit. What a datasheet does not say is fitted
here: the share of the array's peak a full layer sustains in each
precision (mac_efficiency_pct), device memory's sustained bandwidth
(dram_mbps) and the fixed cost of an op (op_ns). The figures to fit are
calibrate.py's PUBLISHED list: whole networks at known batch sizes, the way
vendors publish them (a few measured layers work the same way: put them in
the list as one-layer networks).

How: each network is compiled once (calibrate.py) and costed once by
`tpuhal profile --modelled --json` on the starting profile, which gives
each layer's compute, memory and overhead time. A candidate scales them
(compute by the efficiency ratio, memory by the bandwidth ratio, overhead
by its op count times the new op cost), takes each layer's max(compute,
memory) + overhead, and the grid keeps the candidate whose worst relative
error over the figures is least. The result is written as a profile (--out)
and checked the exact way, by costing every network again with it.
"""

import argparse
import copy
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import calibrate  # noqa: E402
import numpy as np  # noqa: E402  Debian's python3-numpy

PRECISIONS = ("int8", "fp16", "fp32")


def breakdown(tpuhal, tpm, device, env):
    out = json.loads(calibrate.run([tpuhal, "profile", tpm, "--modelled", "--json", "--device", device], env))
    return tuple(np.array([l[k] for l in out["layers"]]) for k in ("compute_ms", "memory_ms", "overhead_ms"))


def predict(layers, eff_ratios, bw_ratio, op_delta_ms, op_cost_ms):
    """A network's time for each efficiency ratio (a numpy vector)."""
    c, m, o = layers
    ops = np.round(o / op_cost_ms) if op_cost_ms > 0 else np.zeros_like(o)
    per_layer = np.maximum(c[:, None] * eff_ratios[None, :], (m * bw_ratio)[:, None]) + (o + ops * op_delta_ms)[:, None]
    return per_layer.sum(axis=0)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=os.path.join(calibrate.ROOT, "simulator", "profiles", "bm1684x.json"))
    ap.add_argument("--out", help="write the fitted profile here (default: print its timing.model)")
    ap.add_argument("--build", default=os.path.join(calibrate.ROOT, "build", "dev"))
    ap.add_argument("--work", default=os.path.join(calibrate.ROOT, "build", "timing"))
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="fit to the figures of these precisions only; the others keep their efficiency")
    a = ap.parse_args(argv)
    fit_precisions = a.precisions.split(",")
    tpuhal = os.path.join(a.build, "bin", "tpuhal")
    os.makedirs(a.work, exist_ok=True)
    with open(a.profile) as f:
        profile = json.load(f)
    model = profile["timing"]["model"]

    def as_board(p):
        """A folder holding `p` as fit.json, for sim:fit."""
        d = tempfile.mkdtemp(prefix="tpuhal-fit-")
        with open(os.path.join(d, "fit.json"), "w") as f:
            json.dump(p, f, indent=2)
        env = dict(os.environ, TPUHAL_PROFILE_PATH=d)
        return env

    env = as_board(profile)
    refs = []
    for name, precision, batch, published in calibrate.PUBLISHED:
        if precision not in fit_precisions:
            continue
        tpm = calibrate.compiled(tpuhal, a.work, name, precision, batch)
        refs.append((precision, batch, published, breakdown(tpuhal, tpm, "sim:fit", env)))

    op_cost_ms = (model["op_ns"] + model["command_ns"]) / 1e6
    effs_grid = np.arange(5, 101, dtype=float)
    best = None
    for op_ns in range(0, 20001, 250):
        op_delta = (op_ns - model["op_ns"]) / 1e6
        for dram in range(16000, 68001, 4000):
            bw_ratio = model["dram_mbps"] / dram
            worst, effs = 0.0, {}
            for p in fit_precisions:
                ratios = model["mac_efficiency_pct"][p] / effs_grid
                err = np.zeros_like(effs_grid, dtype=float)
                for _, b, pub, l in (r for r in refs if r[0] == p):
                    err = np.maximum(err, np.abs(predict(l, ratios, bw_ratio, op_delta, op_cost_ms) / b / pub - 1))
                i = int(np.argmin(err))
                effs[p] = int(effs_grid[i])
                worst = max(worst, float(err[i]))
            if best is None or worst < best[0]:
                best = (worst, op_ns, dram, effs)
    worst, op_ns, dram, effs = best
    print(f"fitted: op_ns {op_ns}, dram_mbps {dram}, mac_efficiency_pct {effs} (predicted worst error "
          f"{100 * worst:.1f} %)")
    fitted = copy.deepcopy(profile)
    fm = fitted["timing"]["model"]
    fm["op_ns"], fm["dram_mbps"] = op_ns, dram
    fm["mac_efficiency_pct"] = {p: effs.get(p, model["mac_efficiency_pct"][p]) for p in PRECISIONS}
    # The exact check: every network costed again by the simulator's model.
    rows = calibrate.evaluate(tpuhal, a.work, "sim:fit", as_board(fitted))
    for r in rows:
        print(f"  {r['model']:10} {r['precision']:5} b{r['batch']}  published {r['published_ms']:7.3f} ms  "
              f"modelled {r['modelled_ms']:7.3f} ms  {100 * r['error']:+6.1f} %")
    print(f"worst error {100 * max(abs(r['error']) for r in rows):.1f} %")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(fitted, f, indent=2)
            f.write("\n")
    else:
        print(json.dumps(fm, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
