"""bench_replication's lag run against a git ref and the working tree, side by side, in one run.

The ref's code is taken with `git archive REF` into a temporary directory; every daemon of its
runs starts there (`env -C DIR python -m syncd run`: the directory's `syncd` package comes
first on the path), the working tree's from this checkout. The bench code, the broker, the
writer and the measurement are the same for both (this tree's bench_replication.lag): 500
writes/s to two standbys with the default config unless told otherwise. The runs alternate
(ref, tree, ref, tree, ...), so that a change of the machine's load hits both alike; the load
average is printed with every run (other processes share the cores).

    python -m bench.bench_against --against main [--rounds 2] [--rate 500] [--seconds 10]
                                  [--replicas 2] [--stock-broker] [--config LINES]

Per run: lag p50 / p99 of the slower standby, and CPU per write (user + system) of each
daemon (a writes, b and c replicate), and their resident memory once drained. Then the
median of each side's runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bench_replication

TREE = Path(__file__).resolve().parent.parent


def export(ref: str, dest: Path) -> str:
    """The tree of `ref` under `dest`; its commit id."""
    commit = subprocess.run(["git", "-C", str(TREE), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = dest.parent / "ref.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(TREE), "archive", "--format=tar", commit], check=True,
                       stdout=out)
    dest.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return commit


def code_of(directory: Path) -> str:
    """Where `python -m syncd` run in `directory` takes syncd from (a check that the prefix
    does what it says)."""
    out = subprocess.run(["env", "-C", str(directory), sys.executable, "-c",
                          "import syncd, os; print(os.path.dirname(syncd.__file__))"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def summary(r: dict[str, Any]) -> dict[str, float]:
    worst = max(r["replicas"].values(), key=lambda s: s.p99)
    out = {"p50": max(s.p50 for s in r["replicas"].values()), "p99": worst.p99,
           "missing": float(sum(s.missing for s in r["replicas"].values()))}
    out.update({f"cpu_{n}": us for n, us in r["cpu_per_write_us"].items()})
    out.update({f"rss_{n}": mb for n, mb in r.get("rss_mb", {}).items()})
    return out


def row(label: str, s: dict[str, float], extra: str = "") -> str:
    cpu = " / ".join(f"{s[k]:.0f}" for k in sorted(s) if k.startswith("cpu_"))
    rss = " / ".join(f"{s[k]:.1f}" for k in sorted(s) if k.startswith("rss_"))
    return (f"  {label:<28} p50 {s['p50']:6.2f} ms  p99 {s['p99']:7.2f} ms  "
            f"CPU per write a / b / c {cpu} µs  RSS {rss} MiB  missing {s['missing']:.0f}"
            f"{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, metavar="REF",
                        help="git ref to compare with (e.g. main, HEAD~3)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side")
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=2, choices=(1, 2))
    parser.add_argument("--stock-broker", action="store_true",
                        help="Mosquitto's stock config (without set_tcp_nodelay true)")
    parser.add_argument("--config", default="", metavar="LINES",
                        help="top-level config lines for both sides' daemons")
    args = parser.parse_args()
    config = args.config.replace("\\n", "\n")
    with tempfile.TemporaryDirectory(prefix="syncd-against-") as tmp:
        root = Path(tmp)
        ref_tree = root / "ref"
        commit = export(args.against, ref_tree)
        sides = {f"{args.against} ({commit[:10]})": ref_tree, "working tree": TREE}
        for label, directory in sides.items():
            print(f"{label}: syncd from {code_of(directory)}")
        broker = "stock Mosquitto" if args.stock_broker else "Mosquitto (set_tcp_nodelay)"
        print(f"{args.rate} writes/s for {args.seconds:g} s, {args.replicas} standby(s), "
              f"{broker}, config {config.strip() or '(default)'!r}; {args.rounds} round(s)")
        results: dict[str, list[dict[str, float]]] = {label: [] for label in sides}
        for i in range(args.rounds):
            for label, directory in sides.items():
                before = load()
                r = bench_replication.lag(args.rate, args.seconds,
                                          root / f"run-{i}-{directory.name}", args.replicas,
                                          stock_broker=args.stock_broker, config=config,
                                          prefix=["env", "-C", str(directory)])
                s = summary(r)
                results[label].append(s)
                timed_out = "  TIMED OUT" if r.get("timed_out") else ""
                g = r.get("group_commit")
                if g:
                    timed_out += (f"  writer's group commit: {g['changes']} notices, "
                                  f"{g['reads']} reads, {g['joined']} joined")
                print(row(f"{label} #{i + 1}", s,
                          f"  (load before {before}, after {load()}){timed_out}"), flush=True)
        print("median of the runs:")
        for label, runs in results.items():
            print(row(label, {k: statistics.median(r[k] for r in runs) for k in runs[0]}))


if __name__ == "__main__":
    main()
