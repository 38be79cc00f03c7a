"""The Ozaki scheme II's GPU passes (``ozaki/ozaki.cuh``): their constant tables, compile
(online through the kernel cache, offline for CI) and launches. The int8 GEMMs between them are ordinary
planned GEMMs (:mod:`pyblasgemm.composite`).

Each moduli count and element type (``'double'``: float64 / complex128; ``'float'``: float32 /
complex64, read and written as such) is one compile: its tables, generated from
:mod:`pyblasgemm.ozaki` (the one list of moduli and its CRT constants), are prepended to the
header: the moduli, Barrett magics and the reconstruction's constants
(:func:`pyblasgemm.ozaki.crt_tables`).

Nothing here imports CuPy or compiles at import time.

>>> tables = table_values(16)
>>> tables["kOzMod"][:3], tables["kOzMagic"][0], tables["kOzChunks"], len(tables["kOzCrtM"][0])
([256, 255, 253], 1073741824, 4, 4)
"""
from __future__ import annotations

import threading
from typing import NamedTuple

__all__ = ["HEADER", "DIGIT", "DIGIT_WORDS", "digit_table", "digits_host", "BLOCK_STATS", "ELEMENTS", "RECONSTRUCT_KERNELS", "ROWS_DEFAULT", "RESIDUE_KERNELS",
           "RESIDUES_DEFAULT", "element_of", "table_values", "tables_source", "kernel_names", "compile_offline",
           "get_kernels", "rows_kernel_applies", "residues_kernel_applies", "residues_kernel_for", "OzakiPasses",
           "ONE_PASS_CLUSTERS", "OnePassShape", "one_pass_width", "one_pass_unit", "one_pass_shape", "one_pass_shapes",
           "one_pass_smem", "one_pass_name", "one_pass_names"]

HEADER = "pyblasgemm/ozaki/ozaki.cuh"
#: the reconstruction kernels' plane type for the digit planes of the Hopper int8 kernel's digit
#: store (``jit.EPI_RESIDUE``); ``int`` for the int32 products
DIGIT = "unsigned char"
#: the line-statistics kernel's block: 32 lines x 32 walkers
BLOCK_STATS = (32, 32, 1)
#: the residue kernel's block: a 32 x 32 tile, 8 rows of threads
BLOCK_RESIDUES = (32, 8, 1)
#: the element reconstruction kernel's block: 256 rows of one column
BLOCK_RECONSTRUCT = 256
#: the row reconstruction kernel's block: 128 threads of 4 rows each, 512 rows of one column
BLOCK_RECONSTRUCT_ROWS = 128
#: rows per thread of the row kernel: one int4 (16 bytes) of each int32 plane
ROWS_PER_THREAD = 4
#: the digit planes' staged row kernel (``ozaki_reconstruct_digits16``): 16 rows a thread (one
#: 16-byte copy of each plane's digits), blocks of 64 (the stage within 48 KB at 34 moduli)
DIGIT_ROWS_PER_THREAD = 16
BLOCK_RECONSTRUCT_DIGITS = 64
#: the reconstruction kernels: the row kernel with its planes staged through shared memory by
#: cp.async, the row kernel loading into registers, the element kernel (any m, any alignment)
RECONSTRUCT_KERNELS = ("rows-staged", "rows", "elements")
#: the row kernel :meth:`OzakiPasses.reconstruct` picks where :func:`rows_kernel_applies`
ROWS_DEFAULT = "rows-staged"
#: the residue kernels: tiles walked by a persistent grid, 16 or 8 positions a thread written
#: as one 16- or 8-byte store per plane, the next tile's loads in flight
#: (``ozaki_residues_pipe``), and the 4-byte word kernel (any length)
RESIDUE_KERNELS = ("tile16-pipe", "tile8-pipe", "words")
#: positions a thread of the tile kernels takes, per kernel name
RESIDUE_TILE_WIDTHS = {"tile16-pipe": 16, "tile8-pipe": 8}
#: blocks of the tile kernels resident on one SM (their launch bounds; the persistent grid's
#: size is this times the SMs)
RESIDUE_TILE_BLOCKS_PER_SM = {16: 2, 8: 3}
#: the residue kernel :meth:`OzakiPasses.residues` picks where :func:`residues_kernel_applies`:
#: the fastest pass on an H200 (bench/results/ozaki_passes_h200_2026-11-28_8f9dd54.json, A and B
#: at 8192^2, 16 moduli + guard: 1.07 ms, 3.13 TB/s; tile8-pipe 1.17, words 2.03; at 4096^2
#: 0.294 ms against 0.302 and 0.526; the one-tile-a-block kernels measured there, 1.16 and
#: 1.21 ms, are gone)
RESIDUES_DEFAULT = "tile16-pipe"
#: the residue tile kernels' block (both widths): 256 threads, a tile of 128 positions
BLOCK_RESIDUES_TILE = 256
#: positions a tile of ``ozaki_residues_pipe`` covers
RESIDUE_TILE_POSITIONS = 128
#: scaling and residues in one pass (``ozaki_scale_residues``, #34 item 1b): lines a CTA holds
#: (a line group), its threads, and the unit of a CTA's part of a line (positions)
ONE_PASS_LINES = 8
BLOCK_ONE_PASS = 256
ONE_PASS_CHUNK_UNIT = 128
#: the cluster sizes of the one-pass kernel (Hopper's portable sizes; 1: no cluster, any GPU)
ONE_PASS_CLUSTERS = (1, 2, 4, 8)
#: the widest cluster :func:`one_pass_shape` gives strided lines (H200, 8192^3: clusters of 8
#: measured 0.97x the two passes, of 4 at 4096^3 1.06x)
ONE_PASS_STRIDED_CLUSTER = 4
#: shared memory a CTA uses besides the line group (its statistics; the driver's 1 KB a block)
_ONE_PASS_STATIC = 2048
#: grid dimension y's limit (the residue and reconstruction kernels walk past it)
_MAX_GRID_Y = 65535
#: the C++ element type of the operands' and C's real parts, per NumPy dtype kind and size
ELEMENTS = {"f8": "double", "c16": "double", "f4": "float", "c8": "float"}


def element_of(dtype) -> str:
    """The kernels' element type of an operand or C dtype.

    >>> element_of("complex64"), element_of("float64")
    ('float', 'double')
    """
    import numpy as np

    d = np.dtype(dtype)
    return ELEMENTS[f"{d.kind}{d.itemsize}"]


def table_values(count: int) -> dict:
    """The constant tables of one moduli count, as Python values (what :func:`tables_source`
    writes): the moduli, their Barrett magics ``ceil(2^38 / p)`` (exact quotients below
    2^30), ``2^16``, ``2^32``, ``2^48`` mod each, :func:`pyblasgemm.ozaki.crt_tables`, and
    for the row kernel's one-step digit ``(x y) mod p`` (``crt_digit``) ``(2^16 y) mod p`` and
    ``(-2^31 y) mod p`` of each CRT multiplier ``y``.

    >>> t = table_values(3)
    >>> t["kOzCrtY"], t["kOzCrtY16"], t["kOzCrtYNeg31"]
    ([171, 127, 211], [0, 127, 128], [0, 64, 183])
    """
    from ..ozaki import MODULI, crt_chunks, crt_tables

    mods = list(MODULI[:count])
    t = crt_tables(count)
    return {"kOzMod": mods, "kOzMagic": [-(-2**38 // p) for p in mods],
            "kOzPow16": [2**16 % p for p in mods], "kOzPow32": [2**32 % p for p in mods],
            "kOzPow48": [2**48 % p for p in mods], "kOzPow28d": [float(2**28 % p) for p in mods],
            "kOzInvMod": [1.0 / p for p in mods], "kOzChunks": crt_chunks(count),
            "kOzCrtY": t["y"], "kOzCrtY16": [(y << 16) % p for y, p in zip(t["y"], mods)],
            "kOzCrtYNeg31": [(-y << 31) % p for y, p in zip(t["y"], mods)],
            "kOzCrtM": [list(c) for c in t["m"]], "kOzCrtP": list(t["p"]), "kOzCrtInvP": t["inv_p"]}


#: u32 words per modulus in :func:`digit_table` (the kernel's kResidueWords: two 16-byte loads)
DIGIT_WORDS = 8


def digit_table(count: int):
    """The Hopper int8 kernel's digit store table (``jit.EPI_RESIDUE``; its ``bias=`` pointer)
    for ``count`` moduli: per modulus ``p``, the Barrett magic ``ceil(2^38 / p)``,
    ``(2^16 y) mod p``, ``y mod p`` and ``(-2^31 y) mod p`` of its CRT multiplier ``y``, then
    zeros (:data:`DIGIT_WORDS` uint32 a row: the reconstruction's one-step digit
    ``crt_digit``, with the constants read per batch entry instead of compiled in).

    >>> t = digit_table(3)
    >>> t.shape, t.dtype.name, t[1].tolist()
    ((3, 8), 'uint32', [255, 1077952577, 127, 127, 64, 0, 0, 0])
    """
    import numpy as np

    v = table_values(count)
    cols = [v["kOzMod"], v["kOzMagic"], v["kOzCrtY16"], v["kOzCrtY"], v["kOzCrtYNeg31"]]
    table = np.zeros((count, DIGIT_WORDS), np.uint32)
    table[:, :len(cols)] = np.array(cols, dtype=np.uint64).T
    return table


def digits_host(x, count: int):
    """The digit store's arithmetic on the host, step for step (``residue_digit`` in
    ``epilogue/sm80_smem_epilogue.cuh``): ``(x y_l) mod p_l`` of int32 products ``x`` for
    modulus ``l`` of each plane, uint8 (``x``: int32 planes, ``count`` of them; the tests
    compare it with Python's exact ``%``).

    >>> import numpy as np
    >>> d = digits_host(np.array([[-2**31, -1, 0, 2**31 - 1]] * 3, np.int32), 3)
    >>> t = table_values(3)
    >>> exact = [[(x * y) % p for x in (-2**31, -1, 0, 2**31 - 1)] for y, p in zip(t["kOzCrtY"], t["kOzMod"])]
    >>> d.tolist() == exact
    True
    """
    import numpy as np

    x = np.asarray(x, np.int32)
    if x.shape[0] != count:
        raise ValueError(f"x has {x.shape[0]} planes; the table {count} moduli")
    table = digit_table(count).astype(np.uint64)
    shape = (count,) + (1,) * (x.ndim - 1)
    p, magic, y16, y, yneg31 = (table[:, i].reshape(shape) for i in range(5))
    w = np.uint64
    u = x.astype(np.uint32).astype(w)                          # the int32's bits, as the device's u32
    h = (u >> w(16)) ^ w(0x8000)
    s = h * y16 + (u & w(0xffff)) * y + yneg31                 # < 2^25
    q = (s * magic) >> w(38)                                   # (s * magic < 2^57: exact in uint64)
    return (s - q * p).astype(np.uint8)


def tables_source(count: int) -> str:
    """The tables of one moduli count as CUDA constants (prepended to the header); doubles in
    Python's shortest round-trip form, which the compiler reads back to the same value."""
    t = table_values(count)
    n, nch = count, t["kOzChunks"]

    def body(x):
        if isinstance(x, (list, tuple)):
            return "{" + ", ".join(body(v) for v in x) + "}"
        return repr(x)

    def decl(name, ctype, dims):
        return f"__constant__ {ctype} {name}{''.join(f'[{d}]' for d in dims)} = {body(t[name])};\n"

    from ..ozaki import GUARD_HI_BITS, GUARD_SUM_BITS

    return (f"// generated by pyblasgemm.kernels.ozaki_kernels.tables_source({count}) from pyblasgemm.ozaki\n"
            "#define PBG_OZAKI_TABLES 1\n"
            f"constexpr int kOzChunks = {nch};\n"
            f"constexpr int kOzGuardHiBits = {GUARD_HI_BITS};\n"
            f"constexpr int kOzGuardSumBits = {GUARD_SUM_BITS};\n"
            + decl("kOzMod", "int", [n]) + decl("kOzMagic", "unsigned", [n])
            + "".join(decl(f"kOzPow{w}", "unsigned", [n]) for w in (16, 32, 48))
            + decl("kOzPow28d", "double", [n]) + decl("kOzInvMod", "double", [n])
            + decl("kOzCrtY", "unsigned", [n]) + decl("kOzCrtY16", "unsigned", [n])
            + decl("kOzCrtYNeg31", "unsigned", [n]) + decl("kOzCrtM", "double", [n, nch])
            + decl("kOzCrtP", "double", [nch]) + decl("kOzCrtInvP", "double", []))


def kernel_names(count: int, element: str = "double") -> list[str]:
    """The name expressions one moduli count and element type need: stats, scale, the guard's
    count, residues, both reconstructions (compiled together on first use; the one-pass kernels,
    :func:`one_pass_names`, one by one as a plan asks for them).

    >>> kernel_names(16)[3:6]
    ['ozaki_residues<16, double>', 'ozaki_reconstruct<16, false, double, int>', 'ozaki_reconstruct<16, true, double, int>']
    >>> kernel_names(16)[6:8]
    ['ozaki_reconstruct_rows<16, false, double, false, int>', 'ozaki_reconstruct_rows<16, true, double, false, int>']
    >>> kernel_names(9, "float")[0]
    'ozaki_line_stats<float>'
    >>> kernel_names(16)[10:12]
    ['ozaki_residues_pipe<16, double, 16>', 'ozaki_residues_pipe<16, double, 8>']
    >>> kernel_names(16)[-3:-1]               # the digit planes of the Hopper kernel's digit store
    ['ozaki_reconstruct_rows<16, true, double, false, unsigned char>', 'ozaki_reconstruct_digits16<16, false, double>']
    """
    if element not in ELEMENTS.values():
        raise ValueError(f"element={element!r}: one of 'double', 'float'")
    return [f"ozaki_line_stats<{element}>", "ozaki_line_scale", "ozaki_guard_count",
            f"ozaki_residues<{count}, {element}>", f"ozaki_reconstruct<{count}, false, {element}, int>",
            f"ozaki_reconstruct<{count}, true, {element}, int>"] + [
            f"ozaki_reconstruct_rows<{count}, {cplx}, {element}, {stage}, int>"
            for stage in ("false", "true") for cplx in ("false", "true")] + [
            f"ozaki_residues_pipe<{count}, {element}, {v}>" for v in (16, 8)] + [
            f"ozaki_reconstruct{rows}<{count}, {cplx}, {element}{', false' if rows else ''}, {DIGIT}>"
            for rows in ("", "_rows") for cplx in ("false", "true")] + [
            f"ozaki_reconstruct_digits16<{count}, {cplx}, {element}>" for cplx in ("false", "true")]


def one_pass_names(count: int, element: str, arch: str) -> list[str]:
    """Every one-pass kernel (:func:`one_pass_name`) ``arch`` runs: a line or a group of 8 a
    CTA, each with every cluster size on Hopper (what :func:`compile_offline` checks).

    >>> one_pass_names(16, "double", "sm_90")[-1], len(one_pass_names(16, "double", "sm_80"))
    ('ozaki_scale_residues_cluster<16, double, 16, 8, 8>', 2)
    """
    return [one_pass_name(count, element, arch, lines, q) for lines in (1, ONE_PASS_LINES)
            for q in ONE_PASS_CLUSTERS if q == 1 or _cc(arch) >= 90]


def rows_kernel_applies(prod, m: int, kernel: str = "rows") -> bool:
    """Whether the row reconstruction kernel ``kernel`` can read the planes ``prod``: it loads
    rows 4t .. 4t + 3 of a column as one 16-byte int4 (int32 planes) or 4-byte word (digit
    planes), or, the digit planes' ``'rows-staged'`` (``ozaki_reconstruct_digits16``), rows
    16t .. 16t + 15 as one 16-byte copy. Column j of plane l starts ``(l * m * n_prod + j * m)``
    elements after the planes' first, so every load is aligned when m is a multiple of those
    rows and ``prod`` itself is 16-byte aligned (CuPy's allocations are 256-byte aligned; a
    view may not be). Otherwise :meth:`OzakiPasses.reconstruct` launches another kernel: the
    same bits.

    Example (on a GPU)::

        prod = cupy.empty((16, n, m), cupy.int32)
        rows_kernel_applies(prod, m)            # True when m % 4 == 0
    """
    digits16 = prod.dtype.itemsize == 1 and kernel == "rows-staged"
    return m % (DIGIT_ROWS_PER_THREAD if digits16 else ROWS_PER_THREAD) == 0 and prod.data.ptr % 16 == 0


def residues_kernel_applies(out, length: int, kernel: str = RESIDUES_DEFAULT) -> bool:
    """Whether the residue tile kernel ``kernel`` (``'tile16-pipe'`` or ``'tile8-pipe'``) can write the
    planes ``out`` (int8, planes x lines x ``length``, C order; ``length``: the planes' row, at
    least the operand's): each thread stores 16 (8) consecutive bytes of a line as one store,
    which must be aligned, so ``length`` must be a multiple of 16 (8) and ``out`` 16-byte
    aligned (CuPy's allocations are 256-byte aligned).
    Otherwise :meth:`OzakiPasses.residues` launches the word kernel: the same bytes.

    Example (on a GPU)::

        out = cupy.empty((17, m, k), cupy.int8)
        residues_kernel_applies(out, k)          # True when k % 16 == 0
    """
    width = RESIDUE_TILE_WIDTHS[kernel]
    return length % width == 0 and out.data.ptr % 16 == 0


def residues_kernel_for(out, length: int) -> str:
    """The residue kernel :meth:`OzakiPasses.residues` picks for the planes ``out`` of lines of
    ``length``: :data:`RESIDUES_DEFAULT` where it applies, else the first that applies of the
    tiles of 16 and of 8 positions a thread, and the word kernel (any length).

    Example (on a GPU)::

        residues_kernel_for(cupy.empty((17, 64, 24), cupy.int8), 24)      # 'tile8-pipe'
    """
    order = (RESIDUES_DEFAULT, "tile16-pipe", "tile8-pipe", "words")
    return next(k for k in order[:order.index("words") + 1]
                if k == "words" or residues_kernel_applies(out, length, k))


def one_pass_width(arch) -> int:
    """Positions a thread of the one-pass kernel takes (``V``) on ``arch`` (a target such as
    ``'sm_90a'`` or a ``planner.arch.ArchSpec``): 16 on Hopper, where its 2 x 16 doubles fit the
    128 registers of two CTAs an SM without a spill; 8 before (sm_80's ptxas spilled 20 bytes
    at 16).

    >>> one_pass_width("sm_90a"), one_pass_width("sm_80")
    (16, 8)
    """
    return 16 if _cc(arch) >= 90 else 8


def _cc(arch) -> int:
    """The compute capability as one number (90) of a target name or an ``ArchSpec``."""
    if isinstance(arch, str):
        return int(arch.split("_")[1].rstrip("a"))
    return 10 * arch.cc[0] + arch.cc[1]


class OnePassShape(NamedTuple):
    """How ``ozaki_scale_residues`` holds its lines on chip: ``lines`` a CTA (1: a line
    contiguous in memory; :data:`ONE_PASS_LINES`: strided lines, whose neighbours make 64
    contiguous bytes a position), CTAs a ``cluster`` (Hopper), ``chunk`` positions a CTA."""

    lines: int
    cluster: int
    chunk: int


def one_pass_name(count: int, element: str, arch: str, lines: int = ONE_PASS_LINES, cluster: int = 1) -> str:
    """The name expression of the one-pass kernel for ``lines`` a CTA and ``cluster`` CTAs a
    line group.

    >>> one_pass_name(16, "double", "sm_90", 8, 8)
    'ozaki_scale_residues_cluster<16, double, 16, 8, 8>'
    >>> one_pass_name(16, "float", "sm_80", 1)
    'ozaki_scale_residues<16, float, 8, 1>'
    """
    v = one_pass_width(arch)
    if cluster == 1:
        return f"ozaki_scale_residues<{count}, {element}, {v}, {lines}>"
    return f"ozaki_scale_residues_cluster<{count}, {element}, {v}, {lines}, {cluster}>"


def one_pass_unit(lines: int, arch) -> int:
    """The positions a CTA's part of a line is a multiple of on ``arch`` (as for
    :func:`one_pass_width`): every warp then walks its V-groups in step (its shuffles take all
    32 lanes): 128 for a group of 8 lines (8 lanes a line), 32 V for one line.

    >>> one_pass_unit(8, "sm_90"), one_pass_unit(1, "sm_90"), one_pass_unit(1, "sm_80")
    (128, 512, 256)
    """
    return ONE_PASS_CHUNK_UNIT if lines == ONE_PASS_LINES else 32 * one_pass_width(arch)


def one_pass_smem(chunk: int, itemsize: int, lines: int = ONE_PASS_LINES) -> int:
    """Dynamic shared memory of a one-pass CTA holding ``chunk`` positions of its ``lines``
    lines: two pads per 16 positions and one a line (``ozaki_scale_residues``'s layout).

    >>> one_pass_smem(1024, 8), one_pass_smem(8192, 8, 1)
    (73792, 73736)
    """
    return lines * (chunk + chunk // 8 + 1) * itemsize


def one_pass_shape(lines: int, row: int, itemsize: int, arch, contiguous: bool = False) -> OnePassShape | None:
    """The :class:`OnePassShape` of ``lines`` lines written as planes of ``row`` positions
    (``itemsize``: the operand's real type, 8 or 4; ``contiguous``: each line contiguous in
    memory) on ``arch`` (a ``planner.arch.ArchSpec``), or None where a line does not fit on chip
    (the two passes run then: ``ozaki_line_stats`` / ``ozaki_line_scale``, then the residues).

    A contiguous line takes a CTA of its own; strided lines go 8 to a CTA. A cluster of
    ``cluster`` CTAs holds whole lines, each CTA ``chunk`` positions (a multiple of
    :func:`one_pass_unit`): the first cluster size whose CTA fits two to an SM (its 128
    registers a thread allow two), clusters only on Hopper and later, and for strided lines at
    most :data:`ONE_PASS_STRIDED_CLUSTER`. Where the CTAs would leave SMs idle (few lines),
    clusters twice as large while a CTA keeps two units (and every CTA some).

    Per operand against the two passes (H200, float64, the default scaling; the two passes'
    time halved; bench/results/ozaki_one_pass_h200_2026-11-29_4528870.json): contiguous lines
    1.06x at 4096 (a CTA a line), 1.06x at 8192 (a CTA a line), 1.05x at 16384 (clusters of
    2); strided lines 1.06x at 4096 (clusters of 4), 0.97x at 8192 (clusters of 8), 0.77x at
    16384 (8, one CTA an SM). A CTA alone on its SM waits for its copies with nothing to
    overlap them (a line of 16384 in one CTA: 0.84x), and the wider the cluster the longer its
    CTAs wait for the slowest one's statistics.

    >>> from pyblasgemm.planner import FAMILIES
    >>> h = FAMILIES["sm_90"]
    >>> one_pass_shape(8192, 8192, 8, h), tuple(one_pass_shape(8192, 8192, 8, h, contiguous=True))
    (None, (1, 1, 8192))
    >>> tuple(one_pass_shape(4096, 4096, 8, h)), tuple(one_pass_shape(8192, 16384, 8, h, contiguous=True))
    ((8, 4, 1024), (1, 2, 8192))
    >>> one_pass_shape(8192, 8192, 8, FAMILIES["sm_80"]), one_pass_shape(8192, 30000, 8, h)
    (None, None)
    >>> tuple(one_pass_shape(16, 8192, 8, h, contiguous=True))    # 16 lines: clusters of 8
    (1, 8, 1024)
    """
    shapes = [s for s in one_pass_shapes(row, itemsize, arch, contiguous)
              if 2 * (one_pass_smem(s.chunk, itemsize, s.lines) + _ONE_PASS_STATIC) <= arch.smem_per_sm
              and (contiguous or s.cluster <= ONE_PASS_STRIDED_CLUSTER)]
    if not shapes:
        return None
    shape = shapes[0]
    ctas = -(-lines // shape.lines)
    unit = one_pass_unit(shape.lines, arch)
    by_cluster = {s.cluster: s for s in shapes}
    while ctas * shape.cluster < arch.sm_count:
        bigger = by_cluster.get(2 * shape.cluster)
        # (a CTA keeps two units, and no CTA of the larger cluster is left without a position)
        if bigger is None or bigger.chunk < 2 * unit or (bigger.cluster - 1) * bigger.chunk >= row:
            break
        shape = bigger
    return shape


def one_pass_shapes(row: int, itemsize: int, arch, contiguous: bool = False) -> list:
    """Every :class:`OnePassShape` ``arch`` runs for lines written as planes of ``row``
    positions: each cluster size with the fewest whole units a CTA, within the opt-in shared
    memory (:func:`one_pass_shape` picks one; the tests and bench/ozaki_one_pass.py run them
    all).

    >>> from pyblasgemm.planner import FAMILIES
    >>> [tuple(s) for s in one_pass_shapes(8192, 8, FAMILIES["sm_90"], contiguous=True)]
    [(1, 1, 8192), (1, 2, 4096), (1, 4, 2048), (1, 8, 1024)]
    """
    per_cta = 1 if contiguous else ONE_PASS_LINES
    unit = one_pass_unit(per_cta, arch)
    limit = arch.smem_per_block_optin - _ONE_PASS_STATIC
    shapes = []
    for q in ONE_PASS_CLUSTERS if tuple(arch.cc) >= (9, 0) else (1,):
        chunk = -(-(-(-row // q)) // unit) * unit
        if one_pass_smem(chunk, itemsize, per_cta) <= limit:
            shapes.append(OnePassShape(per_cta, q, chunk))
    return shapes


def _source(count: int) -> str:
    from .jit import PACKAGE_VERSION, header_fingerprint

    return (f"// pyblasgemm {PACKAGE_VERSION} headers sha256={header_fingerprint()}\n"
            + tables_source(count) + f'#include "{HEADER}"\n')


def compile_offline(count: int, arch: str = "sm_80", element: str = "double", ptx: bool = False,
                    names: list | None = None):
    """Compile one count's kernels without a GPU (:func:`kernel_names` and
    :func:`one_pass_names`; ``names``: only those): ``(cubin, log)`` (``ptx``: the PTX text instead of the cubin); the
    log carries ptxas's resource report (``jit.ptxas_resources`` parses it).

    Example::

        cubin, log = compile_offline(16, "sm_90a")
    """
    from .jit import compile_program

    names = names or kernel_names(count, element) + one_pass_names(count, element, arch)
    binary, log, _ = compile_program(_source(count), "pyblasgemm_ozaki.cu", names, arch, ptx=ptx,
                                     what=f"the Ozaki kernels ({count} moduli, {element})")
    return binary, log


_cache: dict = {}
_lock = threading.Lock()


def get_kernels(count: int, device_id: int | None = None, element: str = "double", names: tuple = ()) -> dict:
    """{name expression: CompiledKernel} for ``count`` moduli and ``element`` on the current (or
    given) device: :func:`kernel_names`, or only ``names`` (a one-pass kernel, as a plan asks
    for it: the eight on Hopper would add seconds to every first call), compiled once per
    (device, headers' fingerprint, count, element, names).

    Example (on a GPU)::

        kernels = get_kernels(16)
        kernels["ozaki_residues<16, double>"]   # the residue pass for 16 moduli
    """
    import cupy

    from . import jit

    dev = cupy.cuda.Device(device_id)
    key = (dev.id, jit.header_fingerprint(), count, element, names)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    kernels = jit.load_kernels(_source(count), list(names) or kernel_names(count, element), dev.id)
    with _lock:
        _cache[key] = kernels
    return kernels


class OzakiPasses:
    """The passes for one moduli count and element type (:data:`ELEMENTS`: the operands' and
    C's real type) on one device: ``scale`` (stats and exponents of the lines of one operand),
    ``residues`` and ``reconstruct``. Arrays are CuPy arrays; a strided operand is given as
    (array holding its first element, lines, len, line stride, position stride), strides in
    elements.

    Example (on a GPU: the rows of a C-ordered m x k float64 array)::

        passes = OzakiPasses(16)
        counts = cupy.zeros(2, cupy.int32)
        exps, lost = passes.scale(a, m, k, k, 1, 55, counts)
        res = cupy.empty((16, m, k), cupy.int8)
        passes.residues(a, m, k, k, 1, exps, res)
        # the 'fast' scaling: each line's exponent and bits from its 2-norm
        exps, lost, bits = passes.scale_fast(a, m, k, k, 1, counts)
    """

    def __init__(self, count: int, device_id: int | None = None, element: str = "double"):
        import cupy

        self.count = count
        self.element = element
        self._k = get_kernels(count, device_id, element)
        self._device = cupy.cuda.Device(device_id).id
        self._sms = _sm_count(self._device)

    def scale(self, x, lines: int, length: int, s_line: int, s_k: int, bits: int, counts):
        """(exponents int32[lines], lost uint8[lines]); ``counts`` (int32[2], zeroed by the
        caller) gains the non-finite and the lost lines."""
        exps, lost, _ = self._scale(x, lines, length, s_line, s_k, bits, counts, False)
        return exps, lost

    def scale_fast(self, x, lines: int, length: int, s_line: int, s_k: int, counts):
        """:meth:`scale` by the 'fast' scaling (:func:`pyblasgemm.ozaki.split_fast`'s exponents,
        bit for bit): (exponents, lost, bits int32[lines]), ``bits`` each line's
        (:func:`pyblasgemm.ozaki.line_bits`: the guard's per-line shifts)."""
        return self._scale(x, lines, length, s_line, s_k, 0, counts, True)

    def _scale(self, x, lines, length, s_line, s_k, bits, counts, fast):
        import cupy

        from ..ozaki import NORM_J_LOW, _norm_bits

        big = cupy.empty(lines, cupy.float64)
        small = cupy.empty(lines, cupy.float64)
        norms = cupy.empty(lines, cupy.uint64) if fast else None
        g = _norm_bits(length)
        k_contig = int(s_k == 1 and s_line != 1)
        grid = (-(-lines // 32), 1, 1)
        self._k[f"ozaki_line_stats<{self.element}>"](grid, BLOCK_STATS, (
            x, _ll(lines), _ll(length), _ll(s_line), _ll(s_k), _i(k_contig), big, small, _i(g), _null(norms)))
        exps = cupy.empty(lines, cupy.int32)
        lost = cupy.empty(lines, cupy.uint8)
        line_bits = cupy.empty(lines, cupy.int32) if fast else None
        table = _thresholds(self.count, length, self._device) if fast else None
        self._k["ozaki_line_scale"]((-(-lines // 256), 1, 1), (256, 1, 1), (
            big, small, _ll(lines), _i(bits), exps, lost, counts, _null(norms), _null(table),
            _i(0 if table is None else table.size), _i(NORM_J_LOW), _i(g), _null(line_bits)))
        return exps, lost, line_bits

    def residues(self, x, lines: int, length: int, s_line: int, s_k: int, exps, out, bits: int = 0,
                 sums=None, kernel: str | None = None, row: int | None = None, line_bits=None):
        """``out`` (int8, planes x lines x row, C order) = the symmetric residues of the lines of
        ``length`` elements, zeros from ``length`` to ``row`` (default ``length``: the moduli's
        GEMM takes planes with whole 16-byte rows, ``planner.composite.PLANE_ROW``, instead of
        packing them); with the guard (``sums``: uint64[lines], zeroed by the caller) also
        plane ``count`` and the line sums of :func:`pyblasgemm.ozaki.guard_planes` for ``bits``,
        or for each line's own (``line_bits``: :meth:`scale_fast`'s).

        ``kernel``: None picks :func:`residues_kernel_for`'s (:data:`RESIDUES_DEFAULT` where
        :func:`residues_kernel_applies`, else a narrower tile, else ``'words'``); one of :data:`RESIDUE_KERNELS`
        forces it (the tests and bench/ozaki_passes.py compare them). All write the same
        bytes. Returns the kernel's name."""
        from ..ozaki import GUARD_HI_BITS, GUARD_SUM_BITS

        if kernel is not None and kernel not in RESIDUE_KERNELS:
            raise ValueError(f"kernel={kernel!r}: None or one of {RESIDUE_KERNELS}")
        row = length if row is None else row
        if row < length:
            raise ValueError(f"row={row}: the planes' rows hold the lines' {length} positions, so row >= {length}")
        if kernel is None:
            kernel = residues_kernel_for(out, row)
        elif kernel != "words" and not residues_kernel_applies(out, row, kernel):
            width = RESIDUE_TILE_WIDTHS[kernel]
            raise ValueError(f"kernel={kernel!r} needs row % {width} == 0 and 16-byte aligned planes, got "
                             f"row={row} and out at {out.data.ptr} (address % 16 = {out.data.ptr % 16})")
        k_contig = int(s_k == 1 and s_line != 1)
        shifts = (_i(max(bits - GUARD_HI_BITS, 0)), _i(max(bits - GUARD_SUM_BITS, 0)))
        if kernel == "words":
            grid = (-(-row // 128), min(-(-lines // 32), _MAX_GRID_Y), 1)
            name, block = f"ozaki_residues<{self.count}, {self.element}>", BLOCK_RESIDUES
        else:
            width = RESIDUE_TILE_WIDTHS[kernel]
            tiles = -(-row // RESIDUE_TILE_POSITIONS) * -(-lines // (2 * width))
            grid = (max(1, min(tiles, self._sms * RESIDUE_TILE_BLOCKS_PER_SM[width])), 1, 1)
            name, block = f"ozaki_residues_pipe<{self.count}, {self.element}, {width}>", (BLOCK_RESIDUES_TILE, 1, 1)
        self._k[name](grid, block, (x, _ll(lines), _ll(length), _ll(row), _ll(s_line), _ll(s_k), _i(k_contig),
                                    exps, out, *shifts, _null(sums), _null(line_bits)))
        return kernel

    def scale_residues(self, x, lines: int, length: int, s_line: int, s_k: int, bits: int, counts, out,
                       shape: OnePassShape, sums=None, row: int | None = None, fast: bool = False):
        """:meth:`scale` (``fast``: :meth:`scale_fast`) and :meth:`residues` in one pass over the
        operand (``ozaki_scale_residues``): the same exponents, lost lines, counts, line bits,
        planes, guard plane and line sums, bit for bit. ``shape``: an :class:`OnePassShape`
        (:func:`one_pass_shape`; the plan carries it); ``row`` must be a multiple of the kernel's
        width (16 on Hopper, 8 before) and ``out`` 16-byte aligned, as for the tile kernels.
        Returns ``(exps, lost, line_bits)`` (``line_bits`` None unless ``fast``).

        Example (on a GPU)::

            counts = cupy.zeros(2, cupy.int32)
            res = cupy.empty((17, m, k), cupy.int8)
            shape = one_pass_shape(m, k, 8, arch_for_device(0), contiguous=True)
            exps, lost, _ = passes.scale_residues(a, m, k, k, 1, 55, counts, res, shape, sums)
        """
        import cupy

        from ..ozaki import GUARD_HI_BITS, GUARD_SUM_BITS, NORM_J_LOW, _norm_bits
        from .jit import device_target

        per_cta, cluster, chunk = shape
        arch = device_target(self._device)
        width = one_pass_width(arch)
        row = length if row is None else row
        if row < length:
            raise ValueError(f"row={row}: the planes' rows hold the lines' {length} positions, so row >= {length}")
        if row % width or out.data.ptr % 16:
            raise ValueError(f"the one-pass kernel needs row % {width} == 0 and 16-byte aligned planes, got "
                             f"row={row} and out at {out.data.ptr} (address % 16 = {out.data.ptr % 16})")
        if per_cta not in (1, ONE_PASS_LINES):
            raise ValueError(f"lines={per_cta}: a CTA holds 1 or {ONE_PASS_LINES} lines")
        if cluster not in ONE_PASS_CLUSTERS or (cluster > 1 and _cc(arch) < 90):
            raise ValueError(f"cluster={cluster}: one of {ONE_PASS_CLUSTERS}, above 1 only on sm_90 or later "
                             f"(this device is {arch})")
        unit = one_pass_unit(per_cta, arch)
        if chunk % unit or cluster * chunk < row:
            raise ValueError(f"chunk={chunk}: a multiple of {unit} with cluster * chunk >= row "
                             f"({cluster} x {chunk} against row={row})")
        smem = one_pass_smem(chunk, x.dtype.itemsize, per_cta)
        optin = _smem_optin(self._device)
        if smem + _ONE_PASS_STATIC > optin:
            raise ValueError(f"chunk={chunk}: {per_cta} line(s) of {chunk} positions take {smem} bytes of "
                             f"shared memory, above this device's {optin - _ONE_PASS_STATIC} for them")
        exps = cupy.empty(lines, cupy.int32)
        lost = cupy.empty(lines, cupy.uint8)
        line_bits = cupy.empty(lines, cupy.int32) if fast else None
        table = _thresholds(self.count, length, self._device) if fast else None
        g = _norm_bits(length)
        k_contig = int(s_k == 1 and s_line != 1)
        name = one_pass_name(self.count, self.element, arch, per_cta, cluster)
        kern = get_kernels(self.count, self._device, self.element, (name,))[name]
        if smem > _smem_allowed.get(kern.ptr, 48 * 1024):       # past 48 KB: the opt-in, once a size
            kern.allow_dynamic_shared_memory(smem)
            _smem_allowed[kern.ptr] = smem
        grid = (-(-lines // per_cta) * cluster, 1, 1)
        kern(grid, (BLOCK_ONE_PASS, 1, 1), (
            x, _ll(lines), _ll(length), _ll(row), _ll(s_line), _ll(s_k), _i(k_contig), _i(chunk), _i(bits),
            exps, lost, counts, _null(table), _i(0 if table is None else table.size), _i(NORM_J_LOW), _i(g),
            _null(line_bits), out, _i(max(bits - GUARD_HI_BITS, 0)), _i(max(bits - GUARD_SUM_BITS, 0)), _null(sums)),
            shared_mem=smem)
        return exps, lost, line_bits

    def guard_count(self, low, m: int, n: int, is_complex: bool, lost_a, lost_b, guard, line_bits=None) -> None:
        """Add to ``guard``'s counter the elements outside the lost lines whose error bound the
        guard cannot prove, from the guard plane's product ``low`` (column-major m x n, 2n
        for complex); ``guard`` and ``line_bits`` as for :meth:`reconstruct`."""
        sum_a, sum_b, c_sum, c_hi, failed = guard
        bits_a, bits_b = line_bits if line_bits is not None else (None, None)
        grid = (-(-m // BLOCK_RECONSTRUCT), min(n, _MAX_GRID_Y), 1)
        self._k["ozaki_guard_count"](grid, (BLOCK_RECONSTRUCT, 1, 1), (
            low, _ll(m), _ll(n), _i(int(is_complex)), lost_a, lost_b, sum_a, sum_b, _d(c_sum), _d(c_hi),
            failed, _null(bits_a), _null(bits_b)))

    def reconstruct(self, prod, m: int, n: int, ea, eb, lost_a, lost_b, c, cs_i: int, cs_j: int,
                    alpha: complex, beta: complex, is_complex: bool, guard=None, kernel: str | None = None,
                    low=None, line_bits=None):
        """C (a view of C's real type, strides in its elements) = alpha * 2^-(e+f) X + beta * C from the int32
        products ``prod`` (count planes, each column-major m x n, 2n for complex), or from their
        digits (``prod`` uint8: the Hopper int8 kernel's digit store, ``jit.EPI_RESIDUE``).
        ``guard``: ``(sum_a, sum_b, c_sum, c_hi, failed)`` (:func:`pyblasgemm.ozaki.guard_constants`;
        ``failed`` an int32 counter) with the guard's int32 plane ``low`` (default: int32
        products' plane after the moduli's). ``line_bits``: ``(bits_a, bits_b)``, each row's and
        column's bits (the 'fast' scaling, :meth:`scale_fast`; ``bits_b`` over B's 2n lines for
        complex), for the guard's per-line test (:func:`pyblasgemm.ozaki.guard_failures` with
        ``bits_a`` / ``bits_b``; ``c_hi`` then :func:`pyblasgemm.ozaki.guard_unit`).

        ``kernel``: None picks :data:`ROWS_DEFAULT` where :func:`rows_kernel_applies` (16-byte
        loads of 4 rows; bench/ozaki_passes.py times each) and the element kernel otherwise;
        one of :data:`RECONSTRUCT_KERNELS` forces it (the tests and the benchmark compare them).
        Digit planes: 'rows-staged' is ``ozaki_reconstruct_digits16`` (16 rows a thread, each
        plane's 16 digits one cp.async), 'rows' one 4-byte load of 4 rows a plane; None picks
        the first that applies. All give the same bits. Returns the kernel's name."""
        if kernel is not None and kernel not in RECONSTRUCT_KERNELS:
            raise ValueError(f"kernel={kernel!r}: None or one of {RECONSTRUCT_KERNELS}")
        digits = prod.dtype.itemsize == 1
        if kernel not in (None, "elements") and not rows_kernel_applies(prod, m, kernel):
            rows = DIGIT_ROWS_PER_THREAD if digits and kernel == "rows-staged" else ROWS_PER_THREAD
            raise ValueError(f"kernel={kernel!r} needs m % {rows} == 0 and a 16-byte aligned prod, got "
                             f"m={m} and prod at {prod.data.ptr} (address % 16 = {prod.data.ptr % 16})")
        if kernel is None:
            kernel = next(k for k in RECONSTRUCT_KERNELS if k == "elements" or rows_kernel_applies(prod, m, k))
        flags = int(alpha != 1) | (int(beta != 0) << 1)
        cplx = "true" if is_complex else "false"
        planes = DIGIT if digits else "int"
        if digits and kernel == "rows-staged":
            threads = m // DIGIT_ROWS_PER_THREAD
            grid = (-(-threads // BLOCK_RECONSTRUCT_DIGITS), min(n, _MAX_GRID_Y), 1)
            block = (BLOCK_RECONSTRUCT_DIGITS, 1, 1)
            name = f"ozaki_reconstruct_digits16<{self.count}, {cplx}, {self.element}>"
        elif kernel != "elements":
            threads = m // ROWS_PER_THREAD
            grid = (-(-threads // BLOCK_RECONSTRUCT_ROWS), min(n, _MAX_GRID_Y), 1)
            block = (BLOCK_RECONSTRUCT_ROWS, 1, 1)
            stage = "true" if kernel == "rows-staged" else "false"
            name = f"ozaki_reconstruct_rows<{self.count}, {cplx}, {self.element}, {stage}, {planes}>"
        else:
            grid = (-(-m // BLOCK_RECONSTRUCT), min(n, _MAX_GRID_Y), 1)
            block = (BLOCK_RECONSTRUCT, 1, 1)
            name = f"ozaki_reconstruct<{self.count}, {cplx}, {self.element}, {planes}>"
        a, b = complex(alpha), complex(beta)
        sum_a, sum_b, c_sum, c_hi, failed = guard if guard is not None else (None, None, 0.0, 0.0, None)
        bits_a, bits_b = line_bits if line_bits is not None and guard is not None else (None, None)
        if low is None and guard is not None:
            if digits:
                raise ValueError("digit planes hold no guard plane: pass the guard's int32 plane as low=")
            low = prod[self.count]
        self._k[name](grid, block, (
            prod, _null(low), _ll(m), _ll(n), ea, eb, lost_a, lost_b, c, _ll(cs_i), _ll(cs_j),
            _d(a.real), _d(a.imag), _d(b.real), _d(b.imag), _i(flags), _null(sum_a), _null(sum_b),
            _d(c_sum), _d(c_hi), _null(failed), _null(bits_a), _null(bits_b)))
        return kernel


_sms: dict = {}
#: the one-pass kernels' dynamic shared memory opted in so far, per kernel address
_smem_allowed: dict = {}
#: (count, norm bits, device) -> :func:`pyblasgemm.ozaki.norm_thresholds` on that device (at
#: most 75 uint64 each; k enters only through ``_norm_bits(k)``, so few tables): uploaded once
_threshold_tables: dict = {}


def _thresholds(count: int, length: int, device: int):
    """The 'fast' scaling's table (:func:`pyblasgemm.ozaki.norm_thresholds`) for ``count``
    moduli and lines of ``length`` on ``device``, uploaded once."""
    from ..ozaki import _norm_bits, norm_thresholds

    key = (count, _norm_bits(length), device)
    table = _threshold_tables.get(key)
    if table is None:
        import cupy

        with cupy.cuda.Device(device):
            table = _threshold_tables[key] = cupy.asarray(norm_thresholds(count, length))
    return table



def _smem_optin(device: int) -> int:
    """The device's opt-in shared memory a block, asked once."""
    n = _optin.get(device)
    if n is None:
        import cupy

        rt = cupy.cuda.runtime
        n = _optin[device] = rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, device)
    return n


_optin: dict = {}


def _sm_count(device: int) -> int:
    """The device's SM count, asked once (the composite route makes an OzakiPasses per call;
    CuPy's ``Device.attributes`` asks for every attribute)."""
    n = _sms.get(device)
    if n is None:
        import cupy

        rt = cupy.cuda.runtime
        n = _sms[device] = rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, device)
    return n


def _ll(v):
    import numpy as np

    return np.int64(v)


def _i(v):
    import numpy as np

    return np.int32(v)


def _d(v):
    import numpy as np

    return np.float64(v)


def _null(x):
    """A CuPy array as the kernel's pointer, or a null pointer for None."""
    import numpy as np

    return np.uintp(0) if x is None else x
