"""VERL reward function backed by `cudarl-pipe serve`.

VERL calls `compute_score(data_source, solution_str, ground_truth, extra_info)` for each
rollout (custom_reward_function.path = this file, .name = compute_score). The last fenced code
block of the answer goes to POST /v1/evaluate of the kernel-evaluation service for the task
named by `ground_truth` (the task id, from the exported `reward_model` column); the score is
the service's shaped reward (`reward.reward`), the same numbers `rl-train` uses.

Settings (environment): CUDARL_SERVE_URL (default http://127.0.0.1:8000), CUDARL_SERVE_TOKEN
(bearer token, optional), CUDARL_SERVE_MODE (`compile` or `full`; default: the server's),
CUDARL_SERVE_TIMEOUT_S (default 300). Errors (no code block, HTTP or network errors, timeouts)
score 0 and are counted in `ERRORS` by kind; they never raise into the trainer.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import urllib.error
import urllib.request

ERRORS: collections.Counter = collections.Counter()

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.S)


def extract_code(text: str) -> str | None:
    """The last fenced code block of `text`, or None."""
    blocks = _FENCE.findall(text or "")
    return blocks[-1] if blocks else None


def _settings() -> tuple[str, str | None, str | None, float]:
    return (
        os.environ.get("CUDARL_SERVE_URL", "http://127.0.0.1:8000").rstrip("/"),
        os.environ.get("CUDARL_SERVE_TOKEN"),
        os.environ.get("CUDARL_SERVE_MODE"),
        float(os.environ.get("CUDARL_SERVE_TIMEOUT_S", "300")),
    )


def evaluate(task_id: str, source: str) -> dict:
    """POST /v1/evaluate; returns the verdict JSON (with `reward`). Raises on HTTP errors."""
    url, token, mode, timeout = _settings()
    body = {"task_id": task_id, "source": source, "deadline_s": timeout}
    if mode:
        body["mode"] = mode
    req = urllib.request.Request(
        f"{url}/v1/evaluate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout + 5) as r:
        return json.load(r)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """VERL's reward-function signature. Returns {"score": float, ...details}."""
    code = extract_code(solution_str)
    if code is None:
        ERRORS["no_code"] += 1
        return {"score": 0.0, "error": "no_code", "compiled": False, "correct": False}
    try:
        v = evaluate(str(ground_truth), code)
    except urllib.error.HTTPError as e:
        ERRORS[f"http_{e.code}"] += 1
        return {"score": 0.0, "error": f"http_{e.code}", "compiled": False, "correct": False}
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        ERRORS["network"] += 1
        return {"score": 0.0, "error": f"network: {e}", "compiled": False, "correct": False}
    r = v.get("reward") or {}
    return {
        "score": float(r.get("reward", 0.0)),
        "error": "",
        "compiled": bool(v.get("compiled")),
        "correct": bool(v.get("correct")),
        "speedup": float(v.get("speedup_vs_naive") or 0.0),
        "failure": v.get("failure") or "",
    }


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """`compute_score` off the event loop (for VERL's async reward managers)."""
    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info, **kwargs)
