#!/usr/bin/env python3
"""Checks the relative links of the Markdown pages (README.md, docs/*.md, models/README.md, ...):
every [text](path) and [text](path#anchor) whose target is in the repository must name an
existing file, and an anchor must be one of the target page's headings as GitHub renders it
(lowercase; characters other than letters, digits, spaces, '-' and '_' dropped; spaces become
'-'; a repeated heading gets -1, -2, ...). Links to web addresses are not checked (no network).

Usage: scripts/check_links.py [page.md ...]    (default: every tracked *.md)
Prints one line per broken link (page:line: target: why) and exits 1 when there is one, else
prints "check-links: N links in M pages resolve" and exits 0. Called by scripts/check-docs.sh.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans keep their text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def lines_outside_code(path: Path):
    in_code = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            yield number, line


def anchors(path: Path, cache: dict) -> set:
    if path not in cache:
        seen: dict = {}
        out = set()
        for _, line in lines_outside_code(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        # Explicit HTML anchors (<a id="..."> / <a name="...">) count too.
        text = path.read_text(encoding="utf-8")
        out.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
        cache[path] = out
    return cache[path]


def main(argv: list) -> int:
    if argv:
        pages = [Path(p).resolve() for p in argv]
    else:
        listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.split()
        pages = [ROOT / p for p in listed if not p.startswith("tests/data/")]
    cache: dict = {}
    broken = []
    count = 0
    for page in pages:
        for number, line in lines_outside_code(page):
            line = re.sub(r"`[^`]*`", "", line)  # links inside code spans are text
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                count += 1
                file_part, _, anchor = target.partition("#")
                dest = page if not file_part else (page.parent / file_part).resolve()
                where = f"{page.relative_to(ROOT)}:{number}: {target}"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest, cache):
                    broken.append(f"{where}: no heading with anchor #{anchor} in "
                                  f"{dest.relative_to(ROOT)}")
    if broken:
        print(f"check-links: {len(broken)} broken links:", file=sys.stderr)
        for b in broken:
            print(f"  {b}", file=sys.stderr)
        return 1
    print(f"check-links: {count} links in {len(pages)} pages resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
