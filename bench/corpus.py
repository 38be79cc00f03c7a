"""The held-out GEMM shape corpus: random shapes by class, drawn once and committed.

    python -m bench.corpus             # (re)write bench/heldout_corpus_2026-11-24.json
    python -m bench.corpus --check     # regenerate in memory, compare with the committed file
    python -m bench.corpus --overlaps  # where the corpus meets the planner's data (it must not)

Every entry is one ``pyblasgemm.matmul(A, B)`` call in NumPy's meaning: A is m x k (batch x m x k
for batch > 1), B is k x n; ``transa == 'T'`` means A is the transpose of a C-contiguous (k, m)
array (``A = A_store.T``), likewise B. dtype is float16, bfloat16, int8 (int32 result) or
float32_3xtf32 (float32 with ``compute='3xtf32'``).

Held out means: nothing in pyblasgemm was calibrated, fitted or picked on these shapes. A draw
whose (m, n, k), in either orientation, occurs in the planner's shipped tables, in the result
files those tables were derived from, in the benchmark suite or in the older held-out set is
redrawn (see :func:`excluded_shapes`). Redrawn collisions are written into the file, and
``--check`` excludes them again, so the corpus does not change when a table later drops a
shape; it fails when a table gains one of the corpus's shapes (a leak).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "heldout_corpus_2026-11-24.json"
OLD_HELDOUT = ROOT / "bench" / "heldout_shapes_2026-11-24.json"
PLANNER_TABLES = tuple(ROOT / "pyblasgemm" / "planner" / name for name in (
    "choices_sm90_h100.json", "calibration_h100.json", "calibration_sm90_h100.json"))
RESULTS = ROOT / "bench" / "results"

SEED = 20261124
DTYPES = ("float16", "bfloat16", "int8", "float32_3xtf32")
LAYOUTS = ("NN", "NT", "TN", "TT")
#: cost bounds (see "how"): m*n*k keeps one call under ~1 s even at SGEMM speed on a slow GPU,
#: and no operand over 2^28 elements (0.5 GB at 16 bits) keeps all contenders' buffers in memory
MAX_MNK = 2**37
MAX_OPERAND = 2**28

#: entries per class and dtype: 24 per class, mostly 16-bit; int8 skips 'batched' (torch._int_mm,
#: the int8 yardstick, is 2-D only) and is rare in 'odd' (no cuBLAS int8 yardstick there)
COUNTS = {
    "general":      {"float16": 8, "bfloat16": 8, "int8": 5, "float32_3xtf32": 3},
    "decode":       {"float16": 8, "bfloat16": 8, "int8": 5, "float32_3xtf32": 3},
    "longk":        {"float16": 9, "bfloat16": 8, "int8": 4, "float32_3xtf32": 3},
    "odd":          {"float16": 10, "bfloat16": 9, "int8": 2, "float32_3xtf32": 3},
    "batched":      {"float16": 11, "bfloat16": 10, "int8": 0, "float32_3xtf32": 3},
    "small_square": {"float16": 8, "bfloat16": 8, "int8": 5, "float32_3xtf32": 3},
    "large_square": {"float16": 8, "bfloat16": 8, "int8": 5, "float32_3xtf32": 3},
}
CLASSES = tuple(COUNTS)

HOW = (
    "Drawn by bench/corpus.py with numpy.random.default_rng([seed, class index]) per class; "
    "logU(a, b) = round(2**U(log2 a, log2 b)). "
    "general: m, n, k = logU(16, 16384) each, rejecting m*n*k > 2**37 or any operand (m*k, k*n, "
    "m*n) > 2**28 elements. "
    "decode: m = logU(1, 128), n, k = logU(1024, 16384), n*k >= 8*m. "
    "longk: m, n = logU(16, 2048) with m*n <= 1e6, k = logU(16384, 65536). "
    "odd: m, n, k = logU(17, 9000) made odd (x | 1), half of them moved up to the next prime, "
    "so no dimension is a multiple of 8 and no leading dimension 16-byte aligned; m*n*k <= "
    "2**37. "
    "batched: batch = logU(4, 64), m, n, k = logU(16, 1024); 3-D operands, packed strided batch. "
    "small_square: m = n = k = logU(64, 1024). "
    "large_square: m = n = k = s = logU(2048, 8192); half are tails, one of m, n, k = s +- an "
    "odd offset in 1..63. "
    "int8 entries (torch._int_mm, the int8 yardstick, needs m > 16 and k, n multiples of 8): "
    "outside 'odd' k and n are rounded to a multiple of 8 (at least 16), m > 16 (decode: m = "
    "logU(17, 128); tails offset m only); in 'odd' they keep odd sizes and have no yardstick. "
    "Layouts: int8 entries cycle NN, NT, TN, TT; the others draw one uniformly. "
    "Held out: a draw whose (m, n, k) or (n, m, k) occurs in the planner's shipped tables "
    "(pyblasgemm/planner/choices_sm90_h100.json, calibration_h100.json, "
    "calibration_sm90_h100.json), in the bench/results files they list as sources, in "
    "pyblasgemm.benchmarks.suite.SUITES or in bench/heldout_shapes_2026-11-24.json, or that "
    "repeats an earlier entry, is redrawn; such draws are listed under 'redrawn' (and "
    "excluded again when the file is regenerated). Nothing in pyblasgemm was calibrated, "
    "fitted or picked on these shapes.")


# ---------------------------------------------------------------------------------------------
# Shapes the corpus must avoid
# ---------------------------------------------------------------------------------------------

_MNK_TEXT = re.compile(r"^(\d+)x(\d+)x(\d+)$")


def shapes_in_json(doc) -> set:
    """Every (m, n, k) a results / table document names: objects with integer m, n, k, lists of
    three integers under a key 'shape', and strings 'MxNxK' (problem labels)."""
    found = set()

    def walk(x, key=None):
        if isinstance(x, dict):
            if all(type(x.get(c)) is int for c in "mnk"):
                found.add((x["m"], x["n"], x["k"]))
            for k, v in x.items():
                walk(v, k)
        elif isinstance(x, list):
            if key == "shape" and len(x) == 3 and all(type(v) is int for v in x):
                found.add(tuple(x))
            else:
                for v in x:
                    walk(v, key)
        elif isinstance(x, str):
            hit = _MNK_TEXT.match(x)
            if hit:
                found.add(tuple(int(g) for g in hit.groups()))

    walk(doc)
    return found


def _source_files(table: dict) -> list:
    names = list(table.get("sources", [])) + list(table.get("source_sha256", {}))
    return sorted(set(names))


def excluded_shapes(missing: list | None = None) -> dict:
    """{(m, n, k): [where it comes from, ...]} for every shape the corpus must avoid.

    The planner's tables, the bench/results files they were derived from (their 'sources'),
    the benchmark suite's shape lists and the older held-out set. Source files that are not in
    the checkout are appended to ``missing`` (when given)."""
    where: dict = {}

    def add(shapes, label):
        for s in shapes:
            where.setdefault(tuple(int(v) for v in s), []).append(label)

    for path in PLANNER_TABLES:
        table = json.loads(path.read_text())
        add(shapes_in_json(table), path.name)
        for name in _source_files(table):
            src = RESULTS / name
            if src.exists():
                add(shapes_in_json(json.loads(src.read_text())), f"results/{name}")
            elif missing is not None:
                missing.append(name)
    from pyblasgemm.benchmarks.suite import SUITES   # NumPy-only import: no GPU needed
    for name, problems in SUITES.items():
        add(((p.m, p.n, p.k) for p in problems), f"suite:{name}")
    old = json.loads(OLD_HELDOUT.read_text())
    add((s for shapes in old["shapes"].values() for s in shapes), OLD_HELDOUT.name)
    return where


def _both_ways(shapes) -> set:
    """The shapes and their transposed problems ((m, n, k) and (n, m, k): one GEMM to BLAS)."""
    out = set()
    for m, n, k in shapes:
        out.add((m, n, k))
        out.add((n, m, k))
    return out


# ---------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------

def _logu(rng, lo, hi) -> int:
    return int(round(2 ** rng.uniform(math.log2(lo), math.log2(hi))))


def _is_prime(x: int) -> bool:
    if x < 2 or x % 2 == 0:
        return x == 2
    f = 3
    while f * f <= x:
        if x % f == 0:
            return False
        f += 2
    return True


def _odd_or_prime(rng, lo, hi) -> int:
    x = _logu(rng, lo, hi) | 1
    if rng.random() < 0.5:
        while not _is_prime(x):
            x += 2
    return x


def _mult8(x: int) -> int:
    return max(16, 8 * round(x / 8))


def _draw(cls: str, dtype: str, rng):
    """(m, n, k, batch) of one draw of ``cls``, or None when the draw breaks the class's rules
    (the caller draws again)."""
    int8 = dtype == "int8"
    batch = 1
    if cls == "general":
        m, n, k = (_logu(rng, 16, 16384) for _ in range(3))
        if int8:
            n, k = _mult8(n), _mult8(k)
            if m <= 16:
                return None
        if m * n * k > MAX_MNK or max(m * k, k * n, m * n) > MAX_OPERAND:
            return None
    elif cls == "decode":
        m = _logu(rng, 17, 128) if int8 else _logu(rng, 1, 128)
        n, k = _logu(rng, 1024, 16384), _logu(rng, 1024, 16384)
        if int8:
            n, k = _mult8(n), _mult8(k)
        if n * k < 8 * m:
            return None
    elif cls == "longk":
        m, n = _logu(rng, 16, 2048), _logu(rng, 16, 2048)
        k = _logu(rng, 16384, 65536)
        if int8:
            n, k = _mult8(n), _mult8(k)
            if m <= 16:
                return None
        if m * n > 1_000_000:
            return None
    elif cls == "odd":
        m, n, k = (_odd_or_prime(rng, 17, 9000) for _ in range(3))
        if m * n * k > MAX_MNK:
            return None
    elif cls == "batched":
        batch = _logu(rng, 4, 64)
        m, n, k = (_logu(rng, 16, 1024) for _ in range(3))
    elif cls == "small_square":
        s = _logu(rng, 64, 1024)
        m = n = k = _mult8(s) if int8 else s
    elif cls == "large_square":
        s = _logu(rng, 2048, 8192)
        if int8:
            s = _mult8(s)
        dims = [s, s, s]
        if rng.random() < 0.5:                       # a tail: one dimension just off the square
            offset = int(rng.integers(0, 32)) * 2 + 1
            sign = 1 if rng.random() < 0.5 else -1
            which = 0 if int8 else int(rng.integers(0, 3))
            dims[which] = s + sign * offset
        m, n, k = dims
    else:
        raise ValueError(f"unknown class {cls!r}")
    return m, n, k, batch


def generate(exclude=(), seed: int = SEED) -> dict:
    """The corpus document (see the module docstring), avoiding ``exclude`` ((m, n, k) in
    either orientation). Deterministic in ``seed`` and ``exclude``."""
    banned = _both_ways(exclude)
    taken: set = set()
    entries, redrawn = [], []
    int8_count = 0
    for ci, cls in enumerate(CLASSES):
        rng = np.random.default_rng([seed, ci])
        slots = [d for d in DTYPES for _ in range(COUNTS[cls][d])]
        slots = [slots[i] for i in rng.permutation(len(slots))]  # dtypes not in draw order
        for i, dtype in enumerate(slots):
            for _ in range(10_000):
                shape = _draw(cls, dtype, rng)
                if shape is None:
                    continue
                mnk = shape[:3]
                if mnk in banned or mnk in taken:
                    redrawn.append({"class": cls, "m": mnk[0], "n": mnk[1], "k": mnk[2],
                                    "why": "excluded" if mnk in banned else "duplicate"})
                    continue
                break
            else:       # pragma: no cover - the classes' rules reject far less than this
                raise RuntimeError(f"{cls}: no acceptable draw in 10000 tries")
            if dtype == "int8":
                layout = LAYOUTS[int8_count % 4]
                int8_count += 1
            else:
                layout = LAYOUTS[int(rng.integers(0, 4))]
            m, n, k, batch = shape
            taken |= _both_ways([mnk])
            entries.append({"id": f"{cls}-{i:02d}", "class": cls, "m": m, "n": n, "k": k,
                            "batch": batch, "dtype": dtype, "transa": layout[0],
                            "transb": layout[1]})
    return {"name": CORPUS.stem, "seed": SEED, "how": HOW, "layout_meaning":
            "numpy matmul: transa 'T' means A = A_store.T with A_store C-contiguous (k, m) "
            "(batch, k, m) for batch > 1; likewise B", "redrawn": redrawn,
            "counts": counts(entries), "entries": entries}


def counts(entries) -> dict:
    """{'class': {...}, 'dtype': {...}, 'int8_layouts': {...}} entry counts."""
    out = {"class": {}, "dtype": {}, "int8_layouts": {}}
    for e in entries:
        out["class"][e["class"]] = out["class"].get(e["class"], 0) + 1
        out["dtype"][e["dtype"]] = out["dtype"].get(e["dtype"], 0) + 1
        if e["dtype"] == "int8":
            lay = e["transa"] + e["transb"]
            out["int8_layouts"][lay] = out["int8_layouts"].get(lay, 0) + 1
    return out


def dumps(doc: dict) -> str:
    """The file's text: indented, one entry (or redrawn shape) per line, for readable diffs."""
    lines = ["{"]
    items = list(doc.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key in ("entries", "redrawn"):
            rows = [f"  {json.dumps(e)}" for e in value]
            body = ",\n".join(rows)
            lines.append(f" {json.dumps(key)}: [\n{body}\n ]{comma}" if rows
                         else f" {json.dumps(key)}: []{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def load(path=CORPUS) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def regenerate(committed: dict | None = None) -> dict:
    """The corpus drawn anew against today's excluded shapes plus the committed file's redrawn
    collisions (so a table dropping a shape does not change the draw)."""
    extra = [(r["m"], r["n"], r["k"]) for r in (committed or {}).get("redrawn", [])
             if r["why"] == "excluded"]
    return generate(set(excluded_shapes()) | set(extra))


def check(path=CORPUS) -> list:
    """Problems with the committed corpus: [] when it equals its regeneration and is disjoint
    from the excluded shapes; else one line per problem."""
    path = pathlib.Path(path)
    if not path.exists():
        return [f"{path} is missing: run python -m bench.corpus"]
    committed_text = path.read_text()
    committed = json.loads(committed_text)
    problems = []
    fresh = regenerate(committed)
    if dumps(fresh) != committed_text:
        old, new = committed.get("entries", []), fresh["entries"]
        diff = [f"{a.get('id')}: committed {a} != regenerated {b}"
                for a, b in zip(old, new) if a != b]
        if len(old) != len(new):
            diff.append(f"{len(old)} committed entries, {len(new)} regenerated")
        problems.append("the committed corpus differs from its regeneration"
                        + (": " + "; ".join(diff[:5]) if diff else " (header or format)"))
    for shape, where in overlaps(excluded_shapes(), committed["entries"]).items():
        problems.append(f"corpus shape {shape} occurs in {', '.join(sorted(set(where)))}")
    return problems


def overlaps(shapes, entries=None) -> dict:
    """{corpus (m, n, k): [where]} for corpus entries whose (m, n, k) or (n, m, k) is in
    ``shapes`` (a set of triples, or a {triple: [where]} dict as :func:`excluded_shapes`)."""
    entries = load()["entries"] if entries is None else entries
    where = shapes if isinstance(shapes, dict) else {tuple(s): ["given"] for s in shapes}
    out = {}
    for e in entries:
        mnk = (e["m"], e["n"], e["k"])
        for key in {mnk, (mnk[1], mnk[0], mnk[2])}:
            if key in where:
                out.setdefault(mnk, []).extend(where[key])
    return out


def is_disjoint_from(shapes, entries=None) -> bool:
    """True when no corpus (m, n, k) (in either orientation) is in ``shapes``."""
    return not overlaps(shapes, entries)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate in memory and compare with the committed file")
    ap.add_argument("--overlaps", action="store_true",
                    help="list corpus shapes found in the planner's data and the suite")
    ap.add_argument("--out", default=str(CORPUS), help="where to write (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.check:
        problems = check(args.out)
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print(f"{args.out}: equals its regeneration; disjoint from the excluded shapes")
        return 1 if problems else 0
    if args.overlaps:
        doc = load(args.out)
        found = overlaps(excluded_shapes(), doc["entries"])
        for shape, where in found.items():
            print(f"{shape}: {', '.join(sorted(set(where)))}")
        old = {tuple(s) for v in load(OLD_HELDOUT)["shapes"].values() for s in v}
        print(f"{len(found)} corpus shapes overlap excluded data; "
              f"{len(doc['redrawn'])} draws were redrawn; older held-out set: "
              f"{len(overlaps(old, doc['entries']))} overlaps")
        return 0
    missing: list = []
    excluded = excluded_shapes(missing)
    if missing:
        print(f"warning: source files not found: {', '.join(missing)}", file=sys.stderr)
    doc = generate(set(excluded))
    pathlib.Path(args.out).write_text(dumps(doc))
    c = doc["counts"]
    print(f"wrote {args.out}: {len(doc['entries'])} entries; classes {c['class']}; "
          f"dtypes {c['dtype']}; int8 layouts {c['int8_layouts']}; "
          f"{len(doc['redrawn'])} redrawn ({len(excluded)} excluded shapes)")
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):       # python bench/corpus.py: make `bench` importable
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
