"""Turn a benchmark results JSON into PNG plots (matplotlib, Agg: no display needed).

    python bench/plot.py RESULTS.json [RESULTS.json ...] [--out DIR]

Reads the suite's own format (``bench/suite.py``, schema ``pyblasgemm-bench/1``) and the older
one-off files in bench/results/ (``backends_*``, ``kernels_*``, ``foundation_*``). For each file
it writes, into DIR (default: ``$XDG_DATA_HOME/pyblasgemm/plots``, else
``~/.local/share/pyblasgemm/plots``; never the package's own folder: the docs' figures are made
with ``--out docs/_static/perf`` from a checkout):

``<stem>_tflops.png``    TFLOP/s (TOP/s for int8) per problem and implementation;
``<stem>_ratio.png``     our speed over cuBLAS's in the same run (1.0 = parity);
``<stem>_roofline.png``  the roofline with the ceilings measured in the same run (suite files);
``<stem>_configs.png``   every kernel configuration tried per problem (``kernels_*`` files);
``<stem>_mma_sync.png``  burst and sustained ratios to cuBLAS per implementation and problem,
                         with the 0.70 target of issue #3 (``mma_sync_*`` files of
                         ``bench/bench_mma_sync.py``).

Every figure is titled with the device and the date of the run.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import NamedTuple

from .._files import DOCUMENT_BYTES, read_regular, why_not_directory



def default_out() -> pathlib.Path:
    """Where plots go without ``--out``: the user's data directory, not the package (which is
    read-only site-packages once installed).

    >>> default_out().parts[-2:]
    ('pyblasgemm', 'plots')
    """
    from .._files import data_home

    return data_home() / "plots"


IMPL_COLORS = {"auto": "#1f77b4", "tensorcore": "#2ca02c", "cublas": "#d62728",
               "cupy": "#ff7f0e", "torch": "#9467bd", "numpy": "#8c564b"}
IMPL_LABELS = {"auto": "pyblasgemm (auto)", "tensorcore": "pyblasgemm (our kernels)",
               "cublas": "cuBLAS (cuBLASLt)", "cupy": "cupy.matmul", "torch": "torch",
               "numpy": "numpy.matmul"}


class Record(NamedTuple):
    case: str        # "fp16 4096x4096x4096"
    dtype: str
    impl: str
    tflops: float
    flops: float = 0.0
    min_bytes: float = 0.0
    config: str = ""


class Results(NamedTuple):
    title: str       # device and date
    records: list
    ceilings: dict
    kind: str        # "suite", "backends", "kernels", "foundation"


_OLD_DTYPE = {"f16": "fp16", "bf16": "bf16", "i8": "int8", "s8": "int8"}


def _old_dtype(dtype: str, compute: str) -> str:
    if dtype == "f32":
        return {"tf32": "tf32", "3xtf32": "3xtf32"}.get(compute, "fp32")
    return _OLD_DTYPE.get(dtype, dtype)


def read_json(path):
    """The JSON document at ``path``: a regular file of at most
    :data:`~pyblasgemm._files.DOCUMENT_BYTES` (a FIFO or a device is refused, never read)."""
    return json.loads(read_regular(path, DOCUMENT_BYTES))


def load(path) -> Results:
    """Any results JSON of this repository, as records."""
    doc = read_json(path)
    dev = doc.get("device")
    dev_name = dev.get("name", "?") if isinstance(dev, dict) else str(dev)
    title = f"{dev_name}, {str(doc.get('date', '?'))[:10]}"
    recs = []
    if doc.get("schema", "").startswith("pyblasgemm-bench/"):
        for r in doc["results"]:
            if r.get("tflops"):
                recs.append(Record(f"{r['dtype']} {r['problem']}", r["dtype"], r["impl"],
                                   r["tflops"], r["flops"], r["min_bytes"]))
        return Results(title, recs, doc.get("ceilings") or {}, "suite")
    if "cases" in doc and any("tensorcore_ms" in c for c in doc["cases"]):
        for c in doc["cases"]:
            if "m" not in c:
                continue
            d = _old_dtype(c["dtype"], c.get("compute", ""))
            case = f"{d} {c['m']}x{c['n']}x{c['k']} {c.get('trans', '')}".strip()
            for impl in ("auto", "tensorcore", "cublas"):
                if c.get(f"{impl}_tflops"):
                    recs.append(Record(case, d, impl, c[f"{impl}_tflops"]))
        return Results(title, recs, {}, "backends")
    if "results" in doc and any("ours_tflops" in r for r in doc["results"]):
        for r in doc["results"]:
            d = _OLD_DTYPE.get(r.get("kind"), r.get("kind", "?"))
            case = f"{r['name']} ({r['m']}x{r['n']}x{r['k']})"
            recs.append(Record(case, d, "tensorcore", r["ours_tflops"], config=r.get("config", "")))
            ref = "torch" if "torch" in r.get("ref", "") else "cublas"
            recs.append(Record(case, d, ref, r["ref_tflops"], config=r.get("ref", "")))
        return Results(title, recs, {}, "kernels")
    if "cases" in doc:
        for c in doc["cases"]:
            if "pyblasgemm_tflops" in c:
                d = c["case"].split()[0]
                recs.append(Record(c["case"], d, "auto", c["pyblasgemm_tflops"]))
                if c.get("cupy_matmul_tflops"):
                    recs.append(Record(c["case"], d, "cupy", c["cupy_matmul_tflops"]))
        return Results(title, recs, {}, "foundation")
    raise ValueError(f"{path}: not a results file this script knows")


def _best(records):
    """(case, impl) -> best TFLOP/s (kernels files hold several configs per case)."""
    best = {}
    for r in records:
        key = (r.case, r.impl)
        best[key] = max(best.get(key, 0.0), r.tflops)
    return best


def _cases(records):
    seen = []
    for r in records:
        if r.case not in seen:
            seen.append(r.case)
    return seen


def _unit(records):
    return "TFLOP/s (TOP/s for int8)" if any(r.dtype == "int8" for r in records) else "TFLOP/s"


def _panels(res: Results):
    """[(title, [case, ...])]: one panel per dtype for suite files (rows = problems), else one."""
    cases = _cases(res.records)
    if res.kind != "suite":
        return [("", cases)]
    dtypes = []
    for r in res.records:
        if r.dtype not in dtypes:
            dtypes.append(r.dtype)
    return [(d, [c for c in cases if c.split(" ", 1)[0] == d]) for d in dtypes]


def _bars(res: Results, path, values, xlabel, title, parity=False):
    """Horizontal grouped bars, one panel per _panels entry; values(case, impl) -> float|None."""
    import matplotlib.pyplot as plt
    panels = _panels(res)
    impls = [i for i in IMPL_COLORS if any(values(c, i) for _, cs in panels for c in cs)]
    rows = max(len(cs) for _, cs in panels)
    per_row = 0.16 * max(2, len(impls)) + 0.08
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) if len(panels) > 1
                                                      else 9, 1.4 + per_row * rows),
                             squeeze=False, sharey=False)
    h = 0.8 / max(1, len(impls))
    for ax, (ptitle, cases) in zip(axes[0], panels):
        labels = [c.split(" ", 1)[1] if ptitle else c for c in cases]
        for j, impl in enumerate(impls):
            ys = [i + (j - (len(impls) - 1) / 2) * h for i in range(len(cases))]
            ax.barh(ys, [values(c, impl) or 0.0 for c in cases], height=h,
                    color=IMPL_COLORS[impl], label=IMPL_LABELS[impl])
        if parity:
            ax.axvline(1.0, color="k", lw=1, ls="--")
        ax.set_yticks(range(len(cases)), labels, fontsize=7.5)
        ax.set_ylim(len(cases) - 0.5, -0.5)
        ax.set_title(ptitle, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=7.5)
        ax.set_xlabel(xlabel, fontsize=8)
    height = 1.4 + per_row * rows
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title, fontsize=10, y=1 - 0.12 / height, va="top")
    fig.legend(handles, labels, fontsize=8, loc="upper center", ncol=len(impls),
               bbox_to_anchor=(0.5, 1 - 0.38 / height))
    fig.tight_layout()
    fig.subplots_adjust(top=1 - 1.0 / height)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tflops(res: Results, path):
    best = _best(res.records)
    _bars(res, path, lambda c, i: best.get((c, i)), _unit(res.records),
          f"Throughput per problem: {res.title}")


def ratios(res: Results) -> dict:
    """impl -> [(case, speed / cuBLAS's)] for our implementations, where both were measured."""
    best = _best(res.records)
    base_impl = {c: ("cublas" if (c, "cublas") in best else "torch" if (c, "torch") in best
                     else "cupy" if (c, "cupy") in best else None) for c in _cases(res.records)}
    out = {}
    for impl in ("auto", "tensorcore"):
        for c in _cases(res.records):
            b = base_impl[c]
            if b and (c, impl) in best and best[(c, b)] > 0:
                out.setdefault(impl, []).append((c, best[(c, impl)] / best[(c, b)]))
    return out


def plot_ratio(res: Results, path):
    rs = {impl: dict(v) for impl, v in ratios(res).items()}
    _bars(res, path, lambda c, i: rs.get(i, {}).get(c),
          "speed / cuBLAS's, same run (1 = parity)", f"Ratio to cuBLAS: {res.title}",
          parity=True)


def plot_roofline(res: Results, path):
    """TFLOP/s against arithmetic intensity (flops per byte that must move), with the copy
    bandwidth and cuBLAS fp16 8192^3 measured in the same run as the roof."""
    import matplotlib.pyplot as plt
    bw = res.ceilings["copy_GBps"] * 1e9
    peak = res.ceilings["fp16_cublas_tflops"]
    # the roof is fp16's: only the 16-bit float problems are plotted against it
    pts = [r for r in res.records if r.min_bytes and r.impl in ("auto", "tensorcore", "cublas")
           and r.dtype in ("fp16", "bf16", "fp16acc")]
    ai = [r.flops / r.min_bytes for r in pts] or [1.0]
    lo, hi = min(ai) / 2, max(ai + [peak * 1e12 / bw]) * 2
    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bw / 1e12) for x in xs], "k-", lw=1.5,
            label=f"roof: copy {bw / 1e12:.2f} TB/s, cuBLAS fp16 {peak:.0f} TFLOP/s")
    markers = {"fp16": "o", "bf16": "s", "int8": "^", "3xtf32": "D", "tf32": "v", "fp32": "P",
               "fp16acc": "x"}
    for impl in ("auto", "tensorcore", "cublas"):
        for d in sorted({r.dtype for r in pts}):
            sel = [r for r in pts if r.impl == impl and r.dtype == d]
            if sel:
                ax.scatter([r.flops / r.min_bytes for r in sel], [r.tflops for r in sel],
                           marker=markers.get(d, "o"), color=IMPL_COLORS[impl], alpha=0.75,
                           s=28, label=f"{IMPL_LABELS[impl]}, {d}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flops per byte of A, B and C moved once)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Roofline (measured ceilings): {res.title}", fontsize=10)
    ax.grid(which="both", alpha=0.25)
    ax.legend(fontsize=6.5, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_configs(res: Results, path):
    """Every configuration of our kernels per problem (kernels_* files), one bar each, with
    the reference measured in the same run marked in red on every row of its problem."""
    import matplotlib.pyplot as plt
    rows, refs = [], {}
    for r in res.records:
        if r.impl != "tensorcore":
            refs.setdefault(r.case, r)
            continue
        for i, (case, cfg, val) in enumerate(rows):
            if case == r.case and cfg == r.config:      # measured twice: keep the best
                rows[i] = (case, cfg, max(val, r.tflops))
                break
        else:
            rows.append((r.case, r.config, r.tflops))
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.26 * len(rows)))
    ys = range(len(rows))
    ax.barh(ys, [v for _, _, v in rows], color=IMPL_COLORS["tensorcore"], height=0.7,
            label="our kernels (one bar per configuration)")
    ref_x = [refs[c].tflops if c in refs else float("nan") for c, _, _ in rows]
    ax.scatter(ref_x, ys, marker="|", s=160, color=IMPL_COLORS["cublas"], zorder=3,
               label="reference in the same run (cuBLAS via cupy.matmul / torch)")
    ax.set_yticks(ys, [f"{c}  |  {cfg}" for c, cfg, _ in rows], fontsize=6.5)
    prev = None
    for y, (c, _, _) in enumerate(rows):
        if prev is not None and c != prev:
            ax.axhline(y - 0.5, color="0.6", lw=0.6)
        prev = c
    ax.invert_yaxis()
    ax.set_xlabel(_unit(res.records))
    ax.set_title(f"Our kernels, every configuration measured: {res.title}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def is_mma_sync_file(doc: dict) -> bool:
    """A ``bench/bench_mma_sync.py`` file: burst and sustained ratios, no per-problem records."""
    return isinstance(doc.get("burst"), list) and isinstance(doc.get("sustained"), list)


def plot_mma_sync(doc: dict, path):
    """Two panels (burst, sustained): ratio to cuBLAS per problem (rows) and implementation
    (bars), a dashed line at parity and a dotted one at issue #3's 0.70."""
    import matplotlib.pyplot as plt
    parts = ("burst", "sustained")
    impls = [r["impl"] for r in doc["burst"] if not r["impl"].startswith("cuBLAS")]
    impls = list(dict.fromkeys(impls))
    cases = list(dict.fromkeys(f"{r['size']}³ {r['layout']}" for r in doc["burst"]))
    colors = ["#ff7f0e", "#2ca02c", "#98df8a", "#1f77b4", "#9467bd"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 1.6 + 0.55 * len(cases)), squeeze=False, sharey=True)
    h = 0.8 / len(impls)
    for ax, part in zip(axes[0], parts):
        ratio = {(f"{r['size']}³ {r['layout']}", r["impl"]): r["ratio_vs_cublas"] for r in doc[part]}
        for j, impl in enumerate(impls):
            ys = [i + (j - (len(impls) - 1) / 2) * h for i in range(len(cases))]
            ax.barh(ys, [ratio.get((c, impl), 0.0) for c in cases], height=h, color=colors[j % len(colors)],
                    label=impl)
        ax.axvline(1.0, color="k", lw=1, ls="--")
        ax.axvline(0.70, color="k", lw=1, ls=":")
        ax.set_yticks(range(len(cases)), cases, fontsize=8)
        ax.set_ylim(len(cases) - 0.5, -0.5)
        ax.set_title({"burst": "burst (alternating rounds)", "sustained": "sustained (3 s each)"}[part], fontsize=9)
        ax.set_xlabel("speed / cuBLAS's, same run", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(f"fp16 with mma.sync vs cuBLAS: {doc.get('device', '?')}, {str(doc.get('date', '?'))[:10]}",
                 fontsize=10)
    fig.legend(handles, labels, fontsize=7.5, loc="lower center", ncol=2, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_plots(json_path, out_dir=None) -> list:
    """Write every plot that applies to ``json_path`` into ``out_dir`` (default
    :func:`default_out`); returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    out_dir = pathlib.Path(default_out() if out_dir is None else out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = pathlib.Path(json_path).stem
    doc = read_json(json_path)
    if is_mma_sync_file(doc):
        p = out_dir / f"{stem}_mma_sync.png"
        plot_mma_sync(doc, p)
        return [p]
    res = load(json_path)
    paths = []
    if not res.records:
        return paths
    p = out_dir / f"{stem}_tflops.png"
    plot_tflops(res, p)
    paths.append(p)
    if ratios(res):
        p = out_dir / f"{stem}_ratio.png"
        plot_ratio(res, p)
        paths.append(p)
    if res.ceilings.get("copy_GBps") and res.ceilings.get("fp16_cublas_tflops"):
        p = out_dir / f"{stem}_roofline.png"
        plot_roofline(res, p)
        paths.append(p)
    if res.kind == "kernels":
        p = out_dir / f"{stem}_configs.png"
        plot_configs(res, p)
        paths.append(p)
    return paths


def check(results, out) -> str | None:
    """Why plotting ``results`` into ``out`` would fail, or None: every file is read and
    recognised, and ``out`` is checked, before the first plot is drawn.

    >>> check(["no/such/file.json"], ".")
    "'no/such/file.json': no such file"
    """

    why = why_not_directory(out) if out.strip() else "empty"
    if why:
        return f"--out {out!r}: {why}"
    try:
        import matplotlib  # noqa: F401  (an optional dependency: the [bench] extra)
    except ImportError:
        return "the plots need matplotlib, which is not installed (pip install 'pyblasgemm[bench]')"
    for path in results:
        try:
            doc = read_json(path)
        except FileNotFoundError:
            return f"{path!r}: no such file"
        except OSError as exc:      # a directory, FIFO or device (RefusedFile), too large, ...
            return f"{path!r}: cannot read it ({exc.strerror or exc})"
        except (ValueError, RecursionError) as exc:
            return f"{path!r}: not JSON ({str(exc)[:120]})"
        if isinstance(doc, dict) and is_mma_sync_file(doc):
            continue
        try:
            load(path)
        except ValueError:
            return f"{path!r}: not a results file this script knows"
        except (KeyError, TypeError, AttributeError) as exc:     # a known format, but broken
            return (f"{path!r}: not a results file this script can read "
                    f"({type(exc).__name__}: {str(exc)[:120]})")
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/plot.py", description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="results JSON files")
    ap.add_argument("--out", default=str(default_out()),
                    help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)
    why = check(args.results, args.out)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    for path in args.results:
        for p in make_plots(path, args.out):
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
