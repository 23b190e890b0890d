#!/usr/bin/env bash
# `pagedkv generate --cache paged` against llama2.c's run.c (the reference runtime) on the same
# model, tokenizer, prompt and positions, greedy, interleaved in one run: round r runs the two
# programs one after the other, the order alternating (A B, B A, ...), so that both see the same
# load on a shared machine. Reports per round and as medians: tokens/s as each program reports it
# (run.c: "achieved tok/s", the positions after the first over the time after the first forward;
# pagedkv: tokens generated over prefill + decode), their ratio, pagedkv's p50 and mean decode
# step, and each whole process's wall time and CPU time (user + system, from wait4's rusage).
# Checks that both print the same text (the reference equality) and fails if not.
#
# run.c is not part of this repository and nothing of it is committed: build it yourself,
# outside the checkout (docs/benchmarks.md names the commit the project tests against):
#   git -C llama2.c show 350e04f:run.c > /tmp/run.c && gcc -Ofast -march=native /tmp/run.c -lm -o /tmp/run
#
# Usage: scripts/bench-vs-runc.sh RUN_BINARY [ROUNDS]     (or RUNC=path scripts/bench-vs-runc.sh)
# Environment:
#   PAGEDKV   the pagedkv binary (default build/src/cli/pagedkv)
#   STEPS     positions, prompt included (default 512, the model's whole context)
#   PROMPT    default "One day, a big bear" (../shared/reference/llama2c/p12_big_bear_n512)
#   MODEL, TOKENIZER   default models/stories260K.bin, models/tok512.bin
#   PAGEDKV_ARGS       extra flags for pagedkv generate (e.g. "--block-size 32")
#   PAGEDKV_BASELINE   a second pagedkv binary (e.g. a build of an earlier commit), run in the
#                      same rounds and reported the same way: before and after in one run
# Without a run.c binary it prints why and exits 0 (skipped), so CI-like callers can run it.
set -euo pipefail
cd "$(dirname "$0")/.."
runc=${1:-${RUNC:-}}
rounds=${2:-${ROUNDS:-15}}
if [ -z "$runc" ]; then
  echo "bench-vs-runc: skipped: no run.c binary given (build llama2.c's run.c outside the" \
    "repository with gcc -Ofast -march=native run.c -lm -o run, then pass its path)"
  exit 0
fi
[ -x "$runc" ] || { echo "bench-vs-runc: $runc is not an executable" >&2; exit 2; }
pagedkv=${PAGEDKV:-build/src/cli/pagedkv}
[ -x "$pagedkv" ] || { echo "bench-vs-runc: $pagedkv not built (target pagedkv_cli)" >&2; exit 2; }

export BENCH_RUNC="$runc" BENCH_PAGEDKV="$pagedkv" BENCH_ROUNDS="$rounds"
export BENCH_STEPS=${STEPS:-512} BENCH_PROMPT=${PROMPT:-"One day, a big bear"}
export BENCH_MODEL=${MODEL:-models/stories260K.bin} BENCH_TOKENIZER=${TOKENIZER:-models/tok512.bin}
export BENCH_EXTRA=${PAGEDKV_ARGS:-} BENCH_BASELINE=${PAGEDKV_BASELINE:-}
if [ -n "$BENCH_BASELINE" ] && [ ! -x "$BENCH_BASELINE" ]; then
  echo "bench-vs-runc: PAGEDKV_BASELINE=$BENCH_BASELINE is not an executable" >&2
  exit 2
fi
echo "bench-vs-runc: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-vs-runc: OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}" \
  "OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}"
exec python3 - <<'EOF'
import json, os, re, resource, shlex, statistics, subprocess, sys, time

env = os.environ
steps, prompt = env["BENCH_STEPS"], env["BENCH_PROMPT"]
model, tokenizer = env["BENCH_MODEL"], env["BENCH_TOKENIZER"]
programs = {"run.c": [env["BENCH_RUNC"], model, "-z", tokenizer, "-t", "0.0", "-n", steps,
                      "-i", prompt]}
pkv_args = ["generate", "--cache", "paged", "--model", model, "--tokenizer", tokenizer,
            "--steps", steps, "--prompt", prompt, "--json"] + shlex.split(env["BENCH_EXTRA"])
programs["pagedkv"] = [env["BENCH_PAGEDKV"]] + pkv_args
if env["BENCH_BASELINE"]:
    programs["baseline"] = [env["BENCH_BASELINE"]] + pkv_args
for name, cmd in programs.items():
    print(f"{name + ':':9s} {shlex.join(cmd)}")


def run(cmd):
    """Runs cmd; returns stdout, stderr, wall s, CPU s (user + system, from wait4's rusage)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"bench-vs-runc: {cmd[0]} exited {p.returncode}: {p.stderr.decode().strip()}")
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return p.stdout.decode("utf-8", "replace"), p.stderr.decode(), wall, cpu


def measure(name):
    out, err, wall, cpu = run(programs[name])
    if name == "run.c":
        tps = float(re.search(r"achieved tok/s: ([0-9.]+)", err).group(1))
        return {"text": out.rstrip("\n"), "tps": tps, "wall": wall, "cpu": cpu}
    j = json.loads(out)
    m = j["modes"][0]
    return {"text": j["sequences"][0]["text"], "tps": m["tokens_per_s"],
            "p50": m["tpot_ms"]["p50"], "mean": m["tpot_ms"]["mean"], "ttft": m["ttft_ms"],
            "wall": wall, "cpu": cpu}


rounds = []
names = list(programs)
for r in range(int(env["BENCH_ROUNDS"])):
    res = {n: measure(n) for n in (names if r % 2 == 0 else names[::-1])}
    line = f"round {r:2d}: run.c {res['run.c']['tps']:6.0f} tok/s"
    for n in names[1:]:
        if res[n]["text"] != res["run.c"]["text"]:
            sys.exit(f"bench-vs-runc: {n}'s text differs from run.c's: not equal to the peer")
        x = res[n]
        line += (f" | {n} {x['tps']:6.0f} tok/s ratio {x['tps'] / res['run.c']['tps']:.2f}"
                 f" p50 {x['p50']:.3f} mean {x['mean']:.3f} ms")
    line += " | wall/CPU ms " + ", ".join(
        f"{n} {res[n]['wall'] * 1e3:.0f}/{res[n]['cpu'] * 1e3:.0f}" for n in names)
    print(line)
    rounds.append(res)


def med(n, k):
    return statistics.median(x[n][k] for x in rounds)


print(f"over {len(rounds)} rounds (medians; ratio = pagedkv tokens/s / run.c tokens/s of the "
      f"same round):")
print(f"  run.c: {med('run.c', 'tps'):.0f} tok/s (best "
      f"{max(x['run.c']['tps'] for x in rounds):.0f}); whole process wall "
      f"{med('run.c', 'wall') * 1e3:.1f} ms, CPU {med('run.c', 'cpu') * 1e3:.1f} ms")
for n in names[1:]:
    ratios = [x[n]["tps"] / x["run.c"]["tps"] for x in rounds]
    walls = [x[n]["wall"] / x["run.c"]["wall"] for x in rounds]
    print(f"  {n}: {med(n, 'tps'):.0f} tok/s; ratio {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}, >= 1.0 in "
          f"{sum(q >= 1.0 for q in ratios)} of {len(ratios)}); "
          f"decode step p50 {med(n, 'p50'):.3f} ms, mean {med(n, 'mean'):.3f} ms; TTFT "
          f"{med(n, 'ttft'):.2f} ms; whole process wall {med(n, 'wall') * 1e3:.1f} ms "
          f"({statistics.median(walls):.2f}x run.c's), CPU {med(n, 'cpu') * 1e3:.1f} ms "
          f"({med(n, 'cpu') / med('run.c', 'cpu'):.2f}x)")
EOF
