"""VERL reward function backed by `cudarl-pipe serve`.

VERL calls `compute_score(data_source, solution_str, ground_truth, extra_info)` for each
rollout (custom_reward_function.path = this file, .name = compute_score). The last fenced code
block of the answer goes to POST /v1/evaluate of the kernel-evaluation service for the task
named by `ground_truth` (the task id, from the exported `reward_model` column); the score is
the service's shaped reward (`reward.reward`), the same numbers `rl-train` uses.
`compute_score_batch` scores a whole batch through POST /v1/evaluate/batch (in requests of at
most BATCH_CANDIDATES candidates and BATCH_BYTES of JSON, sent side by side), for VERL's
`batch` reward manager (custom_reward_function.name = compute_score_batch).

`evaluate_async` is what VERL's agent loop awaits: the candidates that coroutines of one event
loop send within CUDARL_BATCH_WAIT_MS of one another (default 20) go as one batch request, and
each coroutine resumes as its own line arrives.

Settings (environment): CUDARL_SERVE_URL (default http://127.0.0.1:8000), CUDARL_SERVE_TOKEN
(bearer token, optional), CUDARL_SERVE_MODE (`compile` or `full`; default: the server's),
CUDARL_SERVE_TIMEOUT_S (default 300), CUDARL_BATCH_WAIT_MS (default 20). A request answered 429
(the service's queue is full) is sent again after its Retry-After, up to RETRIES times. Errors
(no code block, HTTP or network errors, timeouts) score 0 and are counted in `ERRORS` by kind;
they never raise into the trainer.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
import weakref

ERRORS: collections.Counter = collections.Counter()
RETRIES = 30  # 429 answers a request is sent again after (each after its Retry-After)
BATCH_CANDIDATES = 1024  # most candidates per batch request (the service's limit)
BATCH_BYTES = 768 << 10  # most JSON bytes per batch request (the service's default limit is 1 MiB)
BATCH_REQUESTS = 4  # batch requests in flight at once

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
    for attempt in range(RETRIES + 1):
        try:
            return urllib.request.urlopen(req, timeout=timeout + 5)
        except urllib.error.HTTPError as e:
            if e.code != 429 or attempt == RETRIES:
                raise
            time.sleep(float(e.headers.get("Retry-After") or 1))


def _with_mode(candidate: dict) -> dict:
    """`candidate` with the settings' mode, when one is set."""
    mode = _settings()[2]
    return dict(candidate, mode=mode) if mode else candidate


def evaluate(task_id: str, source: str) -> dict:
    """POST /v1/evaluate; returns the verdict JSON (with `reward`). Raises on HTTP errors."""
    with _post("/v1/evaluate", _with_mode({"task_id": task_id, "source": source})) as r:
        return json.load(r)


def evaluate_batch_stream(candidates: list[dict], on_line) -> str | None:
    """POST /v1/evaluate/batch with `candidates` ({task_id, source} each), calling
    `on_line(line)` for each answer line ({index, status, verdict} or {index, status, error}) as
    it arrives. Returns None when the answer ended normally, else why it was cut off. Raises on
    HTTP errors of the whole request."""
    with _post("/v1/evaluate/batch", {"candidates": [_with_mode(c) for c in candidates]}) as r:
        try:
            for line in r:
                if line.strip():
                    on_line(json.loads(line))
        except (http.client.HTTPException, OSError, ValueError, KeyError) as e:
            return f"the answer was cut off: {type(e).__name__}: {e}"
    return None


def _refused(e: Exception) -> dict:
    """The line a candidate gets when its whole batch request failed with `e`: the HTTP status
    of a refusal, else status -1 with the reason (network, timeouts, unusable settings)."""
    if isinstance(e, urllib.error.HTTPError):
        return {"status": e.code}
    return {"status": -1, "error": f"{type(e).__name__}: {e}"}


def evaluate_batch(candidates: list[dict]) -> list[dict]:
    """`evaluate_batch_stream`'s lines in the candidates' order. Never raises: a candidate whose
    line did not come gets status -1 and the reason (the answer was cut off), and a failed
    request gives every candidate `_refused`'s line."""
    lines = {}
    try:
        cut = evaluate_batch_stream(candidates, lambda x: lines.__setitem__(x["index"], x))
    except Exception as e:  # every failure is a line, never an exception
        return [dict(_refused(e), index=i) for i in range(len(candidates))]
    missing = cut or "no line for it in the answer"
    return [lines.get(i, {"index": i, "status": -1, "error": missing}) for i in range(len(candidates))]


def _json_size(candidate: dict) -> int:
    """Bytes `candidate` takes in a batch request's JSON (with its separator)."""
    return len(json.dumps(candidate)) + 2


#: Batch requests of the agent loops' batchers in flight at once (more wait for a thread).
_SENDERS = concurrent.futures.ThreadPoolExecutor(max_workers=4 * BATCH_REQUESTS, thread_name_prefix="cudarl-batch")


class _Batcher:
    """Candidates of one event loop's coroutines gathered for CUDARL_BATCH_WAIT_MS, then sent as
    one batch request (at most BATCH_CANDIDATES and BATCH_BYTES of JSON; more start the next) on
    a sender thread; each coroutine's future gets its line as the line arrives. Only the loop's
    thread calls `submit` and `flush`."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = weakref.ref(loop)
        self.pending: list[tuple[dict, asyncio.Future]] = []
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None

    def submit(self, loop: asyncio.AbstractEventLoop, candidate: dict) -> asyncio.Future:
        n = _json_size(candidate)
        if self.pending and self.size + n > BATCH_BYTES:
            self.flush()
        fut = loop.create_future()
        self.pending.append((candidate, fut))
        self.size += n
        if len(self.pending) >= BATCH_CANDIDATES:
            self.flush()
        elif self.timer is None:
            wait = float(os.environ.get("CUDARL_BATCH_WAIT_MS", "20")) / 1000.0
            self.timer = loop.call_later(wait, self.flush)
        return fut

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending, self.size = self.pending, [], 0
        if batch:
            _SENDERS.submit(self._send, batch)

    def _send(self, batch: list[tuple[dict, asyncio.Future]]) -> None:
        """Sends `batch`; every future gets a line, whatever happens (status -1 with the reason
        where the service gave none)."""

        def answer(i: int, line: dict) -> None:
            fut = batch[i][1]
            if not fut.done():
                fut.set_result(line)

        def post(i, line: dict) -> None:
            loop = self.loop()
            if loop is None or not isinstance(i, int) or not 0 <= i < len(batch):
                return
            try:
                loop.call_soon_threadsafe(answer, i, line)
            except RuntimeError:  # the loop closed: nobody waits for the line
                pass

        missing = {"status": -1, "error": "no line for it in the answer"}
        try:
            cut = evaluate_batch_stream([c for c, _ in batch], lambda x: post(x.get("index"), x))
            missing["error"] = cut or missing["error"]
        except Exception as e:  # the turn scores 0, never hangs
            missing = _refused(e)
        finally:
            for i in range(len(batch)):  # answered ones are done: these change nothing
                post(i, dict(missing, index=i))


_BATCHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def evaluate_async(task_id: str, source: str) -> dict:
    """One candidate's batch line ({index, status, verdict} or {index, status, error}; status -1:
    a network failure, a cut-off answer or unusable settings), sent in a batch request with the
    candidates that other coroutines of this event loop send within CUDARL_BATCH_WAIT_MS. Never
    raises for the service's answers and always returns."""
    loop = asyncio.get_running_loop()
    batcher = _BATCHERS.get(loop)
    if batcher is None:
        batcher = _BATCHERS[loop] = _Batcher(loop)
    return await batcher.submit(loop, {"task_id": task_id, "source": source})


def _chunks(candidates: list[dict]) -> list[list[int]]:
    """`candidates`' indices in runs of at most BATCH_CANDIDATES and BATCH_BYTES of JSON."""
    runs, run, size = [], [], 0
    for i, c in enumerate(candidates):
        n = _json_size(c)
        if run and (len(run) == BATCH_CANDIDATES or size + n > BATCH_BYTES):
            runs.append(run)
            run, size = [], 0
        run.append(i)
        size += n
    return runs + [run] if run else runs


def _failed(error: str) -> dict:
    """A score of 0 for a rollout the service did not judge, counted in ERRORS (the keys of
    `_scored`'s, so VERL's per-key lists of a batch stay aligned)."""
    ERRORS[error.split(":")[0]] += 1
    return {"score": 0.0, "error": error, "compiled": False, "correct": False, "speedup": 0.0, "failure": ""}


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


def line_score(line: dict) -> dict:
    """The score of a batch answer's line (`evaluate_batch`, `evaluate_async`): its verdict's
    (status 200), else 0 as `network` (status -1) or `http_<status>`, counted in ERRORS."""
    status = line["status"]
    if status == 200:
        return _scored(line["verdict"])
    if status == -1:
        return _failed(f"network: {line.get('error')}")
    return _failed(f"http_{status}")


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
    `compute_score` gives each, from POST /v1/evaluate/batch requests of the rollouts with a
    code block (a network failure or a cut-off answer scores what it left unanswered 0, as
    `network`)."""
    codes = [extract_code(s) for s in solution_strs]
    asked = [i for i, c in enumerate(codes) if c is not None]
    candidates = [{"task_id": str(ground_truths[i]), "source": codes[i]} for i in asked]
    chunks = _chunks(candidates)
    with concurrent.futures.ThreadPoolExecutor(max_workers=BATCH_REQUESTS) as pool:
        answered = pool.map(lambda chunk: evaluate_batch([candidates[k] for k in chunk]), chunks)
        lines = [line for chunk_lines in answered for line in chunk_lines]
    scores = [_failed("no_code") if c is None else None for c in codes]
    for i, line in zip((asked[k] for chunk in chunks for k in chunk), lines, strict=True):
        scores[i] = line_score(line)
    return scores


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """`compute_score` off the event loop (for VERL's async reward managers)."""
    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info, **kwargs)
