//! The trainer protocol of cudarl-pipe (docs/architecture.md, "The trainer protocol"): the job
//! files the pipeline writes for `cudarl-pipe-train`, the events a job prints, the requests and
//! answers of the RL trainer (`rl-serve`), chat messages and agent roles. Both sides use these
//! types: the pipeline, which does not link libtorch, and the trainer, which does. Every struct
//! denies unknown fields, so a field one side renames fails loudly on the other.

pub mod chat;
pub mod job;
pub mod rl;

pub use chat::{ChatMessage, Role};
pub use job::{
    DecodePathName, Device, Document, Event, Finish, Job, LORA_PROJECTIONS, LoraConfig, ModelSpec,
    Precision, RandomInit, SampleLine, StepMetrics, TrainConfig, Weights,
};
pub use rl::{
    Algorithm, Completion, Generated, GpuMemory, PgConfig, Ptx, Reply, Request, RlServe, Sample,
    UpdateStats,
};
