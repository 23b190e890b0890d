#!/usr/bin/env python3
"""Mutation testing of pagedkv's core sources (issue 23; docs/reliability.md, "Mutation testing").

Generates mutants of each core source with universalmutator (pinned in
scripts/requirements-ci.txt), builds each mutant against the few test executables that cover
that file (an incremental build: one object, the archive, a relink) and runs them with a
timeout. A mutant is killed when a test fails, timed out when the tests run past the timeout
(counted as detected, as an infinite loop is), survived when every test passes, and
build_failed when it does not compile (excluded from the rate). The kill rate is
(killed + timeout) / (killed + timeout + survived), over the mutants not listed as equivalent in
scripts/mutation-equivalent.txt.

The source under mutation is restored after every mutant, on an exception, on Ctrl-C and on
SIGTERM (a backup copy under the work folder lets scripts/mutation.sh restore it even if this
process is killed). Nothing here runs git: the index and the history are never touched.

Run through scripts/mutation.sh, which provides the virtual environment and the build folder.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The core sources and, for each, the test executables that exercise it. The lists are kept
# short so that a mutant costs seconds (one object, one archive, a few relinks), and cover the
# tests written against that file's behaviour plus the manager-level tests that reach it.
MANAGER_TESTS = ["test_kv_cache_manager", "test_kv_cache_manager_admission",
                 "test_manager_contracts", "test_manager_lifecycle",
                 "test_abort_safety", "test_synchronized_manager"]
CPU_TESTS = ["test_attention", "test_attention_spans"]
TARGETS: dict[str, list[str]] = {
    "src/metadata/block_allocator.cpp": ["test_block_allocator", "test_kv_cache_manager",
                                         "test_abort_safety", "test_check_invariants"],
    "src/metadata/prefix_cache.cpp": ["test_prefix_cache", "test_kv_cache_manager",
                                      "test_manager_lifecycle", "test_check_invariants"],
    "src/metadata/kv_cache_manager.cpp": MANAGER_TESTS,
    "src/metadata/kv_cache_manager_append.cpp": MANAGER_TESTS,
    "src/metadata/kv_cache_manager_prefix.cpp": MANAGER_TESTS + ["test_prefix_cache"],
    "src/metadata/kv_cache_manager_rollback.cpp": MANAGER_TESTS,
    "src/metadata/kv_cache_manager_swap.cpp": MANAGER_TESTS,
    "src/metadata/kv_cache_manager_batch.cpp": ["test_batch_metadata", "test_kv_cache_manager",
                                                "test_eviction_policy", "test_manager_contracts"],
    "src/metadata/batch_metadata.cpp": ["test_batch_metadata", "test_kv_cache_manager",
                                        "test_eviction_policy"],
    "src/metadata/eviction_policy.cpp": ["test_eviction_policy", "test_kv_cache_manager",
                                         "test_manager_contracts"],
    "src/metadata/kept_set.cpp": ["test_eviction_policy", "test_kv_cache_manager",
                                  "test_token_eviction", "test_check_invariants"],
    "src/cpu/attention.cpp": CPU_TESTS,
    "src/cpu/attention_plain.cpp": CPU_TESTS,
    "src/cpu/attention_work.cpp": CPU_TESTS + ["test_attention_fast"],
    "src/cpu/attention_slots.cpp": ["test_token_eviction"],
    "src/storage/host_kv_cache.cpp": ["test_host_kv_cache", "test_kv_placement", "test_swap_data",
                                      "test_quantized_kv_cache", "test_kv_write",
                                      "test_host_kv_cache_external"],
    "src/storage/kv_write.cpp": ["test_host_kv_cache", "test_quantized_kv_cache",
                                 "test_large_offsets", "test_quantized_paths", "test_kv_layer_view",
                                 "test_kv_write"],
    # copy_blocks between views and the view checks.
    "src/storage/kv_layer_view.cpp": ["test_kv_layer_view", "test_host_kv_cache",
                                      "test_kv_placement", "test_attention",
                                      "test_quantized_kv_cache"],
}

STATUSES = ("killed", "timeout", "survived", "build_failed", "equivalent")


@dataclass
class Mutant:
    file: str
    index: int  # universalmutator's number for the file
    line: int  # first changed line, 1-based
    orig: str  # the changed original lines, whitespace-collapsed
    new: str  # what replaced them, whitespace-collapsed
    path: str = ""  # the mutant's text on disk
    status: str = ""
    seconds: float = 0.0
    detail: str = field(default="")

    def key(self) -> tuple[str, str, str]:
        return (self.file, self.orig, self.new)


def collapse(text: str) -> str:
    return " ".join(text.split())


STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"')


def semantic(line: str) -> str:
    """The line without // comments and with string literal contents removed: a mutant that
    changes only these changes an error message or a comment, not behaviour."""
    s = STRING_RE.sub('""', line)
    cut = s.find("//")
    if cut >= 0:
        s = s[:cut]
    return collapse(s)


def describe(orig: list[str], mutant: list[str]) -> tuple[int, list[str], list[str]] | None:
    ops = [op for op in difflib.SequenceMatcher(a=orig, b=mutant, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if not ops:
        return None
    i1 = ops[0][1]
    i2 = ops[-1][2]
    j1 = ops[0][3]
    j2 = ops[-1][4]
    if i1 == i2 and i1 < len(orig):  # an inserted statement: name the line it goes before
        return i1 + 1, orig[i1:i1 + 1], mutant[j1:j2] + orig[i1:i1 + 1]
    return i1 + 1, orig[i1:i2], mutant[j1:j2]


IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Tokens a mutant may bring in that its original line lacked.
NEW_WORDS_OK = {"true", "false", "break", "continue", "return", "nullptr"}
# Operators universalmutator writes that never lex into valid C++ (a <== b is a <= = b).
# A mangled ++i (+*i, +/i), a cast whose template bracket turned into an operator
# (static_cast>=int64_t>) and the same of a scope (max<int32_t>=::max).
BAD_TOKENS = ("<==", ">==", "===", "!==", "+*", "+/", "*+", "/+", "+%", "%+", "-*", "-/", "/-",
              "%-", "-%", ">=::", "<=::", "!=::")
BAD_RE = re.compile(r"_cast(?!<)\W|(?:^|[=(,])\s*[/%]")
# A template's brackets (static_cast<size_t>, std::vector<float>): a mutant that rewrites one
# into an operator (static_cast<size_t==(, std::vector<float<) does not compile.
TEMPLATE_RE = re.compile(r"\w<[\w:]+\s*[*&]?>")


def loop_lines(lines: list[str]) -> list[bool]:
    """For each line, whether it sits inside the braces of a for, while, do or switch body: a
    break or continue inserted anywhere else does not compile."""
    flags, stack = [], []
    for line in lines:
        flags.append(any(stack))
        code = semantic(line)
        opener = bool(re.search(r"\b(for|while|do|switch)\b", code))
        for ch in code:
            if ch == "{":
                stack.append(opener)
                opener = False
            elif ch == "}" and stack:
                stack.pop()
    return flags


def is_noise(orig_lines: list[str], new_lines: list[str]) -> bool:
    """Mutants of comments, of preprocessor lines, or of string literal text only, and mutants
    that cannot compile: a digit rule applied inside a name or a literal (int64_t ->
    int(64-1)_t, 0.0f -> 0.(0+1)f leaves a new name behind) or an operator that never lexes."""
    stripped = [line.strip() for line in orig_lines]
    if stripped and all(s.startswith(("//", "#", "*", "/*")) for s in stripped):
        return True
    a = " ".join(semantic(x) for x in orig_lines)
    b = " ".join(semantic(x) for x in new_lines)
    if set(IDENT_RE.findall(b)) - set(IDENT_RE.findall(a)) - NEW_WORDS_OK:
        return True
    if any(t in b and t not in a for t in BAD_TOKENS) or (BAD_RE.search(b) and
                                                          not BAD_RE.search(a)):
        return True
    if "/*" not in b and Counter(TEMPLATE_RE.findall(a)) - Counter(TEMPLATE_RE.findall(b)):
        return True
    return [semantic(x) for x in orig_lines if semantic(x)] == \
        [semantic(x) for x in new_lines if semantic(x)]


def generate(root: Path, work: Path, mutate: str, files: list[str]) -> dict[str, list[Mutant]]:
    out: dict[str, list[Mutant]] = {}
    for rel in files:
        src = root / rel
        # Cached by content: a later run over the same source reuses the mutant files.
        digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
        mdir = work / "mutants" / rel.replace("/", "_") / digest
        if not (mdir / ".complete").exists():
            shutil.rmtree(mdir.parent, ignore_errors=True)
            mdir.mkdir(parents=True)
            subprocess.run([mutate, str(src), "cpp", "--noCheck", "--mutantDir", str(mdir)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            (mdir / ".complete").touch()
        orig = src.read_text().splitlines()
        in_loop = loop_lines(orig)
        seen: set[str] = set()
        kept: list[Mutant] = []
        pat = re.compile(r"\.mutant\.(\d+)\.cpp$")
        for p in sorted(mdir.glob("*.mutant.*.cpp"), key=lambda q: int(pat.search(q.name).group(1))):
            text = p.read_text()
            norm = collapse(text)
            if norm in seen:
                continue  # the same program as an earlier mutant
            seen.add(norm)
            d = describe(orig, text.splitlines())
            if d is None or is_noise(d[1], d[2]):
                continue
            line, a, b = d
            if len(b) > len(a) and b[0].strip() in ("break;", "continue;") and \
                    (line > len(in_loop) or not in_loop[line - 1]):
                continue  # a break or continue outside any loop: cannot compile
            kept.append(Mutant(rel, int(pat.search(p.name).group(1)), line,
                               collapse(" / ".join(a)), collapse(" / ".join(b)), str(p)))
        out[rel] = kept
    return out


def read_equivalents(path: Path) -> list[dict]:
    """file | line | original ==> mutant | reason, one a line; # starts a comment."""
    entries = []
    if not path.exists():
        return entries
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in raw.split(" | ")]
        if len(parts) != 4 or "==>" not in parts[2]:
            sys.exit(f"{path}:{n}: expected 'file | line | original ==> mutant | reason'")
        orig, new = (collapse(x) for x in parts[2].split("==>", 1))
        entries.append({"file": parts[0], "line": int(parts[1]), "orig": orig, "new": new,
                        "reason": parts[3], "used": False})
    return entries


def select(mutants: dict[str, list[Mutant]], sample: int | None, seed: int) -> list[Mutant]:
    """All mutants, or a seeded sample spread evenly over the files (round robin over each
    file's shuffled list), so that every file gets a kill rate."""
    if sample is None:
        return [m for ms in mutants.values() for m in ms]
    rng = random.Random(seed)
    queues = []
    for rel in sorted(mutants):
        q = list(mutants[rel])
        rng.shuffle(q)
        queues.append(q)
    chosen: list[Mutant] = []
    while len(chosen) < sample and any(queues):
        for q in queues:
            if q and len(chosen) < sample:
                chosen.append(q.pop(0))
    return chosen


class Restorer:
    """Puts a file's original bytes back: after each mutant, on errors and on signals."""

    def __init__(self, backup_dir: Path):
        self.backup_dir = backup_dir
        self.active: tuple[Path, bytes, Path] | None = None

    def apply(self, src: Path, mutant_text: bytes) -> None:
        original = src.read_bytes()
        backup = self.backup_dir / (str(src).lstrip("/").replace("/", "_") + ".orig")
        backup.parent.mkdir(parents=True, exist_ok=True)
        backup.write_text(str(src) + "\n")
        backup.with_suffix(".bytes").write_bytes(original)
        self.active = (src, original, backup)
        src.write_bytes(mutant_text)

    def restore(self) -> None:
        if self.active is None:
            return
        src, original, backup = self.active
        src.write_bytes(original)
        backup.with_suffix(".bytes").unlink(missing_ok=True)
        backup.unlink(missing_ok=True)
        self.active = None


def run_group(cmd: list[str], timeout: float, cwd: Path | None = None) -> tuple[int | None, str]:
    """Runs cmd in its own process group; None as the status when it ran past the timeout."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "GTEST_FAIL_FAST": "1"})
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.communicate()
        return None, ""
    except BaseException:
        kill_group(proc.pid)
        proc.wait()
        raise


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it has exited already


def build(build_dir: Path, targets: list[str], jobs: int, timeout: float) -> tuple[int | None, str]:
    return run_group(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *targets],
                     timeout)


def test_path(build_dir: Path, name: str) -> Path:
    hits = [p for p in build_dir.rglob(name) if p.is_file() and os.access(p, os.X_OK)]
    if not hits:
        sys.exit(f"mutation: test executable {name} not found under {build_dir}")
    return sorted(hits, key=lambda p: len(str(p)))[0]


def run_tests(paths: list[Path], timeouts: dict[Path, float]) -> tuple[str, str]:
    for p in paths:
        rc, out = run_group([str(p), "--gtest_brief=1"], timeouts[p], cwd=p.parent)
        if rc is None:
            return "timeout", p.name
        if rc != 0:
            failed = re.findall(r"\[  FAILED  \] (\S+)", out)
            return "killed", f"{p.name}: {failed[0] if failed else f'exit {rc}'}"
    return "survived", ""


def summarize(ran: list[Mutant], candidates: dict[str, list[Mutant]],
              excluded: dict[str, int]) -> dict:
    per_file = {}
    for rel in candidates:
        counts = {s: 0 for s in STATUSES}
        for m in ran:
            if m.file == rel and m.status in counts:
                counts[m.status] += 1
        detected = counts["killed"] + counts["timeout"]
        judged = detected + counts["survived"]
        per_file[rel] = {**counts, "run": sum(counts.values()),
                         "candidates": len(candidates[rel]), "listed": excluded.get(rel, 0),
                         "kill_rate": (detected / judged) if judged else None}
    tot = {s: sum(f[s] for f in per_file.values()) for s in STATUSES}
    judged = tot["killed"] + tot["timeout"] + tot["survived"]
    tot["kill_rate"] = ((tot["killed"] + tot["timeout"]) / judged) if judged else None
    return {"per_file": per_file, "total": tot}


def table(summary: dict) -> str:
    rows = [("file", "mutants", "sampled", "killed", "timeout", "survived", "build_failed",
             "equivalent", "kill rate")]
    for rel, f in summary["per_file"].items():
        if not f["run"]:
            continue
        rate = "-" if f["kill_rate"] is None else f"{100 * f['kill_rate']:.1f}%"
        rows.append((rel, str(f["candidates"]), str(f["run"]), str(f["killed"]),
                     str(f["timeout"]), str(f["survived"]), str(f["build_failed"]),
                     str(f["equivalent"]), rate))
    t = summary["total"]
    rate = "-" if t["kill_rate"] is None else f"{100 * t['kill_rate']:.1f}%"
    rows.append(("total", "", str(sum(t[s] for s in STATUSES)), str(t["killed"]),
                 str(t["timeout"]), str(t["survived"]), str(t["build_failed"]),
                 str(t["equivalent"]), rate))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--work-dir", type=Path, required=True)
    ap.add_argument("--mutate", default="mutate", help="universalmutator's mutate command")
    grp = ap.add_mutually_exclusive_group()
    grp.add_argument("--sample", type=int, help="a seeded sample of this many mutants")
    grp.add_argument("--all", action="store_true", help="every mutant (hours)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: start no mutant after this (the rest are reported not run)")
    ap.add_argument("--files", default="", help="regex: only the core sources matching it")
    ap.add_argument("--match", default="",
                    help="regex over 'file:line: original ==> mutant': only matching mutants")
    ap.add_argument("--min-kill-rate", type=float, default=None, help="percent; exit 1 below")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="least per-test timeout, seconds (else 5x the unmutated run)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--equivalent", type=Path, default=None)
    ap.add_argument("--list", action="store_true", help="print the selected mutants and stop")
    args = ap.parse_args()
    if not args.all and args.sample is None:
        ap.error("give --sample N (with --seed S) or --all")

    root = args.root.resolve()
    build_dir = args.build_dir.resolve()
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    files = [f for f in TARGETS if re.search(args.files, f)]
    if not files:
        ap.error(f"--files {args.files!r} matches no core source")
    eq_path = args.equivalent or (root / "scripts" / "mutation-equivalent.txt")
    equivalents = read_equivalents(eq_path)

    t0 = time.monotonic()
    generated = generate(root, work, args.mutate, files)
    candidates: dict[str, list[Mutant]] = {}
    excluded: dict[str, int] = {}
    for rel, ms in generated.items():
        # An entry matches by its texts; where the same texts occur at several lines of a file
        # (a `continue` before a closing brace), only the mutant at the entry's line does.
        by_key: dict[tuple[str, str, str], list[Mutant]] = {}
        for m in ms:
            by_key.setdefault(m.key(), []).append(m)

        def entry_for(m: Mutant) -> dict | None:
            for e in equivalents:
                if (e["file"], e["orig"], e["new"]) == m.key() and \
                        (len(by_key[m.key()]) == 1 or e["line"] == m.line):
                    return e
            return None

        keep = []
        for m in ms:
            hit = entry_for(m)
            if hit:  # stays in the sample (which the list thus never shifts), is not run
                hit["used"] = True
                excluded[rel] = excluded.get(rel, 0) + 1
                m.status, m.detail = "equivalent", hit["reason"]
            keep.append(m)
        if args.match:
            keep = [m for m in keep
                    if re.search(args.match, f"{m.file}:{m.line}: {m.orig} ==> {m.new}")]
        candidates[rel] = keep
    for e in equivalents:
        if not e["used"] and e["file"] in files:
            print(f"mutation: note: equivalent entry matches no mutant (stale?): "
                  f"{e['file']}:{e['line']}: {e['orig']} ==> {e['new']}", file=sys.stderr)
    chosen = select(candidates, None if args.all else args.sample, args.seed)
    print(f"mutation: {sum(len(v) for v in candidates.values())} candidate mutants over "
          f"{len(files)} files ({sum(excluded.values())} listed equivalent); running "
          f"{len(chosen)}", flush=True)
    if args.list:
        for m in chosen:
            print(f"{m.file}:{m.line}: {m.orig}  ==>  {m.new}")
        return 0

    # The unmutated sources must build and pass, and give each test its timeout.
    targets_used = sorted({t for m in chosen if not m.status for t in TARGETS[m.file]})
    rc, out = build(build_dir, targets_used, args.jobs, 3600)
    if rc != 0:
        print(out[-4000:])
        sys.exit("mutation: the unmutated build fails")
    paths = {t: test_path(build_dir, t) for t in targets_used}
    timeouts: dict[Path, float] = {}
    for t, p in paths.items():
        s = time.monotonic()
        rc, out = run_group([str(p), "--gtest_brief=1"], 600, cwd=p.parent)
        if rc != 0:
            print(out[-4000:])
            sys.exit(f"mutation: {t} fails on the unmutated sources")
        timeouts[p] = max(args.timeout, 5 * (time.monotonic() - s))

    restorer = Restorer(work / "backup")

    def on_term(signum, frame):  # SIGTERM as Ctrl-C: unwind through the finally below
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    ran: list[Mutant] = []
    interrupted = False
    try:
        for i, m in enumerate(chosen):
            if args.budget is not None and time.monotonic() - t0 > args.budget:
                print(f"mutation: budget of {args.budget:.0f} s spent; {len(chosen) - i} "
                      f"mutants not run", flush=True)
                break
            if m.status == "equivalent":
                ran.append(m)
                continue
            s = time.monotonic()
            src = root / m.file
            try:
                restorer.apply(src, Path(m.path).read_bytes())
                tests = TARGETS[m.file]
                rc, out = build(build_dir, tests, args.jobs, 600)
                if rc != 0:
                    m.status = "build_failed"
                else:
                    m.status, m.detail = run_tests([paths[t] for t in tests], timeouts)
            finally:
                restorer.restore()
            m.seconds = round(time.monotonic() - s, 2)
            ran.append(m)
            print(f"[{i + 1}/{len(chosen)}] {m.status:12} {m.seconds:5.1f}s "
                  f"{m.file}:{m.line}: {m.orig[:60]}  ==>  {m.new[:60]}", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("mutation: interrupted; source restored", file=sys.stderr)
    finally:
        restorer.restore()
        # Leave the build folder as the unmutated sources build it.
        build(build_dir, targets_used, args.jobs, 3600)

    summary = summarize(ran, candidates, excluded)
    report = {"seed": args.seed, "sample": args.sample, "all": args.all, "budget": args.budget,
              "seconds": round(time.monotonic() - t0, 1), "interrupted": interrupted,
              **summary, "mutants": [asdict(m) for m in ran]}
    (work / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    text = table(summary)
    survivors = [m for m in ran if m.status == "survived"]
    if survivors:
        text += "\n\nsurvived (a test is missing, or list it in scripts/mutation-equivalent.txt):\n"
        text += "\n".join(f"  {m.file} | {m.line} | {m.orig} ==> {m.new}" for m in survivors)
    (work / "report.txt").write_text(text + "\n")
    print(text)
    print(f"mutation: {report['seconds']} s; report in {work}/report.{{txt,json}}")
    if interrupted:
        return 130
    rate = summary["total"]["kill_rate"]
    if args.min_kill_rate is not None and rate is not None and 100 * rate < args.min_kill_rate:
        print(f"mutation: kill rate {100 * rate:.1f}% is below --min-kill-rate "
              f"{args.min_kill_rate}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
