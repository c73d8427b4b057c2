"""Checks exported Parquet with pyarrow and polars against the documented schemas.

Usage: python check_export.py EXPORT_DIR   (prints OK, exits non-zero on any mismatch)
"""

import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

out = Path(sys.argv[1])

CURRICULUM = [
    ("problem_id", pa.string(), False),
    ("source", pa.string(), False),
    ("level", pa.int64(), True),
    ("name", pa.string(), False),
    ("tier", pa.int64(), False),
    ("tier_reason", pa.string(), False),
    ("op_features", pa.list_(pa.string()), False),
    ("op_categories", pa.list_(pa.string()), False),
    ("unknown_ops", pa.list_(pa.string()), False),
    ("split", pa.string(), False),
    ("archive_kernels", pa.int64(), False),
    ("archive_claimed_correct", pa.int64(), False),
    ("archive_best_claimed_speedup", pa.float64(), True),
    ("archive_reference_drift", pa.bool_(), False),
    ("signature", pa.string(), True),
    ("train_shapes", pa.string(), True),
    ("holdout_shapes", pa.string(), True),
    ("validated_kernels", pa.int64(), False),
    ("best_validated_speedup", pa.float64(), True),
]
GATES = [
    ("tier", pa.int64(), False),
    ("min_compile_rate", pa.float64(), False),
    ("min_pass_rate", pa.float64(), False),
    ("problems", pa.int64(), False),
    ("train", pa.int64(), False),
    ("val", pa.int64(), False),
    ("test", pa.int64(), False),
]


def check(path, expected):
    schema = pq.read_schema(path)
    got = [(f.name, f.type, f.nullable) for f in schema]
    assert [g[0] for g in got] == [e[0] for e in expected], f"{path}: columns {got}"
    for (n, t, nl), (_en, et, enl) in zip(got, expected, strict=True):
        assert t == et, f"{path}: column {n} type {t} != {et}"
        assert nl == enl, f"{path}: column {n} nullable {nl} != {enl}"
    return pq.read_table(path)


# `export NODE --to out`: one folder per node.
cur = check(out / "curriculum" / "curriculum.parquet", CURRICULUM)
gates = check(out / "curriculum" / "gates.parquet", GATES)
# 250 KernelBench problems (levels 1-3) + the test project's 2 synthetic task families.
assert cur.num_rows == 252, cur.num_rows
assert set(cur.column("split").to_pylist()) == {"train", "val", "test"}
assert set(cur.column("tier").to_pylist()) == {0, 1, 2, 3}
assert sum(gates.column("problems").to_pylist()) == 252

df = pl.read_parquet(out / "curriculum" / "curriculum.parquet")
assert df.height == 252
synth = df.filter(pl.col("source") == "synthetic").sort("problem_id")
assert synth["problem_id"].to_list() == ["synth/row_sum", "synth/vector_add"], synth
assert synth["signature"][1].startswith('extern "C" void launch(const float* a'), synth
assert synth["validated_kernels"].to_list() == [0, 0]  # compile-only: nothing validated
assert df.schema["op_features"] == pl.List(pl.String)
relu = df.filter(pl.col("problem_id") == "kb/L1/19_ReLU")
assert relu["tier"][0] == 0 and relu["op_features"][0].to_list() == ["torch.relu"], relu
per_tier = df.group_by("tier").len().sort("tier")
assert per_tier["len"].sum() == 252

kernels = pl.read_parquet(out / "ingest-sakana" / "kernels.parquet")
assert kernels.height == 102
# CUDA-L1's `kernels.parquet`, exported into the same folder, is in its own.
assert pl.read_parquet(out / "ingest-cuda-l1" / "kernels.parquet").height != 102
assert kernels["kernel_id"].str.len_chars().unique().to_list() == [64]
assert kernels.schema["ncu_metrics"] == pl.List(
    pl.Struct({"name": pl.String, "unit": pl.String, "avg_value": pl.Float64, "variance": pl.Float64, "n": pl.Int64})
)
# 78 of the 102 sample rows carry an NCU profile (26 correct rows per level).
assert kernels["ncu_achieved_occupancy_pct"].is_not_null().sum() == 78

# `export curriculum --format verl`: VERL's RL and SFT layouts, read with pyarrow the way
# verl's RLHFDataset / SFT dataset read them (datasets.Dataset.from_parquet is pyarrow).
verl = out / "verl"
if verl.exists():
    msg = pa.list_(pa.struct([pa.field("role", pa.string(), False), pa.field("content", pa.string(), False)]))
    rl_ids = {}
    for split in ["train", "test"]:
        t = pq.read_table(verl / f"rl_{split}.parquet")
        assert t.schema.field("prompt").type == msg, t.schema
        assert t.schema.field("data_source").type == pa.string()
        assert t.schema.field("ability").type == pa.string()
        rm = t.schema.field("reward_model").type
        assert rm == pa.struct([pa.field("style", pa.string(), False), pa.field("ground_truth", pa.string(), False)]), (
            rm
        )
        ei = t.schema.field("extra_info").type
        assert [f.name for f in ei] == ["split", "index", "task_id", "tier", "max_turns"], ei
        rows = t.to_pylist()
        for i, r in enumerate(rows):
            assert r["agent_name"] == "cudarl_kernel_agent"
            assert r["prompt"][0]["role"] == "system" and r["prompt"][1]["role"] == "user"
            assert r["reward_model"] == {"style": "rule", "ground_truth": r["extra_info"]["task_id"]}
            assert r["extra_info"]["split"] == split and r["extra_info"]["index"] == i
            assert r["extra_info"]["max_turns"] == 3
            tid = r["extra_info"]["task_id"]
            if tid.startswith("kb/"):
                # A KernelBench problem: its level, its PyTorch source and the launcher kb-specs derived.
                assert r["data_source"] == f"kernelbench/level{tid.split('/')[1][1:]}", r["data_source"]
                user = r["prompt"][1]["content"]
                assert "```python" in user and "class Model" in user and 'extern "C" void launch(' in user, user
            else:
                assert r["data_source"] == f"cudarl-pipe/tier{r['extra_info']['tier']}"
        rl_ids[split] = {r["extra_info"]["task_id"] for r in rows}
    # The hold-out families are VERL's validation set, and never in its training set.
    families = {k: {i for i in v if not i.startswith("kb/")} for k, v in rl_ids.items()}
    assert families["test"] == {"row_sum"}, rl_ids
    assert families["train"] == {"vector_add"}, rl_ids
    # KernelBench problems with a native signature: the curriculum's train and test splits.
    kb = {k: {i for i in v if i.startswith("kb/")} for k, v in rl_ids.items()}
    assert kb["train"] and not kb["train"] & kb["test"], kb
    print("kernelbench rows:", {k: len(v) for k, v in kb.items()})
    for split in ["train", "val"]:
        t = pq.read_table(verl / f"sft_{split}.parquet")
        assert t.schema.field("messages").type == msg
        ids = set(t.column("task_id").to_pylist())
        assert "row_sum" not in ids, ids
        assert all(m[-1]["role"] == "assistant" and "```" in m[-1]["content"] for m in t.column("messages").to_pylist())
print("OK")
