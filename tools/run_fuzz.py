"""Run the fuzz of tests/test_fuzz.py for a set time and record what ran.

Each round calls the raw-form, gemm and matmul fuzz tests once (FUZZ_EXAMPLES examples each,
fresh hypothesis seeds every round) until the time is spent; a failing round is recorded with
its falsifying example and the run goes on. The JSON written holds the device, library
versions, git SHA, the seconds run, examples per check and the failures::

    python tools/run_fuzz.py --minutes 9 --json bench/results/fuzz_h100_<date>.json
    python tools/run_fuzz.py --minutes 1 --host        # the NumPy (host) variants
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_fuzz_module():
    sys.path.insert(0, str(ROOT / "tests"))          # for its `_ref` import
    spec = importlib.util.spec_from_file_location("fuzz", ROOT / "tests" / "test_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _environment(gpu: bool) -> dict:
    import numpy

    import pyblasgemm
    env = {"python": platform.python_version(), "numpy": numpy.__version__,
           "pyblasgemm": pyblasgemm.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                       time.gmtime())}
    try:
        git = ["git", "-C", str(ROOT)]
        env["git_sha"] = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()
        # a tree copied to a GPU machine may carry uncommitted changes: say so
        env["git_dirty"] = bool(subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                                               capture_output=True, text=True).stdout.strip())
    except OSError:
        env["git_sha"] = None
    if gpu:
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        env.update(device=props["name"].decode(), cupy=cupy.__version__, nvidia_driver=smi or None,
                   driver=cupy.cuda.runtime.driverGetVersion(),
                   runtime=cupy.cuda.runtime.runtimeGetVersion())
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--examples", type=int, default=200, help="examples per test and round")
    parser.add_argument("--host", action="store_true", help="the NumPy variants (no GPU)")
    parser.add_argument("--json", help="write the record here")
    args = parser.parse_args(argv)
    os.environ["FUZZ_EXAMPLES"] = str(args.examples)
    fuzz = _load_fuzz_module()
    suffix = "host" if args.host else "gpu"
    tests = [getattr(fuzz, f"test_fuzz_{form}_{suffix}") for form in ("raw", "gemm", "matmul")]
    start, rounds, failures = time.time(), 0, []
    deadline = start + 60 * args.minutes
    while time.time() < deadline:
        for test in tests:
            if time.time() >= deadline:
                break
            try:
                test()
            except Exception as exc:   # the falsifying example is in the message / notes
                failures.append({"test": test.__name__, "error": f"{type(exc).__name__}: {exc}"[:4000],
                                 "notes": [str(n)[:2000] for n in getattr(exc, "__notes__", [])],
                                 "traceback": traceback.format_exc()[-3000:]})
                print(failures[-1]["error"][:500], file=sys.stderr)
        rounds += 1
        print(f"{time.time() - start:7.1f} s  round {rounds}  {dict(fuzz.EXAMPLES)}  "
              f"failures {len(failures)}", flush=True)
    record = {"environment": _environment(not args.host), "seconds": round(time.time() - start, 1),
              "rounds": rounds, "examples": dict(fuzz.EXAMPLES),
              "total_examples": sum(fuzz.EXAMPLES.values()), "failures": failures}
    text = json.dumps(record, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(json.dumps({k: record[k] for k in ("seconds", "rounds", "examples", "total_examples")}))
    print(f"failures: {len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
