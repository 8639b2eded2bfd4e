#!/usr/bin/env python3
"""Renders the benchmark figures that README.md and docs/performance.md quote from the results
the benchmarks write, so that no figure is copied by hand.

    python3 scripts/readme-figures.py           # rewrite the blocks from bench/RESULTS*.md
    python3 scripts/readme-figures.py --check   # exit 1, with a diff, if a block is stale

Each file holds one block between the lines `<!-- figures:begin -->` and
`<!-- figures:end -->`; only what is between them is written. docs/performance.md gets the
whole table of bench/RESULTS.md (bench/run.sh). README.md gets a few headline figures, each
from the last run of the benchmark that measures it: the enqueue from bench/RESULTS-log-mode.md
(bench/log-enqueue.sh), delivery and latency from bench/RESULTS-log-delivery.md
(bench/log-mode.sh), the SQL install from bench/RESULTS-relay.md (bench/relay.sh), a worker's
memory from bench/RESULTS.md; each of those scripts runs this one after writing its file. A
row this script needs and cannot find or read is an error naming the file (exit 2): change
both together. Standard library only.
"""

import difflib
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RUN = "bench/RESULTS.md"
ENQUEUE = "bench/RESULTS-log-mode.md"
DELIVERY = "bench/RESULTS-log-delivery.md"
RELAY = "bench/RESULTS-relay.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


class Unreadable(Exception):
    pass


class Results:
    """One results file as its benchmark writes it: a header, the machine, tables."""

    def __init__(self, path, text):
        self.path = path
        self.text = text
        self.rows = []  # the cells of each table row, header and separator rows left out
        lines = [line.strip() for line in text.splitlines()]
        for number, line in enumerate(lines):
            following = lines[number + 1] if number + 1 < len(lines) else ""
            if not line.startswith("|") or re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line) or following.startswith("|---"):
                continue
            self.rows.append([cell.strip() for cell in line.strip("|").split("|")])
        if not self.rows:
            raise Unreadable(f"{path} has no table")

    def search(self, pattern, what):
        match = re.search(pattern, self.text)
        if not match:
            raise Unreadable(f"{self.path}: cannot find {what} (/{pattern}/)")
        return match

    def row(self, label_pattern):
        """The cells of the one row whose first cell matches."""
        found = [cells for cells in self.rows if re.search(label_pattern, cells[0])]
        if len(found) != 1:
            raise Unreadable(f"{self.path}: {len(found)} rows match /{label_pattern}/, expected one")
        return found[0]

    def numbers(self, label_pattern, cell_pattern, column=1):
        """The groups of cell_pattern in the given column of the row whose first cell matches."""
        cells = self.row(label_pattern)
        cell = cells[column] if column < len(cells) else ""
        match = re.search(cell_pattern, cell)
        if not match:
            raise Unreadable(f"{self.path}: the row /{label_pattern}/ reads {cell!r} in column {column}, not /{cell_pattern}/")
        return match.groups()


def grouped(number):
    """12930 -> 12,930; 3.9 stays 3.9."""
    whole, dot, fraction = number.partition(".")
    return f"{int(whole):,}" + dot + fraction


def recorded(results):
    date = results.search(r"Recorded (\d{4}-\d{2}-\d{2})", "the date of the run").group(1)
    cores = results.search(r"Machine: (\d+) cores", "the number of cores").group(1)
    postgres = results.search(r"PostgreSQL ([0-9.]+)", "the PostgreSQL version").group(1)
    version, workers = results.search(r"outbox_ext (\S+) with (\d+) workers", "the version and workers").groups()
    return date, cores, postgres, version, workers


def link(path, base):
    """A Markdown link to a results file, relative to the page at `base`."""
    return f"[{path}]({os.path.relpath(path, os.path.dirname(base) or '.')})"


def readme_block(results):
    run, enqueue, delivery, relay = (results[path] for path in (RUN, ENQUEUE, DELIVERY, RELAY))
    # The block names one machine: the runs it quotes must have had the same number of cores.
    sizes = {r.path: r.search(r"(\d+) cores", "the number of cores").group(1) for r in (run, enqueue, delivery, relay)}
    if len(set(sizes.values())) != 1:
        raise Unreadable(f"the results were recorded on machines of different sizes: {sizes}")
    cores = sizes[RUN]
    run_date, _, _, run_version, _ = recorded(run)
    (memory,) = run.numbers(r"^worker private memory", r"^(\d+) MiB")

    enqueue_date = enqueue.search(r"`bench/log-enqueue.sh`, (\d{4}-\d{2}-\d{2})", "the date of the run").group(1)
    # Columns: the rate and its share of the plain INSERT, commit off, then commit on.
    table_off, table_on = (enqueue.numbers(r"^`outbox_enqueue`, table mode, one endpoint \(extension\)$", r"^(\d+)%$", column)[0]
                           for column in (2, 4))
    log_off, log_on = (enqueue.numbers(r"^`outbox_enqueue`, log mode \(extension\)$", r"^(\d+)%$", column)[0]
                       for column in (2, 4))

    delivery_date = delivery.search(r"`bench/log-mode.sh`, (\d{4}-\d{2}-\d{2})", "the date of the run").group(1)
    # Columns: workers in table mode, workers in log mode, outbox relay in table mode, outbox relay in log mode.
    drain_label = r"^drain of \d+ events, one endpoint"
    (events,) = delivery.numbers(drain_label, r"(\d+)", column=0)
    workers_one, relay_one = (delivery.numbers(drain_label, r"^(\d+)$", column)[0] for column in (1, 4))
    workers_three, relay_three = (delivery.numbers(r"^drain, three endpoints", r"^(\d+)$", column)[0] for column in (1, 4))
    latency_label = r"^latency at \d+ events/s"
    (rate,) = delivery.numbers(latency_label, r"(\d+) events/s", column=0)
    workers_p50, workers_p99 = delivery.numbers(latency_label, r"^([0-9.]+) / ([0-9.]+)$", 1)
    relay_p50, relay_p99 = delivery.numbers(latency_label, r"^([0-9.]+) / ([0-9.]+)$", 4)

    relay_date = relay.search(r"`bench/relay.sh` on (\d{4}-\d{2}-\d{2})", "the date of the run").group(1)
    (direct,) = relay.numbers(r"^drain: 2 `outbox relay`, direct$", r"= (\d+)% of the workers'")
    (pooled,) = relay.numbers(r"^drain: 2 `outbox relay` through PgBouncer", r"= (\d+)% of the workers'")
    (resident,) = relay.numbers(r"^relay resident memory", r"^(\d+) MiB")
    listen_p50, listen_p99 = relay.numbers(r"^commit to receipt at 500 events/s, LISTEN$", r"^p50 ([0-9.]+) ms, p99 ([0-9.]+) ms$")

    return [
        f"On {cores} cores, everything on 127.0.0.1, from the last run of each benchmark:",
        "",
        f"- **Enqueue** ({link(ENQUEUE, 'README.md')}, {enqueue_date}): the extension's `outbox_enqueue` runs at"
        f" {table_on}% of the rate of a plain INSERT of the event row in table mode (one endpoint) and at {log_on}% in"
        f" log mode; at {table_off}% and {log_off}% CPU-bound (`synchronous_commit = off`).",
        f"- **Delivery** ({link(DELIVERY, 'README.md')}, {delivery_date}): a backlog of {grouped(events)} events drains at"
        f" {grouped(workers_one)} deliveries/s to one endpoint and {grouped(workers_three)} to three with the workers in"
        f" table mode, and at {grouped(relay_one)} and {grouped(relay_three)} with `outbox relay` streaming log mode.",
        f"- **Latency** (the same run): at {grouped(rate)} events/s a commit reaches its receiver in {workers_p50} ms at the"
        f" median (p99 {workers_p99} ms) with the workers in table mode, and in {relay_p50} ms (p99 {relay_p99} ms) with"
        " `outbox relay` streaming log mode.",
        f"- **The SQL install** ({link(RELAY, 'README.md')}, {relay_date}): two `outbox relay` processes drain at {direct}%"
        f" of two workers' rate ({pooled}% through PgBouncer) with at most {resident} MiB resident; at 500 events/s a commit"
        f" reaches its receiver in {listen_p50} ms at the median (p99 {listen_p99} ms).",
        f"- **Memory** ({link(RUN, 'README.md')}, `bench/run.sh`, {run_date}, outbox_ext {run_version}): a relay worker's"
        f" private memory peaks at {memory} MiB.",
    ]


def performance_block(results):
    run = results[RUN]
    date, cores, postgres, version, workers = recorded(run)
    lines = [
        f"The last recorded run ({date}; {cores} cores, PostgreSQL {postgres}, outbox_ext {version} with"
        f" {workers} relay workers at default settings; receiver nginx answering 204), as"
        f" {link(RUN, 'docs/performance.md')} has it:",
        "",
        "| measure | result | target |",
        "|---|---|---|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in run.rows if len(cells) == 3]
    return lines


# Each page's block, what it is rendered from, and the note that says so.
TARGETS = {
    "README.md": (readme_block, "bench/RESULTS*.md: edit those files"),
    "docs/performance.md": (performance_block, f"{RUN}: edit that file"),
}


def rendered(path, text, block, source):
    """The file's text with its block replaced by `block` (a list of lines)."""
    lines = text.split("\n")
    if lines.count(BEGIN) != 1 or lines.count(END) != 1 or lines.index(BEGIN) > lines.index(END):
        raise Unreadable(f"{path} must hold one {BEGIN} line and, after it, one {END} line")
    begin, end = lines.index(BEGIN), lines.index(END)
    note = f"<!-- written by scripts/readme-figures.py from {source}, not this block -->"
    return "\n".join(lines[: begin + 1] + [note] + block + lines[end:])


def main(argv):
    check = argv[1:] == ["--check"]
    if argv[1:] not in ([], ["--check"]):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        results = {}
        for path in (RUN, ENQUEUE, DELIVERY, RELAY):
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                results[path] = Results(path, f.read())
        stale = 0
        for path, (render, source) in TARGETS.items():
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                text = f.read()
            new = rendered(path, text, render(results), source)
            if new == text:
                continue
            if check:
                stale += 1
                sys.stdout.writelines(difflib.unified_diff(
                    text.splitlines(True), new.splitlines(True), f"{path} (as committed)", f"{path} (from bench/)"))
            else:
                with open(os.path.join(ROOT, path), "w", encoding="utf-8") as f:
                    f.write(new)
                print(f"readme-figures: wrote the figures of {path}")
    except (Unreadable, OSError) as error:
        print(f"readme-figures: {error}", file=sys.stderr)
        return 2
    if stale:
        print(f"readme-figures: {stale} file(s) quote figures that are not the results':"
              " run python3 scripts/readme-figures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
