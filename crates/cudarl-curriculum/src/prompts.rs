//! The prompt formats of the agents, shared by SFT data and RL episodes (one template, so what
//! a model is fine-tuned on is what it sees in rollouts). Messages use the chat roles
//! `system`, `user`, `assistant`; models render them with ChatML (`cudarl_train::tokenizer`).
//!
//! Generator: system [`GENERATOR_SYSTEM`]; user = [`task_prompt`]; assistant = one fenced
//! ```` ```cuda ```` block with the whole source file.
//!
//! Optimizer: system [`OPTIMIZER_SYSTEM`]; user = [`task_prompt`] + the current kernel + the
//! tester's feedback ([`optimizer_prompt`]); assistant = the revised kernel, same fence.

/// The generator's system message.
pub const GENERATOR_SYSTEM: &str = "You are an expert CUDA engineer. You write correct, fast CUDA kernels that implement exactly the requested launcher.";

/// The optimizer's system message.
pub const OPTIMIZER_SYSTEM: &str = "You are an expert CUDA performance engineer. You revise a CUDA kernel using the tester's feedback: keep it correct, make it faster.";

pub use cudarl_protocol::ChatMessage;

/// What a task prompt says about a task. Not the task id: a generated family's id
/// (`gen_ew_292`) names nothing, and with it in every SFT prompt the `small` model recalled
/// kernels by id instead of reading the description; on a family it had not seen its first
/// turn wrote some other expression (2 of 96 generator turns carried the asked expression on
/// the H100, 2026-11-23, while the optimizer, which reads a kernel beside the description,
/// copied it in 66 of 192 turns).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView<'a> {
    /// Tier 0..3.
    pub tier: i64,
    /// What `launch` computes.
    pub description: &'a str,
    /// Element type (`f32`, `f16`, `bf16`).
    pub dtype: &'a str,
    /// The exact launcher declaration.
    pub signature: &'a str,
    /// Example shapes shown (JSON objects of sizes), possibly none.
    pub shapes: &'a [String],
}

/// Phrasings of the opening line; SFT data varies them so a model does not learn one string.
pub const INTROS: [&str; 6] = [
    "Write a CUDA kernel for the following task.",
    "Implement this operation as a CUDA kernel.",
    "Task: write CUDA code for the operation below.",
    "Please provide a CUDA implementation of this task.",
    "Write the CUDA source file for this kernel task.",
    "Implement the following in CUDA.",
];

/// Phrasings of the closing instruction.
pub const CLOSINGS: [&str; 4] = [
    "Answer with the complete .cu file in one ```cuda block.",
    "Reply with one ```cuda code block containing the whole source file.",
    "Give the full CUDA source in a single ```cuda block, nothing else is needed.",
    "Return the complete kernel file inside a ```cuda fenced block.",
];

/// The user message describing a task, with phrasing variant `intro` / `closing` (indices
/// modulo [`INTROS`] / [`CLOSINGS`]; RL uses 0, 0).
pub fn task_prompt(t: &TaskView<'_>, intro: usize, closing: usize) -> String {
    let mut s = format!(
        "{}\n\nTask (tier {}): {}\nElement type: {}.\nDefine exactly this launcher; it must enqueue all its work on `stream` and return without synchronizing:\n\n{};\n",
        INTROS[intro % INTROS.len()],
        t.tier,
        t.description,
        t.dtype,
        t.signature
    );
    if t.shapes.is_empty() {
        s.push_str(
            "\nIt is tested on the sizes above and on others, including ones that are not multiples of any block size.\n",
        );
    } else {
        s.push_str(&format!(
            "\nIt is tested on shapes such as {} and on other sizes, including ones that are not multiples of any block size.\n",
            t.shapes.join(", ")
        ));
    }
    s.push('\n');
    s.push_str(CLOSINGS[closing % CLOSINGS.len()]);
    s
}

/// What a task prompt says of a task stated as a KernelBench-style problem (`code`: the PyTorch
/// `Model`, its constants, `get_inputs` and `get_init_inputs`): its `forward` is what the
/// launcher computes, with the module's parameters (its state dict, in order) passed as
/// inputs after the forward inputs, as `kb-specs` derives the signature (docs/architecture.md,
/// "The task language"). Every task, generated family or KernelBench problem, is shown so.
pub fn module_description(code: &str) -> String {
    format!(
        "the forward pass of the PyTorch module below. The launcher takes the forward inputs, then the module's parameters (its state dict, in order), then the outputs and the named sizes.\n\n```python\n{}\n```",
        code.trim_end()
    )
}

/// The element type a prompt names for a launcher `signature`: `f16` or `bf16` when one of its
/// buffers has that type, else `f32`.
pub fn signature_dtype(signature: &str) -> &'static str {
    if signature.contains("__nv_bfloat16") {
        "bf16"
    } else if signature.contains("__half") {
        "f16"
    } else {
        "f32"
    }
}

/// The assistant's answer: the source in a ```` ```cuda ```` fence.
pub fn fenced(code: &str) -> String {
    format!("```cuda\n{}\n```", code.trim_end())
}

/// The first ```` ```cuda ```` (or ```` ``` ````) block of a model's answer, or `None`.
pub fn extract_code(answer: &str) -> Option<String> {
    let start = answer.find("```")?;
    let rest = &answer[start + 3..];
    let body_start = rest.find('\n')? + 1;
    let body = &rest[body_start..];
    let end = body.find("```").unwrap_or(body.len());
    Some(body[..end].trim_end().to_string())
}

/// The optimizer's user message: the task, the current kernel and the tester's feedback.
/// `intro`/`closing` as in [`task_prompt`] (RL uses 0, 0).
pub fn optimizer_prompt(
    t: &TaskView<'_>,
    current: &str,
    feedback: &str,
    intro: usize,
    closing: usize,
) -> String {
    format!(
        "{}\n\nCurrent kernel:\n{}\n\nTester feedback:\n{}\n\nWrite a faster version that stays correct.",
        task_prompt(t, intro, closing),
        fenced(current),
        feedback.trim_end()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_names_the_signature_and_the_answer_round_trips() {
        let shapes = vec![r#"{"n":1024}"#.to_string()];
        let t = TaskView {
            tier: 0,
            description: "out[i] = max(x[i], 0)",
            dtype: "f32",
            signature: "extern \"C\" void launch(const float* x, float* out, int64_t n, cudaStream_t stream)",
            shapes: &shapes,
        };
        let p = task_prompt(&t, 1, 2);
        assert!(p.starts_with(INTROS[1]));
        assert!(p.contains(t.signature) && p.contains(r#"{"n":1024}"#));
        assert!(p.ends_with(CLOSINGS[2]));
        let code = "__global__ void k() {}\nextern \"C\" void launch() {}";
        assert_eq!(extract_code(&fenced(code)).as_deref(), Some(code));
        assert_eq!(
            extract_code("Sure!\n```\nint x;\n```\nDone").as_deref(),
            Some("int x;")
        );
        assert_eq!(extract_code("no code"), None);
        let d = module_description("class Model:\n    pass\n");
        assert!(
            d.starts_with("the forward pass of the PyTorch module below.")
                && d.ends_with("```python\nclass Model:\n    pass\n```")
        );
        assert_eq!(signature_dtype(t.signature), "f32");
        assert_eq!(signature_dtype("launch(const __half* x, __half* y)"), "f16");
        assert_eq!(signature_dtype("launch(const __nv_bfloat16* x)"), "bf16");
        let o = optimizer_prompt(&t, code, "median 1.0 ms", 0, 0);
        assert!(o.contains("Current kernel:\n```cuda\n__global__") && o.contains("median 1.0 ms"));
    }
}
