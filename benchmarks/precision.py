"""The precision characterisation and the operation count of one RK4 step (issue 21).

    python benchmarks/precision.py [--quick]

Runs :func:`quadjax.verify.precision.characterise` (float64, float32, bfloat16, float16 on RP-1;
hover, yaw spin and torque-free precession; 1e2–1e5 steps of 1 ms) and
:func:`quadjax.verify.opcount.operation_count` on an airborne, a grounded and random states,
and writes benchmarks/PRECISION_RESULTS.md and .json and docs/precision.png. docs/precision.md
explains the method and quotes the figures. ``--quick``: horizons up to 1e3 only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # a benchmark script, not the library: the float64 reference

import quadjax as qj  # noqa: E402
from quadjax.files import write_atomic  # noqa: E402
from quadjax.verify import opcount, precision  # noqa: E402

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs"


def count_table(params, dt=1e-3) -> dict:
    """The step's counts for an airborne, a grounded and 8 random states (float64) and float32/bfloat16."""
    w = qj.hover_rotor_speed(params)
    cases = {"airborne (hover, 1 m)": (qj.hover_state(params, position=(0.0, 0.0, 1.0)), w),
             "grounded (rotors idle)": (qj.QuadState.create(on_ground=1.0, dtype=params.mass.dtype), 0 * w)}
    cases.update({f"random {i}": su for i, su in enumerate(opcount.random_states(params, 8))})
    counts = {name: opcount.operation_count(params, s, u, dt) for name, (s, u) in cases.items()}
    by_dtype = {}
    for name in ("float32", "bfloat16"):
        p = params.astype(name)
        by_dtype[name] = opcount.operation_count(p, qj.hover_state(p), qj.hover_rotor_speed(p), dt)
    return dict(counts=counts, by_dtype=by_dtype,
                compiled_flops=opcount.compiled_flops(params, cases["airborne (hover, 1 m)"][0], w, dt))


def counts_markdown(table) -> str:
    counts = table["counts"]
    first = next(iter(counts.values()))
    same = all(c == first for c in counts.values())
    lines = [f"One `rk4_step` of RP-1 (float64, 4 rotors), evaluated equation by equation from its jaxpr "
             f"on {len(counts)} states ({', '.join(counts)}): "
             + ("**the same count for every state**." if same else "**counts differ between states**:"), ""]
    if not same:
        lines += [f"- {k}: total {v['total']}, arithmetic {v['arithmetic']}" for k, v in counts.items()] + [""]
    lines += ["| primitive | count |", "|---|--:|"]
    lines += [f"| `{k}` | {v} |" for k, v in first.items() if k not in ("total", "arithmetic")]
    lines += [f"| **total** | **{first['total']}** |", f"| **arithmetic** (floating-point ops) | **{first['arithmetic']}** |", ""]
    for name, c in table["by_dtype"].items():
        lines.append(f"- {name}: total {c['total']}, arithmetic {c['arithmetic']}"
                     + ("" if c == first else f" (differs from float64: `convert_element_type` "
                        f"{c.get('convert_element_type', 0)} against {first.get('convert_element_type', 0)})"))
    lines.append(f"- XLA's `cost_analysis()` flops of the compiled float64 step: {table['compiled_flops']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="horizons up to 1e3 only")
    args = ap.parse_args(argv)
    steps = (100, 1000) if args.quick else (100, 1000, 10000, 100000)
    t0 = time.perf_counter()
    rows = precision.characterise(steps=steps)
    seconds = time.perf_counter() - t0
    table = count_table(qj.presets.rp1(dtype="float64"))
    md = ["# Precision characterisation and operation count (issue 21)", "",
          f"`python benchmarks/precision.py{' --quick' if args.quick else ''}` (characterisation {seconds:.1f} s "
          "on this machine, 2 cores). Method, scenarios and the accumulator: docs/precision.md. "
          "Drift is |x − x₆₄| against the float64 run of the same scenario; accuracy at reduced precision "
          "is a characterisation result, not a guarantee.", "",
          "## Drift against float64", "", precision.format_markdown(rows),
          "## Operation count of one RK4 step", "", counts_markdown(table)]
    write_atomic(HERE / "PRECISION_RESULTS.md", lambda f: f.write("\n".join(md).encode()))
    blob = dict(steps=list(steps), seconds=seconds, rows=rows, operation_count=table)
    write_atomic(HERE / "PRECISION_RESULTS.json", lambda f: f.write(json.dumps(blob, indent=1).encode()))
    precision.plot(rows, DOCS / "precision.png")
    print("\n".join(md))


if __name__ == "__main__":
    main()
