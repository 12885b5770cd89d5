"""Print the Markdown tables of committed results (benchmarks/results/*.json), as benchmarks/README.md shows them.

    .venv/bin/python -m benchmarks.tables
"""

import json
from pathlib import Path

from . import depth_scaling, inference, throughput

RESULTS = Path(__file__).resolve().parent / "results"


def main():
    for name, render in (
        ("throughput_cpu.json", lambda d: throughput.table(d["results"]) + "\n\n" + throughput.verdicts(d["results"])),
        ("depth_scaling.json", lambda d: depth_scaling.report(d["rows"])),
        ("inference_cpu.json", lambda d: inference.table(d["results"], d["layers"])),
        ("inference_fused_cpu.json", lambda d: inference.table(d["results"], d["layers"])),
    ):
        path = RESULTS / name
        if not path.exists():
            print(f"## {name}: not run yet\n")
            continue
        data = json.loads(path.read_text())
        print(f"## {name}\nmachine: {data['machine']}\ncommand: {data['command']}\n\n{render(data)}\n")


if __name__ == "__main__":
    main()
