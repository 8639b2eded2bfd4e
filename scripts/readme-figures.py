#!/usr/bin/env python3
"""Renders the benchmark figures that README.md and docs/performance.md quote from
bench/RESULTS.md, which bench/run.sh writes, so that no figure is copied by hand.

    python3 scripts/readme-figures.py           # rewrite the blocks from bench/RESULTS.md
    python3 scripts/readme-figures.py --check   # exit 1, with a diff, if a block is stale

Each file holds one block between the lines `<!-- figures:begin -->` and
`<!-- figures:end -->`; only what is between them is written. README.md gets a few headline
figures, docs/performance.md the whole table of the run. A row this script needs and cannot
find or read in bench/RESULTS.md is an error naming it (exit 2): change both together.
Standard library only.
"""

import difflib
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RESULTS = "bench/RESULTS.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
NOTE = "<!-- written by scripts/readme-figures.py from bench/RESULTS.md: edit that file, not this block -->"


class Unreadable(Exception):
    pass


class Results:
    """bench/RESULTS.md as bench/run.sh writes it: a header, the machine, one table."""

    def __init__(self, text):
        self.text = text
        self.rows = []  # (measure, result, target)
        for line in text.splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cells) == 3 and cells[0] not in ("measure", "---"):
                self.rows.append(tuple(cells))
        if not self.rows:
            raise Unreadable(f"{RESULTS} has no table of | measure | result | target |")

    def search(self, pattern, what):
        match = re.search(pattern, self.text)
        if not match:
            raise Unreadable(f"{RESULTS}: cannot find {what} (/{pattern}/)")
        return match

    def row(self, measure_pattern):
        """The result of the one row whose measure matches."""
        found = [result for measure, result, _ in self.rows if re.search(measure_pattern, measure)]
        if len(found) != 1:
            raise Unreadable(f"{RESULTS}: {len(found)} rows match /{measure_pattern}/, expected one")
        return found[0]

    def numbers(self, measure_pattern, result_pattern):
        """The groups of result_pattern in the result of the row whose measure matches."""
        result = self.row(measure_pattern)
        match = re.search(result_pattern, result)
        if not match:
            raise Unreadable(f"{RESULTS}: the row /{measure_pattern}/ reads {result!r}, not /{result_pattern}/")
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


def readme_block(results):
    date, cores, postgres, version, workers = recorded(results)
    enqueue_on, enqueue_off = results.numbers(r"^`outbox_enqueue`, one endpoint", r"\((\d+)% / (\d+)% of plain INSERT\)")
    events = results.search(r"drain: (\d+) events enqueued, then delivered to one endpoint", "the drain's size").group(1)
    (drain,) = results.numbers(r"^drain: \d+ events enqueued, then delivered to one endpoint", r"^(\d+) events/s")
    (fanout,) = results.numbers(r"^drain: \d+ events enqueued, then delivered to three endpoints", r"^(\d+) deliveries/s")
    p50, p99 = results.numbers(r"^latency at 500 events/s", r"^([0-9.]+) / ([0-9.]+) /")
    (memory,) = results.numbers(r"^worker private memory", r"^(\d+) MiB")
    return [
        f"From the last run of `bench/run.sh` ({date}; {cores} cores, PostgreSQL {postgres}, outbox_ext {version}"
        f" with {workers} relay workers; [bench/RESULTS.md](bench/RESULTS.md)):",
        "",
        f"- `outbox_enqueue` runs at {enqueue_on}% of the rate of a plain INSERT of the event"
        f" ({enqueue_off}% with `synchronous_commit = off`).",
        f"- A backlog of {grouped(events)} events drains at {grouped(drain)} events/s to one endpoint,"
        f" and at {grouped(fanout)} deliveries/s to three.",
        f"- At 500 events/s, with a second endpoint down, a commit reaches its receiver in {p50} ms at the"
        f" median and {p99} ms at p99.",
        f"- A relay worker's private memory peaks at {memory} MiB.",
    ]


def performance_block(results):
    date, cores, postgres, version, workers = recorded(results)
    lines = [
        f"The last recorded run ({date}; {cores} cores, PostgreSQL {postgres}, outbox_ext {version} with"
        f" {workers} relay workers at default settings; receiver nginx answering 204), as"
        " [bench/RESULTS.md](../bench/RESULTS.md) has it:",
        "",
        "| measure | result | target |",
        "|---|---|---|",
    ]
    lines += [f"| {measure} | {result} | {target} |" for measure, result, target in results.rows]
    return lines


TARGETS = {"README.md": readme_block, "docs/performance.md": performance_block}


def rendered(path, text, block):
    """The file's text with its block replaced by `block` (a list of lines)."""
    lines = text.split("\n")
    if lines.count(BEGIN) != 1 or lines.count(END) != 1 or lines.index(BEGIN) > lines.index(END):
        raise Unreadable(f"{path} must hold one {BEGIN} line and, after it, one {END} line")
    begin, end = lines.index(BEGIN), lines.index(END)
    return "\n".join(lines[: begin + 1] + [NOTE] + block + lines[end:])


def main(argv):
    check = argv[1:] == ["--check"]
    if argv[1:] not in ([], ["--check"]):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        with open(os.path.join(ROOT, RESULTS), encoding="utf-8") as f:
            results = Results(f.read())
        stale = 0
        for path, render in TARGETS.items():
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                text = f.read()
            new = rendered(path, text, render(results))
            if new == text:
                continue
            if check:
                stale += 1
                sys.stdout.writelines(difflib.unified_diff(
                    text.splitlines(True), new.splitlines(True), f"{path} (as committed)", f"{path} (from {RESULTS})"))
            else:
                with open(os.path.join(ROOT, path), "w", encoding="utf-8") as f:
                    f.write(new)
                print(f"readme-figures: wrote the figures of {path} from {RESULTS}")
    except (Unreadable, OSError) as error:
        print(f"readme-figures: {error}", file=sys.stderr)
        return 2
    if stale:
        print(f"readme-figures: {stale} file(s) quote figures that are not {RESULTS}'s:"
              " run python3 scripts/readme-figures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
