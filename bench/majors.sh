#!/usr/bin/env bash
# PostgreSQL 18 beside 15, in one run: bench/relay.sh and bench/log-mode.sh on each major, the
# majors taking turns, then their figures side by side in bench/RESULTS-majors.md. Each script
# keeps its own results (bench/RESULTS-relay.md and bench/RESULTS-relay-pg18.md, and so on),
# with its rounds. About 40 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

for script in relay log-mode; do
  for major in 15 18; do
    echo "== bench/$script.sh on PostgreSQL $major"
    OUTBOX_PG_MAJOR=$major "bench/$script.sh" >/dev/null
  done
done

python3 - "$(git rev-parse --short HEAD)" "$(nproc)" <<'PY' >bench/RESULTS-majors.md
import datetime
import sys

commit, cores = sys.argv[1], sys.argv[2]


def table(path):
    """The first Markdown table of `path`: its header cells and its rows by their first cell."""
    lines = [line for line in open(path) if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    return cells[0], {row[0]: row[1:] for row in cells[2:]}


print("# PostgreSQL 18 beside 15\n")
print(f"Written by `bench/majors.sh` on {datetime.date.today()} ({cores} cores, commit {commit}): "
      "`bench/relay.sh` and `bench/log-mode.sh` on each major in turn, the same machine, settings "
      "and receiver. Each figure is the median of that script's rounds, which its own results "
      "file lists with the server's exact version.\n")
for name, on15, on18 in [("bench/relay.sh", "bench/RESULTS-relay.md", "bench/RESULTS-relay-pg18.md"),
                         ("bench/log-mode.sh", "bench/RESULTS-log-delivery.md", "bench/RESULTS-log-delivery-pg18.md")]:
    header, rows15 = table(on15)
    _, rows18 = table(on18)
    print(f"\n## {name} ([15]({on15.split('/')[1]}), [18]({on18.split('/')[1]}))\n")
    print("| measure | PostgreSQL 15 | PostgreSQL 18 |\n|---|---|---|")
    # The last column is the goal, the same on both.
    for label, values in rows15.items():
        for column, value in zip(header[1:-1], values[:-1]):
            measure = label if len(header) == 3 else f"{label}: {column}"
            print(f"| {measure} | {value} | {rows18.get(label, ['?'] * len(values))[header[1:-1].index(column)]} |")
PY
echo "== written bench/RESULTS-majors.md"
cat bench/RESULTS-majors.md
