#!/usr/bin/env python3
"""Checks the links of every Markdown file of the repository.

    python3 scripts/check-links.py [ROOT]      # ROOT: the repository (default: this checkout)
    python3 scripts/check-links.py --self-test

Every relative link (inline, image, reference definition or HTML href/src) must name a file or
directory that exists, and its #anchor, in this file or another Markdown file, must be the
GitHub-style slug of one of that file's headings (or an explicit <a id/name>). External links
are not fetched (the tests run on loopback only): an http(s) link must only be well formed, and
no scheme but http, https and mailto is accepted. Code blocks and code spans are skipped.

Prints one line per problem, `file:line: link: why`, and exits 1 if there is any. Standard
library only. Skips target/, node_modules/ and .git/.
"""

import os
import re
import sys
import tempfile
import urllib.parse

SKIPPED_DIRS = {"target", "node_modules", ".git"}

FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# A code span: backticks, text not crossing a blank line, the same number of backticks.
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
# [text](target "title") and ![alt](target): the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*(<[^>\n]*>|\S+)", re.M)
LOOSE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^)\n]*)\)")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*(\"[^\"]*\"|'[^']*')", re.I)
HTML_ANCHOR = re.compile(r"<a\b[^>]*?\b(?:id|name)\s*=\s*(\"[^\"]*\"|'[^']*')", re.I)
AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]*)>")
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def markdown_files(root):
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.lower().endswith(".md"):
                yield os.path.join(directory, name)


def blank(text):
    """The text with the same length and line breaks, every other character a space."""
    return re.sub(r"[^\n]", " ", text)


def without_code(text):
    """The text with fenced code blocks and code spans blanked out, lines kept in place."""
    lines = text.split("\n")
    fence = None
    for i, line in enumerate(lines):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            lines[i] = blank(line)
        elif fence is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                    and line.strip() == match.group(1):
                fence = None
            lines[i] = blank(line)
    return CODE_SPAN.sub(lambda m: blank(m.group(0)), "\n".join(lines))


def heading_text(raw):
    """What GitHub renders of a heading's Markdown: link texts, no code marks, tags or emphasis."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*|~~)", "", text)
    return text


def slug(text):
    """The anchor GitHub gives a heading: lower case, punctuation but - and _ dropped,
    spaces made hyphens."""
    text = heading_text(text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor a file offers: its headings' slugs (GitHub numbers repeats -1, -2, …) and
    explicit <a id> / <a name>."""
    found, seen = set(), {}
    stripped = without_code(text)
    # Where headings are is read without code blocks; what they say, from the text itself.
    lines, original = stripped.split("\n"), text.split("\n")
    for i, line in enumerate(lines):
        heading = None
        if ATX_HEADING.match(line):
            heading = ATX_HEADING.match(original[i]).group(2)
        elif i > 0 and SETEXT_UNDERLINE.match(line) and lines[i - 1].strip() \
                and not lines[i - 1].lstrip().startswith(("|", "-", "*", "+", ">")) \
                and not ATX_HEADING.match(lines[i - 1]):
            heading = original[i - 1].strip()
        if heading is None:
            continue
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    for match in HTML_ANCHOR.finditer(stripped):
        found.add(match.group(1)[1:-1])
    return found


def links(text):
    """(line number, link target) of every link outside code, in order."""
    stripped = without_code(text)
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEFINITION, HTML_LINK, AUTOLINK):
        for match in pattern.finditer(stripped):
            target = match.group(1)
            if target[:1] in "\"'<" and target[-1:] in "\"'>":
                target = target[1:-1]
            found.append((stripped.count("\n", 0, match.start(1)) + 1, target, None))
    # What looks like a link but is not one (GitHub shows it as text): a space in the target.
    links_at = {match.start() for match in INLINE_LINK.finditer(stripped)}
    for match in LOOSE_LINK.finditer(stripped):
        if match.start() not in links_at:
            found.append((stripped.count("\n", 0, match.start(1)) + 1, match.group(1), "not a link: a space in the target?"))
    return sorted(found)


def external_problem(target):
    parsed = urllib.parse.urlsplit(target)
    if parsed.scheme == "mailto":
        return None if re.fullmatch(r"mailto:[^@\s]+@[^@\s]+\.[^@\s]+", target) else "not a mail address"
    if not parsed.netloc or not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", parsed.netloc.rsplit("@", 1)[-1]):
        return "no valid host"
    if "." not in parsed.hostname and parsed.hostname != "localhost":
        return "no valid host"
    if re.search(r"\s", target):
        return "a space in the URL"
    return None


def check_file(root, path, anchor_cache):
    """The problems of one file: (line, link, why)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems = []

    def anchors_of(file):
        if file not in anchor_cache:
            with open(file, encoding="utf-8") as f:
                anchor_cache[file] = anchors(f.read())
        return anchor_cache[file]

    for line, target, malformed in links(text):
        if malformed:
            problems.append((line, target, malformed))
            continue
        if not target:
            problems.append((line, target, "an empty link"))
            continue
        scheme = SCHEME.match(target)
        if scheme:
            if scheme.group(1).lower() not in ("http", "https", "mailto"):
                problems.append((line, target, f"scheme {scheme.group(1)!r} is not http, https or mailto"))
            else:
                why = external_problem(target)
                if why:
                    problems.append((line, target, f"malformed external link: {why}"))
            continue
        if target.startswith("//"):
            problems.append((line, target, "a protocol-relative link: write https://"))
            continue
        location, _, anchor = target.partition("#")
        location = urllib.parse.unquote(location.split("?", 1)[0])
        if location.startswith("/"):
            resolved = os.path.normpath(os.path.join(root, location.lstrip("/")))
        elif location:
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), location))
        else:
            resolved = path
        if not os.path.exists(resolved):
            problems.append((line, target, f"{os.path.relpath(resolved, root)} does not exist"))
            continue
        if os.path.relpath(resolved, root).split(os.sep)[0] == "..":
            problems.append((line, target, "points outside the repository"))
            continue
        if anchor:
            anchor = urllib.parse.unquote(anchor)
            if os.path.isdir(resolved) or not resolved.lower().endswith(".md"):
                problems.append((line, target, f"an anchor into {os.path.relpath(resolved, root)}, which is not a Markdown file"))
            elif anchor not in anchors_of(resolved):
                problems.append((line, target, f"no heading of {os.path.relpath(resolved, root)} has the anchor #{anchor}"))
    return problems


def check(root):
    """Every problem under root, as printable lines."""
    root = os.path.abspath(root)
    anchor_cache = {}
    report = []
    for path in markdown_files(root):
        for line, target, why in check_file(root, path, anchor_cache):
            report.append(f"{os.path.relpath(path, root)}:{line}: {target}: {why}")
    return report


def self_test():
    """The checker on a made-up tree: what must pass passes, and each kind of fault is found."""
    files = {
        "README.md": """# Title

## Two `words`, and more: here!

See [docs](docs/page.md), [a section](docs/page.md#a-section), [here](#two-words-and-more-here),
[the dir](docs), ![image](docs/shot.png), <https://example.com/x> and [mail](mailto:a@example.com).
[twice](#notes-1) [explicit](#kept) <a id="kept"></a>

## Notes

## Notes

```sh
[not a link](missing.md)
```

`[not a link either](missing.md)`

[broken file](docs/missing.md)
[broken anchor](docs/page.md#no-such-section)
[broken local anchor](#nowhere)
[bad url](https://exa mple.com) [bad scheme](javascript:alert(1)) [no host](https:///path)

[ref]: docs/gone.md
""",
        "docs/page.md": "# Page\n\n## A section\n\nBack to [the top](../README.md#title).\n",
        "docs/shot.png": "",
    }
    expected = {
        "README.md:19: docs/missing.md: docs/missing.md does not exist",
        "README.md:20: docs/page.md#no-such-section: no heading of docs/page.md has the anchor #no-such-section",
        "README.md:21: #nowhere: no heading of README.md has the anchor #nowhere",
        "README.md:22: https://exa mple.com: not a link: a space in the target?",
        "README.md:22: javascript:alert(1): scheme 'javascript' is not http, https or mailto",
        "README.md:22: https:///path: malformed external link: no valid host",
        "README.md:24: docs/gone.md: docs/gone.md does not exist",
    }
    with tempfile.TemporaryDirectory() as root:
        for name, content in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(content)
        report = set(check(root))
    assert slug("Guarantees, and the test that holds each") == "guarantees-and-the-test-that-holds-each"
    assert slug("`outbox_enqueue(topic, payload)`") == "outbox_enqueuetopic-payload"
    assert slug("On managed PostgreSQL — the SQL install") == "on-managed-postgresql--the-sql-install"
    if report != expected:
        for line in sorted(report - expected):
            print(f"check-links self-test: reported but not expected: {line}", file=sys.stderr)
        for line in sorted(expected - report):
            print(f"check-links self-test: expected but not reported: {line}", file=sys.stderr)
        return 1
    print(f"check-links self-test: {len(expected)} faults found as expected")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) > 2 or argv[1:2] and argv[1].startswith("-"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    report = check(root)
    for line in report:
        print(line)
    if report:
        print(f"check-links: {len(report)} broken link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
