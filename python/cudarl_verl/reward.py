"""VERL reward function backed by `cudarl-pipe serve`.

VERL calls `compute_score(data_source, solution_str, ground_truth, extra_info)` for each
rollout (custom_reward_function.path = this file, .name = compute_score). The last fenced code
block of the answer goes to POST /v1/evaluate of the kernel-evaluation service for the task
named by `ground_truth` (the task id, from the exported `reward_model` column); the score is
the service's shaped reward (`reward.reward`), the same numbers `rl-train` uses.
`compute_score_batch` scores a whole batch in one POST /v1/evaluate/batch, for VERL's `batch`
reward manager (custom_reward_function.name = compute_score_batch).

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


def _post(path: str, body: dict):
    """POST `body` as JSON to the service's `path`, with the settings' timeout as its
    `deadline_s` and their token; the open response. Raises on HTTP errors."""
    url, token, _, timeout = _settings()
    req = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(dict(body, deadline_s=timeout)).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return urllib.request.urlopen(req, timeout=timeout + 5)


def _with_mode(candidate: dict) -> dict:
    """`candidate` with the settings' mode, when one is set."""
    mode = _settings()[2]
    return dict(candidate, mode=mode) if mode else candidate


def evaluate(task_id: str, source: str) -> dict:
    """POST /v1/evaluate; returns the verdict JSON (with `reward`). Raises on HTTP errors."""
    with _post("/v1/evaluate", _with_mode({"task_id": task_id, "source": source})) as r:
        return json.load(r)


def evaluate_batch(candidates: list[dict]) -> list[dict]:
    """POST /v1/evaluate/batch with `candidates` ({task_id, source} each); the answer's lines
    in the candidates' order ({index, status, verdict} or {index, status, error}; a candidate
    the answer left out gets status 0). Raises on HTTP errors of the whole request."""
    with _post("/v1/evaluate/batch", {"candidates": [_with_mode(c) for c in candidates]}) as r:
        lines = {(x := json.loads(line))["index"]: x for line in r if line.strip()}
    return [lines.get(i, {"index": i, "status": 0, "error": "no answer"}) for i in range(len(candidates))]


def _failed(error: str) -> dict:
    """A score of 0 for a rollout the service did not judge, counted in ERRORS."""
    ERRORS[error.split(":")[0]] += 1
    return {"score": 0.0, "error": error, "compiled": False, "correct": False}


def _scored(v: dict) -> dict:
    """The score of verdict `v`: its shaped reward, and what it says of the kernel."""
    r = v.get("reward") or {}
    return {
        "score": float(r.get("reward", 0.0)),
        "error": "",
        "compiled": bool(v.get("compiled")),
        "correct": bool(v.get("correct")),
        "speedup": float(v.get("speedup_vs_naive") or 0.0),
        "failure": v.get("failure") or "",
    }


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """VERL's reward-function signature. Returns {"score": float, ...details}."""
    code = extract_code(solution_str)
    if code is None:
        return _failed("no_code")
    try:
        return _scored(evaluate(str(ground_truth), code))
    except urllib.error.HTTPError as e:
        return _failed(f"http_{e.code}")
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        return _failed(f"network: {e}")


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs) -> list[dict]:
    """VERL's batch reward-function signature: the scores of every rollout, in order, as
    `compute_score` gives each, from one POST /v1/evaluate/batch of the rollouts with a code
    block."""
    codes = [extract_code(s) for s in solution_strs]
    asked = [i for i, c in enumerate(codes) if c is not None]
    scores = [_failed("no_code") if c is None else None for c in codes]
    try:
        lines = evaluate_batch([{"task_id": str(ground_truths[i]), "source": codes[i]} for i in asked]) if asked else []
    except urllib.error.HTTPError as e:
        lines = [{"status": e.code, "error": ""} for _ in asked]
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        lines = [{"status": -1, "error": str(e)} for _ in asked]
    for i, line in zip(asked, lines, strict=True):
        status = line["status"]
        if status == 200:
            scores[i] = _scored(line["verdict"])
        elif status == -1:
            scores[i] = _failed(f"network: {line['error']}")
        elif status == 0:
            scores[i] = _failed("no_answer")
        else:
            scores[i] = _failed(f"http_{status}")
    return scores


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """`compute_score` off the event loop (for VERL's async reward managers)."""
    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info, **kwargs)
