"""Every alert rule of monitoring/alerts.yml names its entry in docs/runbook.md (runbook_url),
and that entry exists: a `## <AlertName>` heading. Run by monitoring/test.sh."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    # One block per rule, from its `- alert:` line to the next (the file's layout; promtool
    # checks the YAML itself).
    blocks = re.split(r"^\s*- alert: ", (ROOT / "monitoring/alerts.yml").read_text(), flags=re.MULTILINE)[1:]
    headings = set(re.findall(r"^## (\w+)$", (ROOT / "docs/runbook.md").read_text(), re.MULTILINE))
    problems = []
    for block in blocks:
        name = block.split()[0]
        url = next(iter(re.findall(r'^\s*runbook_url: "([^"]*)"$', block, re.MULTILINE)), None)
        if url != f"docs/runbook.md#{name.lower()}":
            problems.append(f"{name}: runbook_url is {url!r}, not 'docs/runbook.md#{name.lower()}'")
        if name not in headings:
            problems.append(f"{name}: docs/runbook.md has no '## {name}' entry")
    for problem in problems:
        print(f"check_runbook: {problem}", file=sys.stderr)
    print(f"check_runbook: {len(blocks)} rules, each with its runbook entry" if not problems else "check_runbook: failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
