"""`make fuzz`: fuzz the ten kinds of untrusted input (tests/test_fuzz.py's generators and checks)
and the writers (tests/test_writer_fuzz.py's state machine: sequences of the commands that write
files, over seeded user files and links) with fresh random draws, kind after kind, until
FUZZ_SECONDS have passed; every failing input (the shrunk one) is saved under
tests/fuzz_corpus/<kind>/ (a writer sequence: tests/fuzz_corpus/writers/<hash>.json, its steps),
where `make test` replays it.

    python tools/fuzz.py --seconds 1200 [--kinds images,boxes,writers] [--json results/fuzz_report.json]

Prints one line per round and kind (cases, correct results, one-line refusals, failures; for the
writers: sequences and their steps) and a summary; exit code 1 when anything failed.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUND_EXAMPLES = 100  # cases per kind before the next kind gets its turn
WRITER_ROUND_EXAMPLES = 10  # command sequences per round (each about ZOO_WRITER_FUZZ_STEPS steps)
WRITERS = "writers"


def fuzz(seconds: float, kinds: list[str] | None = None, examples: int = ROUND_EXAMPLES, log=print) -> dict:
    """Fuzz for `seconds`; returns the summary {kind: {cases, ok, refused, failures: [...]}, ...}."""
    os.environ["ZOO_FUZZ_RANDOM"] = "1"
    for path in (ROOT, ROOT / "tests"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import warnings

    from hypothesis import HealthCheck, given, settings

    import fuzzing
    import test_fuzz
    import test_writer_fuzz

    warnings.simplefilter("ignore")
    kinds = kinds or [*test_fuzz.CHECKS, WRITERS]
    summary = {kind: {"cases": 0, "ok": 0, "refused": 0, "failures": []} for kind in kinds}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zoo-fuzz-") as work:
        world = test_fuzz.make_world(Path(work))
        rounds = 0
        while time.monotonic() - started < seconds:
            rounds += 1
            for kind in kinds:
                if time.monotonic() - started >= seconds:
                    break
                counts = summary[kind]
                if kind == WRITERS:
                    _writer_round(test_writer_fuzz, counts, log)
                    log(f"round {rounds} {kind}: {counts['cases']} sequences of {counts['steps']} steps "
                        f"({counts['ok']} succeeded, {counts['refused']} refused in one line), "
                        f"{len(counts['failures'])} failures ({time.monotonic() - started:.0f} s)")
                    continue
                check, strategy = test_fuzz.CHECKS[kind], test_fuzz.STRATEGIES[kind](world)

                @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                          print_blob=False, suppress_health_check=list(HealthCheck))
                @given(strategy)
                def run(data):
                    counts["cases"] += 1
                    counts[check(world, data)] += 1

                fuzzing.FAILURES.pop(kind, None)
                try:
                    run()
                except Exception as exc:  # a violation: Hypothesis has shrunk it and replayed the minimal input
                    data = fuzzing.FAILURES.get(kind)
                    saved = fuzzing.save_failure(kind, data) if data is not None else None
                    line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
                    where = traceback.extract_tb(exc.__traceback__)[-1]
                    counts["failures"].append({"error": line, "at": f"{Path(where.filename).name}:{where.lineno}",
                                               "saved": str(saved.relative_to(ROOT)) if saved else None})
                    log(f"  {kind}: FAILED {line} ({counts['failures'][-1]['at']}) -> {saved}")
                log(f"round {rounds} {kind}: {counts['cases']} cases, {counts['ok']} correct, {counts['refused']} "
                    f"refused in one line, {len(counts['failures'])} failures ({time.monotonic() - started:.0f} s)")
    return {"seconds": round(time.monotonic() - started, 1), "rounds": rounds, "kinds": summary,
            "cases": sum(c["cases"] for c in summary.values()),
            "failures": sum(len(c["failures"]) for c in summary.values())}


def _writer_round(machine, counts: dict, log) -> None:
    """One round of the writer state machine (fresh draws); a failure's shrunk sequence is kept
    under tests/fuzz_corpus/writers/."""
    counts.setdefault("steps", 0)
    machine.COUNTS.update(sequences=0, steps=0, ok=0, refused=0)
    try:
        with machine.environment():
            machine.run_machine(WRITER_ROUND_EXAMPLES, machine.STEPS, derandomize=False)
    except Exception as exc:  # a violation: Hypothesis has shrunk it and replayed the minimal sequence last
        saved = machine.save_failure(list(machine.LAST_STEPS)) if machine.LAST_STEPS else None
        line, at = machine.format_failure(exc)
        counts["failures"].append({"error": line, "at": at, "saved": str(saved.relative_to(ROOT)) if saved else None})
        log(f"  {WRITERS}: FAILED {line} ({at}) -> {saved}")
        # the sequence as it first failed is kept too: a failure Hypothesis could not replay
        # (FlakyFailure) has no shrunk sequence
        if machine.FAILED:
            steps, error = machine.FAILED[0]
            first = machine.save_failure(steps)
            counts["failures"].append({"error": error, "saved": str(first.relative_to(ROOT))})
            log(f"  {WRITERS}: as first failed: {error} -> {first}")
    finally:
        machine.FAILED.clear()
        for key, total in (("cases", "sequences"), ("steps", "steps"), ("ok", "ok"), ("refused", "refused")):
            counts[key] += machine.COUNTS[total]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 600)))
    parser.add_argument("--kinds", help="comma-separated kinds (default: the ten inputs and writers)")
    parser.add_argument("--json", help="also write the summary here")
    args = parser.parse_args(argv)
    summary = fuzz(args.seconds, args.kinds.split(",") if args.kinds else None)
    print(f"{summary['cases']} cases in {summary['seconds']} s over {summary['rounds']} rounds, "
          f"{summary['failures']} failures")
    if args.json:
        sys.path.insert(0, str(ROOT))
        from zoo.results import write_json

        write_json(args.json, summary)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
