"""Write the model index zoo/model_index.json (tools/model_index.py says what it holds), or check it.

    python scripts/model_index.py           # rewrite it
    python scripts/model_index.py --check   # exit 1, naming each stale fact, when it differs
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import model_index  # noqa: E402
from zoo import registry  # noqa: E402
from zoo.guards.writes import atomic_write_bytes  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report what differs (exit 1)")
    args = parser.parse_args(argv)
    fresh = model_index.build()
    stored = json.loads(registry.INDEX_PATH.read_text()) if registry.INDEX_PATH.is_file() else {}
    stale = model_index.differences(stored, fresh)
    if args.check:
        for line in stale:
            print(f"model_index: {line}", file=sys.stderr)
        if stale:
            print(f"model_index: {registry.INDEX_PATH.relative_to(ROOT)} is stale; run python scripts/model_index.py",
                  file=sys.stderr)
        return 1 if stale else 0
    atomic_write_bytes(registry.INDEX_PATH, model_index.serialise(fresh).encode())
    print(f"{registry.INDEX_PATH.relative_to(ROOT)}: {len(fresh['entries'])} entries, {len(stale)} facts changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
