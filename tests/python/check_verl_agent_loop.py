"""The VERL agent loop (python/cudarl_verl/agent_loop.py) inside the real, pinned verl, against a
live `cudarl-pipe serve` (compile mode). Run by tests/serve.rs with CUDARL_SERVE_URL/TOKEN/MODE
set and the task's naive kernel on stdin.

What is real: verl 0.9.1 (its AgentLoopBase, Continuous Token builder, Hydra config composed from
its own ppo_trainer.yaml, the agent registry loaded from our agent_loop.yaml and instantiated
the way AgentLoopWorker does), a Hugging Face fast tokenizer, the HTTP service, nvcc. What is
scripted: the policy (VERL's vLLM/SGLang rollout server cannot run here), which answers with a
broken kernel, then without a code block, then the fixed kernel.
"""

import asyncio
import json
import os
import sys
import urllib.request

import hydra
import verl
import verl.trainer
from cudarl_verl import reward
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

assert verl.__version__ == "0.9.1", verl.__version__
naive = sys.stdin.read()
broken = naive.replace(";", "", 1)
base = os.environ["CUDARL_SERVE_URL"]
req = urllib.request.Request(
    f"{base}/v1/tasks/vector_add", headers={"Authorization": f"Bearer {os.environ['CUDARL_SERVE_TOKEN']}"}
)
task = json.load(urllib.request.urlopen(req))

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(
    [naive, broken, json.dumps(task)],
    trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ),
)
tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
tok.chat_template = CHATML

# verl's own trainer config, with the overrides rl-train (backend = "verl") writes.
reward_py = os.path.join(os.path.dirname(reward.__file__), "reward.py")
overrides = [
    "actor_rollout_ref.rollout.name=vllm",
    f"reward.custom_reward_function.path={reward_py}",
    "reward.custom_reward_function.name=compute_score",
    "data.max_prompt_length=4096",
    "data.max_response_length=4096",
    "actor_rollout_ref.rollout.agent.default_agent_loop=cudarl_kernel_agent",
]
cfg_dir = os.path.join(os.path.dirname(verl.trainer.__file__), "config")
with initialize_config_dir(config_dir=cfg_dir, version_base=None):
    cfg = compose("ppo_trainer", overrides=overrides)
registry = OmegaConf.load(os.path.join(os.path.dirname(reward.__file__), "agent_loop.yaml"))
entry = next(e for e in registry if e.name == "cudarl_kernel_agent")
assert entry._target_ == "cudarl_verl.agent_loop.CudaKernelAgentLoop"


class ScriptedPolicy:
    """Stands in for VERL's rollout server: fixed answers, as token ids of `tok`."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.prompts = []

    async def generate(self, request_id, prompt_ids, sampling_params, **kw):
        self.prompts.append(list(prompt_ids))
        ids = tok.encode(self.answers.pop(0) + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))


async def episode(answers, max_turns=3):
    """One episode of the registered agent loop with a scripted policy: (output, policy)."""
    policy = ScriptedPolicy(answers)
    # Built inside the running event loop, as AgentLoopWorker builds it (the loop captures it).
    loop = hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=policy,
        tokenizer=tok,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
    )
    out = await loop.run(
        {"temperature": 1.0},
        raw_prompt=task["prompt"],
        extra_info={"task_id": "vector_add", "max_turns": max_turns},
        reward_model={"style": "rule", "ground_truth": "vector_add"},
    )
    return out, policy


def run(answers, max_turns=3):
    return asyncio.run(episode(answers, max_turns))


def metric(name):
    """The sum of a counter family of the service's /metrics."""
    text = urllib.request.urlopen(f"{base}/metrics").read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "{"))


fence = lambda code: f"Here is the kernel.\n```cuda\n{code}```"

# compile error -> no code -> fix: three turns, each with the tester's words in between.
out, policy = run([fence(broken), "I am not sure.", fence(naive)])
scores = out.extra_fields["turn_scores"]
assert len(scores) == 3 and scores[0] == 0.0 and scores[1] == 0.0 and scores[2] > 0.0, scores
assert out.extra_fields["turn_failures"][:2] == ["compile_error", "no_code"], out.extra_fields
assert out.reward_score == scores[2] and out.num_turns == 6, (out.reward_score, out.num_turns)
# The tester's messages are in the context of later turns and masked out of the loss.
second = tok.decode(policy.prompts[1])
assert "The tester ran your kernel." in second and "Compilation failed" in second, second[-600:]
assert "line " in second, "compile errors come with their lines"
third = tok.decode(policy.prompts[2])
assert "No code block found" in third, third[-300:]
mask = out.response_mask
assert len(mask) == len(out.response_ids) and 0 in mask and mask[0] == 1 and mask[-1] == 1
policy_tokens = sum(mask)
answered = sum(
    len(tok.encode(a + "<|im_end|>", add_special_tokens=False)) for a in [fence(broken), "I am not sure.", fence(naive)]
)
assert policy_tokens == answered, (policy_tokens, answered)
assert len(out.response_logprobs) == len(mask)
# The prompt part is exactly the task's chat prompt.
prompt_text = tok.apply_chat_template(task["prompt"], add_generation_prompt=True, tokenize=False)
assert tok.decode(out.prompt_ids) == prompt_text, (tok.decode(out.prompt_ids)[-200:], prompt_text[-200:])

# A good first answer ends the episode after one turn when its reward reaches the stop reward.
os.environ["CUDARL_STOP_REWARD"] = str(scores[2])
out1, p1 = run([fence(naive), fence(broken)])
assert out1.extra_fields["turn_scores"] == [scores[2]] and len(p1.answers) == 1, out1.extra_fields
assert all(m == 1 for m in out1.response_mask)

# Episodes of one event loop whose turns end together share one batch request, and each gets
# its own verdict (broken kernels score 0, fixed ones what the fixed kernel scored).
os.environ["CUDARL_BATCH_WAIT_MS"] = "2000"
lines, requests = metric("cudarl_serve_batch_lines_total"), metric("cudarl_serve_responses_total")
kinds = [naive, broken, naive + "// another\n", broken + "// another\n"]


async def side_by_side():
    return await asyncio.gather(*(episode([fence(k)], max_turns=1) for k in kinds))


got = [o.extra_fields["turn_scores"] for o, _ in asyncio.run(side_by_side())]
assert got == [[scores[2]], [0.0], [scores[2]], [0.0]], got
assert metric("cudarl_serve_batch_lines_total") - lines == 4
assert metric("cudarl_serve_responses_total") - requests == 1, "one batch request for the four"
del os.environ["CUDARL_BATCH_WAIT_MS"]

# The turn limit from extra_info.
os.environ["CUDARL_STOP_REWARD"] = "2.0"
out2, _ = run([fence(broken)] * 3, max_turns=2)
assert len(out2.extra_fields["turn_scores"]) == 2, out2.extra_fields
# VERL's own loader finds compute_score from the config, as its reward loop does, and it scores
# through the same service (the fixed kernel scores what its last turn scored).
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402

score_fn = get_custom_reward_fn(cfg)
res = score_fn("cudarl-pipe/tier0", fence(naive), "vector_add", {"task_id": "vector_add"})
assert res["score"] == scores[2] and res["compiled"], res
print("OK", scores)
