"""The model-layer corpus: the Linear layers of public model configurations, as the layers call
them (``x @ W.T``, W stored as ``torch.nn.Linear`` holds it, (out, in) row-major), at decode and
prefill token counts, drawn once and committed.

    python -m bench.model_corpus            # (re)write bench/model_layers_2026-11-27.json
    python -m bench.model_corpus --check    # regenerate in memory, compare with the committed file

(from the repository root.)

Layer sizes are the configurations' published values (each model's ``config.json``: hidden
size, intermediate size, attention heads, key-value heads, head dimension), the projections as
the reference implementations fuse them (q, k and v in one matrix where the model's own code
does; Phi-3 fuses gate and up too). Token counts: the decode set (1, 2, 4, 8, 16, 32, 64) for
every layer, and per layer three prefill counts drawn with ``numpy.random.default_rng([SEED,
layer index])`` as ``round(2**U(log2 100, log2 8192))`` (odd counts included: a prompt's length
is whatever it is).

Held out: nothing in pyblasgemm was fitted or picked on this file. A layer whose problem (in
either orientation, at any drawn token count) appears in the planner's tables, the results
they came from, the benchmark suite or the random held-out sets is *marked*, not dropped
(``in_planner_data``: model layers are what everyone tunes for, and Llama-3-8B's are in the
tables); summaries report the unmarked entries too.

Each entry is a bench/corpus.py entry (bench/heldout.py runs either: ``--corpus
bench/model_layers_2026-11-27.json``): ``class`` decode or prefill, ``m`` tokens, ``n`` output
features, ``k`` input features, ``batch`` 1, ``dtype`` bfloat16 (the layers' type),
``transa`` 'N' and ``transb`` 'T' (A = x (m, k) row-major, B = W.T with W (n, k) row-major),
plus ``model``, ``layer`` and ``in_planner_data``.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "model_layers_2026-11-27.json"
SEED = 20261127
DECODE = (1, 2, 4, 8, 16, 32, 64)
PREFILL_DRAWS = 3
PREFILL_RANGE = (100, 8192)


def _attention(hidden, heads, kv_heads, head_dim, fused=True):
    """(name, in, out) of the attention projections: qkv fused (or q, k, v) and o."""
    q, kv = heads * head_dim, kv_heads * head_dim
    proj = [("qkv", hidden, q + 2 * kv)] if fused else [("q", hidden, q), ("k", hidden, kv), ("v", hidden, kv)]
    return proj + [("o", q, hidden)]


def _mlp(hidden, inter, gated=True, fused_gate_up=False):
    if not gated:
        return [("up", hidden, inter), ("down", inter, hidden)]
    up = [("gate_up", hidden, 2 * inter)] if fused_gate_up else [("gate/up", hidden, inter)]
    return up + [("down", inter, hidden)]


#: model -> its config's values (hidden, intermediate, heads, kv heads, head dim) and the layers
#: they give. Sources: the models' config.json as published (Meta, Qwen, Mistral AI, Google,
#: Microsoft, TII, OpenAI).
MODELS = {
    "llama-3.2-1b": _attention(2048, 32, 8, 64) + _mlp(2048, 8192),
    "llama-3-8b": _attention(4096, 32, 8, 128) + _mlp(4096, 14336),
    "llama-3-70b": _attention(8192, 64, 8, 128) + _mlp(8192, 28672),
    "qwen2.5-0.5b": _attention(896, 14, 2, 64) + _mlp(896, 4864),
    "qwen2-7b": _attention(3584, 28, 4, 128) + _mlp(3584, 18944),
    "gemma-2-9b": _attention(3584, 16, 8, 256) + _mlp(3584, 14336),
    "phi-3-mini": _attention(3072, 32, 32, 96) + _mlp(3072, 8192, fused_gate_up=True),
    "falcon-7b": _attention(4544, 71, 1, 64) + _mlp(4544, 18176, gated=False),
    "gpt2": _attention(768, 12, 12, 64) + _mlp(768, 3072, gated=False),
    "mixtral-8x7b expert": [("w1/w3", 4096, 14336), ("w2", 14336, 4096), ("router", 4096, 8)],
}


def generate(seed: int = SEED) -> dict:
    try:
        from bench.corpus import excluded_shapes
    except ImportError:         # run as a script from bench/
        from corpus import excluded_shapes

    known = excluded_shapes()
    entries = []
    layer_index = 0
    for model, layers in MODELS.items():
        for name, k, n in layers:
            rng = np.random.default_rng([seed, layer_index])
            lo, hi = (math.log2(v) for v in PREFILL_RANGE)
            prefill = sorted({int(round(2 ** rng.uniform(lo, hi))) for _ in range(PREFILL_DRAWS)})
            for m in DECODE + tuple(prefill):
                hits = sorted({w for key in ((m, n, k), (n, m, k)) for w in known.get(key, [])})
                entries.append({"id": f"{model}/{name}/m{m}", "model": model, "layer": name,
                                "class": "decode" if m in DECODE else "prefill",
                                "m": m, "n": n, "k": k, "batch": 1, "dtype": "bfloat16",
                                "transa": "N", "transb": "T", "in_planner_data": hits})
            layer_index += 1
    return {"name": CORPUS.name, "seed": seed, "how": __doc__, "models": {
        model: [{"layer": name, "in": k, "out": n} for name, k, n in layers] for model, layers in MODELS.items()},
        "entries": entries}


def load(path=CORPUS) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    doc = generate()
    if args.check:
        same = load() == json.loads(dumps(doc))
        print("model corpus matches" if same else "model corpus differs from its generator")
        return 0 if same else 1
    CORPUS.write_text(dumps(doc))
    marked = sum(bool(e["in_planner_data"]) for e in doc["entries"])
    print(f"wrote {CORPUS} ({len(doc['entries'])} entries, {marked} in the planner's data)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    sys.exit(main())
