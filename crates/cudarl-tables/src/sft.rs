//! `sft_generator` and `sft_optimizer` (stages `sft-data` and `collab-data`): SFT examples as
//! chat conversations, in the `messages` layout Hugging Face chat datasets and VERL's SFT
//! loader read.

use cudarl_protocol::ChatMessage;
use serde::{Deserialize, Serialize};

/// One row of `sft_generator`: a task prompt answered by a kernel.
///
/// | column | type | meaning |
/// |---|---|---|
/// | example_id | utf8 | blake3 of `messages_json` |
/// | task_id, tier | utf8, int64 | the family |
/// | split | utf8 | `train`, `val`, `test`, `rl` (SFT trains on `train` only) |
/// | kernel_id | utf8 | the answer's kernel |
/// | validated | utf8 | `correct` (ran on a GPU) or `compile-only` |
/// | messages | list<struct<role: utf8, content: utf8>> | VERL's / `datasets`' chat `messages` column |
/// | messages_json | utf8 | the same as a JSON array |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftGeneratorRow {
    /// BLAKE3 hex of `messages_json`.
    pub example_id: String,
    /// The family.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// `train`, `val`, `test` or `rl`.
    pub split: String,
    /// The answer's kernel.
    pub kernel_id: String,
    /// `correct` or `compile-only`.
    pub validated: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// The conversation as a JSON array.
    pub messages_json: String,
}

crate::table_row!(SftGeneratorRow, "sft_generator");

/// One row of `sft_optimizer`: a kernel and its feedback answered by a faster or repaired one.
/// The columns of [`SftGeneratorRow`], then:
///
/// | column | type | meaning |
/// |---|---|---|
/// | base_kernel_id | utf8 | the slower (or broken: `<kernel_id>#<breakage>`) kernel |
/// | speedup | float64, nullable | base median / answer median |
/// | measured | bool | `speedup` was measured |
/// | kind | utf8 | `optimize`, or `repair:<breakage>` for a repair example (`repair:no_code`: the answer had no code block) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftOptimizerRow {
    /// BLAKE3 hex of `messages_json`.
    pub example_id: String,
    /// The family.
    pub task_id: String,
    /// Its tier.
    pub tier: i64,
    /// `train`, `val`, `test` or `rl`.
    pub split: String,
    /// The answer's kernel.
    pub kernel_id: String,
    /// `correct` or `compile-only`.
    pub validated: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// The conversation as a JSON array.
    pub messages_json: String,
    /// The kernel revised.
    pub base_kernel_id: String,
    /// Base median / answer median.
    pub speedup: Option<f64>,
    /// Whether `speedup` was measured.
    pub measured: bool,
    /// `optimize` or `repair:<breakage>`.
    pub kind: String,
}

crate::table_row!(SftOptimizerRow, "sft_optimizer");

impl From<SftOptimizerRow> for SftGeneratorRow {
    /// The example without the optimizer's columns.
    fn from(r: SftOptimizerRow) -> Self {
        SftGeneratorRow {
            example_id: r.example_id,
            task_id: r.task_id,
            tier: r.tier,
            split: r.split,
            kernel_id: r.kernel_id,
            validated: r.validated,
            messages: r.messages,
            messages_json: r.messages_json,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, Int64Array, ListBuilder, StringArray, StringBuilder, StructBuilder,
    };
    use arrow::datatypes::{DataType, Field, Fields, Schema};
    use arrow::record_batch::RecordBatch;

    use super::*;
    use crate::TableRow;

    fn message_fields() -> Fields {
        Fields::from(vec![
            Field::new("role", DataType::Utf8, false),
            Field::new("content", DataType::Utf8, false),
        ])
    }

    /// The generator table written from rows is byte for byte the table written column by
    /// column with Arrow's builders (the `messages` layout of VERL and `datasets`), so its
    /// store hash does not move.
    #[test]
    fn rows_make_the_same_parquet_bytes_as_columns() {
        let conv = |a: &str| {
            vec![
                ChatMessage::new("user", format!("task {a}")),
                ChatMessage::new("assistant", "```cuda\n__global__ void k() {}\n```"),
            ]
        };
        let rows: Vec<SftGeneratorRow> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, a)| SftGeneratorRow {
                example_id: format!("id{i}"),
                task_id: (*a).into(),
                tier: i as i64,
                split: "train".into(),
                kernel_id: format!("k{i}"),
                validated: "correct".into(),
                messages: conv(a),
                messages_json: "[]".into(),
            })
            .collect();
        let item = Field::new("item", DataType::Struct(message_fields()), true);
        let mut lb = ListBuilder::new(StructBuilder::from_fields(message_fields(), 0))
            .with_field(Arc::new(item.clone()));
        for r in &rows {
            for m in &r.messages {
                let sb = lb.values();
                sb.field_builder::<StringBuilder>(0)
                    .unwrap()
                    .append_value(&m.role);
                sb.field_builder::<StringBuilder>(1)
                    .unwrap()
                    .append_value(&m.content);
                sb.append(true);
            }
            lb.append(true);
        }
        let s = |f: fn(&SftGeneratorRow) -> &str| -> ArrayRef {
            Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
        };
        let schema = Schema::new(vec![
            Field::new("example_id", DataType::Utf8, false),
            Field::new("task_id", DataType::Utf8, false),
            Field::new("tier", DataType::Int64, false),
            Field::new("split", DataType::Utf8, false),
            Field::new("kernel_id", DataType::Utf8, false),
            Field::new("validated", DataType::Utf8, false),
            Field::new("messages", DataType::List(Arc::new(item)), false),
            Field::new("messages_json", DataType::Utf8, false),
        ]);
        assert_eq!(*SftGeneratorRow::schema(), schema);
        let by_columns = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                s(|r| &r.example_id),
                s(|r| &r.task_id),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.tier).collect::<Vec<_>>(),
                )),
                s(|r| &r.split),
                s(|r| &r.kernel_id),
                s(|r| &r.validated),
                Arc::new(lb.finish()),
                s(|r| &r.messages_json),
            ],
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
        crate::write(&a, &rows).unwrap();
        cudarl_data::write_parquet(&b, &by_columns).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(
            crate::read::<SftGeneratorRow>(&a, "sft_generator").unwrap(),
            rows
        );
        let opt = SftOptimizerRow::schema();
        let names: Vec<&str> = opt.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names[8..],
            ["base_kernel_id", "speedup", "measured", "kind"]
        );
        assert!(opt.field(9).is_nullable() && !opt.field(10).is_nullable());
    }
}
