"""Provenance for every number we publish: results and benchmark JSON carry the git commit,
the device, the wall time, the seed and the config that produced them."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch

from zoo.guards.writes import atomic_write_bytes, json_text

REPO_ROOT = Path(__file__).resolve().parent.parent


#: tracked paths whose edits cannot change a run's numbers: its outputs (results JSON that earlier
#: runs rewrote), the documentation and the tests. An edit anywhere else marks the commit "-dirty".
NOT_INPUTS = ("results", "docs", "tests")


def git_commit() -> str:
    if os.environ.get("ZOO_COMMIT"):  # the caller knows: a copy of the tree on another machine
        return os.environ["ZOO_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                *(f":(exclude){path}" for path in NOT_INPUTS)], cwd=REPO_ROOT,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


def device_info() -> dict:
    info = {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["device"] = info["cuda_device"]
    else:
        info["device"] = f"cpu ({os.cpu_count()} cores)"
    return info


def provenance() -> dict:
    return {"git_commit": git_commit(), "device": device_info(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    """Write payload + provenance atomically, as strict JSON; returns the path."""
    path = Path(path)
    record = {**payload, **{k: v for k, v in provenance().items() if k not in payload}}
    atomic_write_bytes(path, (json_text(record, indent=2, sort_keys=False, default=str) + "\n").encode())
    return path
