"""Multi-turn VERL agent loop for cudarl-pipe kernel tasks (verl==0.9.1).

The same episode as `cudarl-pipe run rl-train`, on VERL's rollout servers: the policy writes a
kernel for the task, the tester (`cudarl-pipe serve`, POST /v1/evaluate/batch: the turns that
the loop's episodes finish within CUDARL_BATCH_WAIT_MS of one another go as one request, see
`cudarl_verl.reward.evaluate_async`) compiles, tests and times it and answers in words
(`feedback`: compile errors with lines, the failing shape, resource findings), the policy
revises in the same conversation, up to `max_turns` (the exported `extra_info.max_turns`),
stopping early once a turn's reward reaches the stop reward (0.8, as rl-train). Only the
policy's own tokens are trained: the tester's messages get response_mask 0.

verl 0.9 removed the Interaction API, so this subclasses `AgentLoopBase` and registers itself
as `cudarl_kernel_agent`, the `agent_name` column of `export --format verl`. VERL finds it
through `actor_rollout_ref.rollout.agent.agent_loop_config_path=<this dir>/agent_loop.yaml`
(python/ on PYTHONPATH of every Ray worker).

The trajectory's reward (`reward_score`, so VERL's reward manager is not called again) is the
shaped reward of the last turn's kernel under the served reward config; every turn's reward is
kept in `extra_fields["turn_scores"]`. Tester failures (service down, timeouts) score the turn
0, are counted in `cudarl_verl.reward.ERRORS` and end the episode; they never raise into VERL.

Settings: the same environment variables as `cudarl_verl.reward` (CUDARL_SERVE_URL, _TOKEN,
_MODE, _TIMEOUT_S), plus CUDARL_STOP_REWARD (default 0.8) and CUDARL_MAX_TURNS (default 5,
when a row has no `extra_info.max_turns`).
"""

from __future__ import annotations

import os
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.utils.profiler import simple_timer

from cudarl_verl import reward as _reward

#: The agent's registered name (the exported Parquet's `agent_name`).
AGENT_NAME = "cudarl_kernel_agent"

#: The user message that carries the tester's feedback into the next turn.
REVISE = (
    "The tester ran your kernel.\n{feedback}\n"
    "Revise the kernel. Answer with one ```cuda code block holding the whole .cu file."
)


async def tester(task_id: str, answer: str) -> tuple[float, str, dict]:
    """Scores one answer through `serve`: (reward, feedback text, verdict or error info).

    No code block, HTTP and network errors score 0 with a feedback line saying so (and are
    counted in `cudarl_verl.reward.ERRORS` by kind).
    """
    code = _reward.extract_code(answer)
    if code is None:
        _reward.ERRORS["no_code"] += 1
        return 0.0, "No code block found. Answer with one ```cuda code block.", {"error": "no_code"}
    line = await _reward.evaluate_async(task_id, code)
    if line["status"] != 200:
        return 0.0, "", {"error": _reward.line_score(line)["error"]}
    v = line["verdict"]
    r = v.get("reward") or {}
    return float(r.get("reward", 0.0)), str(v.get("feedback") or ""), v


@register(AGENT_NAME)
class CudaKernelAgentLoop(AgentLoopBase):
    """generate -> tester feedback -> revise, up to `max_turns`; see the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        self.stop_reward = float(os.environ.get("CUDARL_STOP_REWARD", "0.8"))
        self.default_max_turns = int(os.environ.get("CUDARL_MAX_TURNS", "5"))

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        extra = kwargs.get("extra_info") or {}
        task_id = str(extra.get("task_id") or (kwargs.get("reward_model") or {}).get("ground_truth"))
        max_turns = max(1, int(extra.get("max_turns") or self.default_max_turns))
        metrics: dict[str, Any] = {}
        runtime_ids = await self.ct_build_initial_tokens(messages)
        response_mask: list[int] = []
        logprobs: list[float] = []
        turn_scores: list[float] = []
        failures: list[str] = []
        turns = 0
        while turns < max_turns:
            with simple_timer("generate_sequences", metrics):
                out = await self.server_manager.generate(
                    request_id=uuid4().hex,
                    prompt_ids=runtime_ids,
                    sampling_params=sampling_params,
                )
            turns += 1
            merged, response_mask, lp = await self.ct_merge_assistant_token(
                runtime_ids,
                out.token_ids,
                response_mask,
                logprobs if (logprobs or out.log_probs) else None,
                assistant_logprobs=out.log_probs or None,
            )
            runtime_ids = merged.token_ids
            if lp is not None:
                logprobs = lp
            answer = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
            with simple_timer("tool_calls", metrics):
                score, feedback, verdict = await tester(task_id, answer)
            turn_scores.append(score)
            failures.append(str(verdict.get("error") or verdict.get("failure") or ""))
            if (
                score >= self.stop_reward
                or turns >= max_turns
                or "error" in verdict
                and verdict["error"] != "no_code"
                or len(response_mask) >= self.response_length
            ):
                break
            before = list(messages)
            messages.append({"role": "user", "content": REVISE.format(feedback=feedback)})
            merged, mask, lp = await self.ct_merge_context_msg(
                before, messages, runtime_ids, response_mask, logprobs or None
            )
            if len(mask) >= self.response_length:
                break
            runtime_ids, response_mask = merged.token_ids, mask
            if logprobs:
                logprobs = lp or []
        n = len(response_mask)
        prompt_ids = runtime_ids[: len(runtime_ids) - n]
        response_ids = runtime_ids[len(runtime_ids) - n :]
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[: self.response_length],
            response_mask=response_mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=turn_scores[-1] if turn_scores else 0.0,
            num_turns=2 * turns,
            metrics=metrics,
            extra_fields={},
        )
        output.extra_fields.update(
            {
                "turn_scores": turn_scores,
                "tool_rewards": [],
                "task_id": task_id,
                "turn_failures": failures,
            }
        )
        return output
