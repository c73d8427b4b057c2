//! Renderings of a pipeline's DAG: text, Graphviz dot, Mermaid and JSON.

use serde_json::json;

use crate::pipeline::Pipeline;
use crate::stage::{InputSource, OutputKind};

/// Output format of `cudarl-pipe dag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DagFormat {
    /// One line per node in topological order, with its inputs.
    Text,
    /// Graphviz dot.
    Dot,
    /// Mermaid flowchart.
    Mermaid,
    /// JSON: nodes (name, stage, code version, inputs, outputs) and edges.
    Json,
}

fn node_id(name: &str) -> String {
    name.replace(['-', '.'], "_")
}

/// Renders the pipeline's DAG in `format`.
pub fn render(p: &Pipeline, format: DagFormat) -> String {
    match format {
        DagFormat::Text => {
            let mut s = String::new();
            for n in p.topo_nodes() {
                let ins: Vec<String> = n
                    .inputs
                    .iter()
                    .map(|i| match &i.source {
                        InputSource::Node { node, output } => {
                            format!("{} <- {node}.{output}", i.name)
                        }
                        InputSource::External => format!("{} <- (external)", i.name),
                    })
                    .collect();
                let outs: Vec<&str> = n.outputs.iter().map(|o| o.name.as_str()).collect();
                s.push_str(&format!(
                    "{} [{} v{}]\n    in:  {}\n    out: {}\n",
                    n.name,
                    n.stage.kind(),
                    n.stage.code_version(),
                    if ins.is_empty() {
                        "-".to_string()
                    } else {
                        ins.join(", ")
                    },
                    outs.join(", ")
                ));
            }
            s
        }
        DagFormat::Dot => {
            let mut s = String::from("digraph cudarl {\n  rankdir=LR;\n  node [shape=box];\n");
            for n in p.topo_nodes() {
                s.push_str(&format!(
                    "  {} [label=\"{}\\n({})\"];\n",
                    node_id(&n.name),
                    n.name,
                    n.stage.kind()
                ));
            }
            for (from, out, to, inp) in p.edges() {
                s.push_str(&format!(
                    "  {} -> {} [label=\"{out} -> {inp}\"];\n",
                    node_id(&from),
                    node_id(&to)
                ));
            }
            s.push_str("}\n");
            s
        }
        DagFormat::Mermaid => {
            let mut s = String::from("flowchart LR\n");
            for n in p.topo_nodes() {
                s.push_str(&format!("  {}[\"{}\"]\n", node_id(&n.name), n.name));
            }
            for (from, out, to, inp) in p.edges() {
                s.push_str(&format!(
                    "  {} -->|{out} to {inp}| {}\n",
                    node_id(&from),
                    node_id(&to)
                ));
            }
            s
        }
        DagFormat::Json => {
            let nodes: Vec<_> = p
                .topo_nodes()
                .map(|n| {
                    json!({
                        "node": n.name,
                        "stage": n.stage.kind(),
                        "code_version": n.stage.code_version(),
                        "params": n.stage.params(),
                        "inputs": n.inputs.iter().map(|i| match &i.source {
                            InputSource::Node { node, output } => json!({"name": i.name, "node": node, "output": output}),
                            InputSource::External => json!({"name": i.name, "external": true}),
                        }).collect::<Vec<_>>(),
                        "outputs": n.outputs.iter().map(|o| json!({
                            "name": o.name,
                            "kind": match &o.kind { OutputKind::Table(_) => "table", OutputKind::File { .. } => "file" },
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let edges: Vec<_> = p
                .edges()
                .into_iter()
                .map(|(f, o, t, i)| json!({"from": f, "output": o, "to": t, "input": i}))
                .collect();
            serde_json::to_string_pretty(
                &json!({"pipeline": p.name, "nodes": nodes, "edges": edges}),
            )
            .expect("json")
                + "\n"
        }
    }
}
