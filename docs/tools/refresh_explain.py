"""Refresh the two ``Plan.explain()`` outputs quoted in docs/guide/planner.rst from the planner
as it is now (run after the planner or its calibration changes):

    python docs/tools/refresh_explain.py            # rewrites docs/guide/planner.rst in place

The prose around the blocks names the decisions (split-k for the long-K problem, the measured
sliced-k over the model's hybrid for the 3xTF32 square); read the new output and adjust it when
those change.
"""
import pathlib
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pyblasgemm  # noqa: E402

LONG_K = ("says how far behind cuBLAS it expects that to be::\n\n", "\nA large square in 3xTF32")
SQUARE = ("the measured-choice table (:ref:`measured-choices`) overrides the model::\n\n", "\nColumns:")
CALL = ('    >>> print(pyblasgemm.plan(512, 512, 32768, "float16", transa="T",\n'
        '    ...                       backend="tensorcore").explain(limit=6))    # doctest: +SKIP\n')


def _splice(text, anchors, block):
    start = text.index(anchors[0]) + len(anchors[0])
    end = text.index(anchors[1], start)
    return text[:start] + block + text[end:]


def main(page=ROOT / "docs" / "guide" / "planner.rst"):
    page = pathlib.Path(page)
    a = pyblasgemm.plan(512, 512, 32768, "float16", transa="T", backend="tensorcore")
    b = pyblasgemm.plan(8192, 8192, 8192, "f32", compute="3xtf32")
    text = page.read_text()
    text = _splice(text, LONG_K, CALL + textwrap.indent(a.explain(limit=6), "    ") + "\n")
    text = _splice(text, SQUARE, textwrap.indent(b.explain(limit=4), "    ") + "\n")
    page.write_text(text)
    print(f"refreshed {page}")


if __name__ == "__main__":
    main(*sys.argv[1:])
