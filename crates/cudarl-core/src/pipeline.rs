//! Pipeline files (`pipelines/*.toml`), `--set` overrides, and the DAG of nodes.
//!
//! ```toml
//! [pipeline]
//! name = "default"
//!
//! [stages.ingest-kernelbench]     # node name; the stage kind defaults to it
//! source = "bundled"              # typed params of the stage
//!
//! [stages.curriculum]
//! seed = 0
//! inputs = { problems = "ingest-kernelbench.problems" }   # optional rewiring
//!
//! [profiles.cpu]                  # named overrides: `--profile cpu`, applied before `--set`
//! "curriculum.seed" = 1           # NODE.KEY = VALUE, as `--set curriculum.seed=1`
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use crate::stage::{InputDecl, InputSource, OutputDecl, Stage, StageError};

/// A stage's params table refused by the stage: an unknown param, a wrong type, a value out of
/// its range (the message names the param). The pipeline names the file and the stage's section
/// around it, and the run exits with 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamsError(pub String);

impl From<String> for ParamsError {
    fn from(m: String) -> Self {
        ParamsError(m)
    }
}

impl From<&str> for ParamsError {
    fn from(m: &str) -> Self {
        ParamsError(m.to_string())
    }
}

/// Builds stages from their kind and params. `cudarl-stages` implements it for every stage.
pub trait StageFactory: Send + Sync {
    /// Every stage kind this factory knows, sorted.
    fn kinds(&self) -> Vec<&'static str>;
    /// Builds a stage of `kind` for node `node` from its params table.
    ///
    /// # Errors
    /// The params are refused; the caller wraps the message with file and field.
    fn build(
        &self,
        kind: &str,
        node: &str,
        params: toml::Table,
    ) -> Result<Box<dyn Stage>, ParamsError>;
}

/// One node of a pipeline: a name, a stage, and its (possibly rewired) inputs.
pub struct Node {
    /// Node name (unique in the pipeline).
    pub name: String,
    /// The stage.
    pub stage: Box<dyn Stage>,
    /// Inputs after applying `inputs = {...}` overrides.
    pub inputs: Vec<InputDecl>,
    /// Declared outputs.
    pub outputs: Vec<OutputDecl>,
}

/// A parsed and validated pipeline: nodes and the dependency graph between them.
pub struct Pipeline {
    /// File the pipeline came from, as given by the user (for messages).
    pub file: String,
    /// `pipeline.name`, or the file stem.
    pub name: String,
    /// The default targets (`pipeline.targets`): what a `run` with no target builds and what
    /// `status --exit-code` checks; empty: every node.
    pub targets: Vec<String>,
    nodes: Vec<Node>,
    index: HashMap<String, usize>,
    graph: DiGraph<usize, String>,
    topo: Vec<usize>,
}

fn config_err(file: &str, field: impl Into<String>, message: impl Into<String>) -> StageError {
    StageError::Config {
        file: file.to_string(),
        field: Some(field.into()),
        message: message.into(),
    }
}

/// Parses `VALUE` of a `--set NODE.KEY=VALUE` as a TOML value (number, bool, string, array,
/// inline table); anything that is not valid TOML is taken as a plain string.
pub fn parse_set_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

/// A pipeline file as read: its name, node tables and named profiles.
#[derive(Debug, Clone)]
pub struct PipelineFile {
    /// `pipeline.name`, or the file stem.
    pub name: String,
    /// `pipeline.targets`: the nodes a `run` with no target builds (empty: every node).
    pub targets: Vec<String>,
    /// `[stages.NODE]` tables, by node name.
    pub stages: BTreeMap<String, toml::Table>,
    /// `[profiles.NAME]`: each profile's overrides as `(NODE.KEY, VALUE)` pairs, in file order
    /// of their dotted keys (nested tables flattened: `a.b = 1` and `"a.b" = 1` are the same).
    pub profiles: BTreeMap<String, Vec<(String, toml::Value)>>,
}

impl PipelineFile {
    /// Applies profile `name`'s overrides to the node tables.
    ///
    /// # Errors
    /// No such profile (the known ones named), or an override naming an unknown node
    /// ([`StageError::Config`] naming `file` and `profiles.NAME`).
    pub fn apply_profile(&mut self, file: &str, name: &str) -> Result<(), StageError> {
        let Some(sets) = self.profiles.get(name) else {
            let known = self.profiles.keys().cloned().collect::<Vec<_>>();
            return Err(config_err(
                file,
                format!("profiles.{name}"),
                if known.is_empty() {
                    "no such profile: the file defines none".to_string()
                } else {
                    format!("no such profile (profiles: {})", known.join(", "))
                },
            ));
        };
        let source = format!("{file}: profiles.{name}");
        for (lhs, value) in sets.clone() {
            apply_override(&mut self.stages, &source, &lhs, value)?;
        }
        Ok(())
    }
}

/// Flattens a profile table into `(dotted key, leaf value)` pairs.
fn flatten_profile(prefix: &str, t: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(sub) => flatten_profile(&key, sub, out),
            _ => out.push((key, v.clone())),
        }
    }
}

/// Reads a pipeline TOML file: its name, node tables and profiles.
///
/// # Errors
/// Unreadable file, TOML syntax error, or a malformed `[pipeline]`, `[stages]` or `[profiles]`
/// table ([`StageError::Config`] naming the file and the field).
pub fn read_pipeline_file(path: &Path, display: &str) -> Result<PipelineFile, StageError> {
    let text = std::fs::read_to_string(path).map_err(|e| StageError::Config {
        file: display.to_string(),
        field: None,
        message: format!("cannot read pipeline file: {e}"),
    })?;
    let mut doc: toml::Table = toml::from_str(&text).map_err(|e| StageError::Config {
        file: display.to_string(),
        field: None,
        message: format!("invalid TOML: {}", e.to_string().trim_end()),
    })?;
    let mut name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("pipeline")
        .to_string();
    let mut targets = Vec::new();
    if let Some(p) = doc.remove("pipeline") {
        let t = p
            .as_table()
            .ok_or_else(|| config_err(display, "pipeline", "must be a table"))?;
        for (k, v) in t {
            match (k.as_str(), v) {
                ("name", toml::Value::String(s)) => name = s.clone(),
                ("description", toml::Value::String(_)) => {}
                ("targets", toml::Value::Array(a)) => {
                    targets = a
                        .iter()
                        .map(|v| v.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| {
                            config_err(display, "pipeline.targets", "must be a list of node names")
                        })?;
                }
                _ => {
                    return Err(config_err(
                        display,
                        format!("pipeline.{k}"),
                        "unknown key or type (allowed: name and description, strings; targets, a list of node names)",
                    ));
                }
            }
        }
    }
    let stages = match doc.remove("stages") {
        None => {
            return Err(config_err(
                display,
                "stages",
                "missing: a pipeline needs at least one [stages.NAME] table",
            ));
        }
        Some(toml::Value::Table(t)) => t,
        Some(_) => return Err(config_err(display, "stages", "must be a table of tables")),
    };
    let mut profiles = BTreeMap::new();
    match doc.remove("profiles") {
        None => {}
        Some(toml::Value::Table(t)) => {
            for (name, v) in t {
                let toml::Value::Table(p) = v else {
                    return Err(config_err(
                        display,
                        format!("profiles.{name}"),
                        "must be a table of NODE.KEY = VALUE overrides",
                    ));
                };
                let mut sets = Vec::new();
                flatten_profile("", &p, &mut sets);
                if let Some((k, _)) = sets.iter().find(|(k, _)| !k.contains('.')) {
                    return Err(config_err(
                        display,
                        format!("profiles.{name}.{k}"),
                        "expected NODE.KEY = VALUE",
                    ));
                }
                profiles.insert(name, sets);
            }
        }
        Some(_) => return Err(config_err(display, "profiles", "must be a table of tables")),
    }
    if let Some(k) = doc.keys().next() {
        return Err(config_err(
            display,
            k.clone(),
            "unknown top-level key (allowed: pipeline, stages, profiles)",
        ));
    }
    let mut out = BTreeMap::new();
    for (node, v) in stages {
        match v {
            toml::Value::Table(t) => {
                out.insert(node, t);
            }
            _ => {
                return Err(config_err(
                    display,
                    format!("stages.{node}"),
                    "must be a table",
                ));
            }
        }
    }
    Ok(PipelineFile {
        name,
        targets,
        stages: out,
        profiles,
    })
}

/// Applies `NODE.KEY=VALUE` overrides to node tables (`KEY` may be dotted for nested tables).
///
/// # Errors
/// Malformed override or unknown node ([`StageError::Config`] naming `--set`).
pub fn apply_overrides(
    tables: &mut BTreeMap<String, toml::Table>,
    sets: &[String],
) -> Result<(), StageError> {
    for s in sets {
        let (lhs, value) = s
            .split_once('=')
            .ok_or_else(|| config_err("--set", s.clone(), "expected NODE.KEY=VALUE"))?;
        apply_override(tables, "--set", lhs, parse_set_value(value))?;
    }
    Ok(())
}

/// Sets `lhs` (`NODE.KEY`, `KEY` dotted for nested tables) to `value`; errors name `source`.
fn apply_override(
    tables: &mut BTreeMap<String, toml::Table>,
    source: &str,
    lhs: &str,
    value: toml::Value,
) -> Result<(), StageError> {
    let (node, key) = lhs
        .split_once('.')
        .ok_or_else(|| config_err(source, lhs.to_string(), "expected NODE.KEY=VALUE"))?;
    let names = tables.keys().cloned().collect::<Vec<_>>().join(", ");
    let hint = crate::suggest::did_you_mean(node, tables.keys().map(String::as_str));
    let table = tables.get_mut(node).ok_or_else(|| {
        config_err(
            source,
            lhs.to_string(),
            format!("unknown node `{node}`{hint} (nodes: {names})"),
        )
    })?;
    let parts: Vec<&str> = key.split('.').collect();
    let mut t = table;
    for p in &parts[..parts.len() - 1] {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .ok_or_else(|| config_err(source, lhs.to_string(), format!("`{p}` is not a table")))?;
    }
    t.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// Node `node_name` of pipeline file `file` from its table: the stage `factory` builds of its
/// `stage` kind (the node's name by default) and the rest of the table, with its `inputs`
/// overrides applied.
///
/// # Errors
/// Bad node name, `stage` or `inputs`, unknown stage kind, bad params, an override of an input
/// the stage does not have ([`StageError::Config`] naming `file` and the field).
fn build_node(
    file: &str,
    node_name: String,
    mut table: toml::Table,
    factory: &dyn StageFactory,
) -> Result<Node, StageError> {
    cudarl_store::validate_name("node", &node_name)
        .map_err(|e| config_err(file, format!("stages.{node_name}"), e.to_string()))?;
    let kind = match table.remove("stage") {
        None => node_name.clone(),
        Some(toml::Value::String(s)) => s,
        Some(_) => {
            return Err(config_err(
                file,
                format!("stages.{node_name}.stage"),
                "must be a string",
            ));
        }
    };
    let overrides = input_overrides(file, &node_name, table.remove("inputs"))?;
    if !factory.kinds().contains(&kind.as_str()) {
        return Err(config_err(
            file,
            format!("stages.{node_name}"),
            format!(
                "unknown stage `{kind}` (known stages: {})",
                factory.kinds().join(", ")
            ),
        ));
    }
    let stage = factory
        .build(&kind, &node_name, table)
        .map_err(|m| config_err(file, format!("stages.{node_name}"), m.0))?;
    let mut inputs = stage.inputs();
    for (k, (n, o)) in &overrides {
        let decl = inputs.iter_mut().find(|d| &d.name == k).ok_or_else(|| {
            config_err(
                file,
                format!("stages.{node_name}.inputs.{k}"),
                format!("stage `{kind}` has no input `{k}`"),
            )
        })?;
        decl.source = InputSource::Node {
            node: n.clone(),
            output: o.clone(),
        };
    }
    let outputs = stage.outputs();
    Ok(Node {
        name: node_name,
        stage,
        inputs,
        outputs,
    })
}

/// A node's `inputs = { INPUT = "NODE.OUTPUT" }` table (`value`; absent: none) as input name
/// to (node, output).
///
/// # Errors
/// Not a table, or an entry not of the form `"NODE.OUTPUT"` ([`StageError::Config`] naming
/// `file` and the field).
fn input_overrides(
    file: &str,
    node_name: &str,
    value: Option<toml::Value>,
) -> Result<BTreeMap<String, (String, String)>, StageError> {
    match value {
        None => Ok(BTreeMap::new()),
        Some(toml::Value::Table(t)) => {
            let mut m = BTreeMap::new();
            for (k, v) in t {
                let bad = || {
                    config_err(
                        file,
                        format!("stages.{node_name}.inputs.{k}"),
                        "must be \"NODE.OUTPUT\"",
                    )
                };
                let s = v.as_str().ok_or_else(bad)?;
                let (n, o) = s.split_once('.').ok_or_else(bad)?;
                m.insert(k, (n.to_string(), o.to_string()));
            }
            Ok(m)
        }
        Some(_) => Err(config_err(
            file,
            format!("stages.{node_name}.inputs"),
            "must be a table",
        )),
    }
}

/// The dependency graph of `nodes` (weights: node indices; edges: upstream to downstream,
/// weighted by the input's name); `index` maps node names to indices.
///
/// # Errors
/// An input naming a node not in the pipeline, or an output that node does not have
/// ([`StageError::Config`] naming `file` and the input).
fn link(
    file: &str,
    nodes: &[Node],
    index: &HashMap<String, usize>,
) -> Result<DiGraph<usize, String>, StageError> {
    let mut graph = DiGraph::new();
    let gi: Vec<NodeIndex> = (0..nodes.len()).map(|i| graph.add_node(i)).collect();
    for (i, n) in nodes.iter().enumerate() {
        for inp in &n.inputs {
            if let InputSource::Node { node, output } = &inp.source {
                let Some(&j) = index.get(node) else {
                    return Err(config_err(
                        file,
                        format!("stages.{}.inputs.{}", n.name, inp.name),
                        format!(
                            "input `{}` needs node `{node}`, which is not in this pipeline (add a [stages.{node}] table)",
                            inp.name
                        ),
                    ));
                };
                if !nodes[j].outputs.iter().any(|o| &o.name == output) {
                    return Err(config_err(
                        file,
                        format!("stages.{}.inputs.{}", n.name, inp.name),
                        format!("node `{node}` has no output `{output}`"),
                    ));
                }
                graph.add_edge(gi[j], gi[i], inp.name.clone());
            }
        }
    }
    Ok(graph)
}

impl Pipeline {
    /// Builds and validates a pipeline from node tables.
    ///
    /// # Errors
    /// Unknown stage kind, bad params, dangling input reference, or a cycle
    /// ([`StageError::Config`] naming `file` and the field).
    pub fn build(
        file: &str,
        name: String,
        tables: BTreeMap<String, toml::Table>,
        factory: &dyn StageFactory,
    ) -> Result<Pipeline, StageError> {
        let mut nodes = Vec::new();
        for (node_name, table) in tables {
            nodes.push(build_node(file, node_name, table, factory)?);
        }
        let index: HashMap<String, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        let graph = link(file, &nodes, &index)?;
        let topo = toposort(&graph, None)
            .map_err(|c| {
                config_err(
                    file,
                    "stages",
                    format!(
                        "dependency cycle through node `{}`",
                        nodes[graph[c.node_id()]].name
                    ),
                )
            })?
            .into_iter()
            .map(|ix| graph[ix])
            .collect();
        Ok(Pipeline {
            file: file.to_string(),
            name,
            targets: Vec::new(),
            nodes,
            index,
            graph,
            topo,
        })
    }

    /// Loads a pipeline file, applies profile `profile` (if any), then the `--set` overrides,
    /// and builds it.
    ///
    /// # Errors
    /// See [`read_pipeline_file`], [`PipelineFile::apply_profile`], [`apply_overrides`] and
    /// [`Pipeline::build`].
    pub fn load(
        path: &Path,
        display: &str,
        profile: Option<&str>,
        sets: &[String],
        factory: &dyn StageFactory,
    ) -> Result<Pipeline, StageError> {
        let mut f = read_pipeline_file(path, display)?;
        if let Some(p) = profile {
            f.apply_profile(display, p)?;
        }
        apply_overrides(&mut f.stages, sets)?;
        let mut p = Pipeline::build(display, f.name, f.stages, factory)?;
        p.closure(&f.targets).map_err(|e| match e {
            StageError::Config { message, .. } => config_err(display, "pipeline.targets", message),
            e => e,
        })?;
        p.targets = f.targets;
        Ok(p)
    }

    /// `targets`, or the default targets when `targets` is empty.
    pub fn targets_or_default<'a>(&'a self, targets: &'a [String]) -> &'a [String] {
        if targets.is_empty() {
            &self.targets
        } else {
            targets
        }
    }

    /// All nodes, in a topological order.
    pub fn topo_nodes(&self) -> impl Iterator<Item = &Node> {
        self.topo.iter().map(|&i| &self.nodes[i])
    }

    /// Node by name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.index.get(name).map(|&i| &self.nodes[i])
    }

    /// Index of a node by name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Node by index.
    pub fn node_at(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the pipeline has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node names, sorted.
    pub fn node_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        v.sort();
        v
    }

    /// Upstream node indices of node `i` (deduplicated, sorted).
    pub fn upstream(&self, i: usize) -> Vec<usize> {
        let ix = NodeIndex::new(i);
        let mut v: Vec<usize> = self
            .graph
            .edges_directed(ix, petgraph::Direction::Incoming)
            .map(|e| self.graph[e.source()])
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Downstream node indices of node `i` (deduplicated, sorted).
    pub fn downstream(&self, i: usize) -> Vec<usize> {
        let ix = NodeIndex::new(i);
        let mut v: Vec<usize> = self
            .graph
            .edges_directed(ix, petgraph::Direction::Outgoing)
            .map(|e| self.graph[e.target()])
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The targets and all their ancestors, in topological order. No targets means all nodes.
    ///
    /// # Errors
    /// An unknown target ([`StageError::Config`] listing the nodes).
    pub fn closure(&self, targets: &[String]) -> Result<Vec<usize>, StageError> {
        if targets.is_empty() {
            return Ok(self.topo.clone());
        }
        let mut keep = vec![false; self.nodes.len()];
        let mut stack = Vec::new();
        for t in targets {
            let i = self.index_of(t).ok_or_else(|| {
                let names = self.node_names();
                StageError::Config {
                    file: self.file.clone(),
                    field: None,
                    message: format!(
                        "unknown node `{t}`{} (nodes: {})",
                        crate::suggest::did_you_mean(t, names.iter().map(String::as_str)),
                        names.join(", ")
                    ),
                }
            })?;
            stack.push(i);
        }
        while let Some(i) = stack.pop() {
            if !keep[i] {
                keep[i] = true;
                stack.extend(self.upstream(i));
            }
        }
        Ok(self.topo.iter().copied().filter(|&i| keep[i]).collect())
    }

    /// Edges as (from node, output, to node, input), sorted.
    pub fn edges(&self) -> Vec<(String, String, String, String)> {
        let mut v = Vec::new();
        for n in &self.nodes {
            for inp in &n.inputs {
                if let InputSource::Node { node, output } = &inp.source {
                    v.push((
                        node.clone(),
                        output.clone(),
                        n.name.clone(),
                        inp.name.clone(),
                    ));
                }
            }
        }
        v.sort();
        v
    }
}

/// Finds the project root: `start` or its nearest ancestor that holds a `pipelines/` folder.
pub fn discover_root(start: &Path) -> Option<PathBuf> {
    let mut cur = Some(start);
    while let Some(d) = cur {
        if d.join("pipelines").is_dir() {
            return Some(d.to_path_buf());
        }
        cur = d.parent();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<PipelineFile, StageError> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.toml");
        std::fs::write(&p, text).unwrap();
        read_pipeline_file(&p, "p.toml")
    }

    #[test]
    fn profiles_flatten_quoted_and_nested_keys_and_apply_before_sets() {
        let mut f = read(
            "[stages.a]\nx = 1\n[stages.b]\ny = { z = 1 }\n\
             [profiles.small]\n\"a.x\" = 2\nb.y.z = 3\n",
        )
        .unwrap();
        assert_eq!(
            f.profiles["small"],
            vec![
                ("a.x".to_string(), toml::Value::Integer(2)),
                ("b.y.z".to_string(), toml::Value::Integer(3)),
            ]
        );
        f.apply_profile("p.toml", "small").unwrap();
        apply_overrides(&mut f.stages, &["a.x=4".to_string()]).unwrap();
        assert_eq!(f.stages["a"]["x"].as_integer(), Some(4));
        assert_eq!(f.stages["b"]["y"]["z"].as_integer(), Some(3));
        let e = f.apply_profile("p.toml", "big").unwrap_err().to_string();
        assert!(
            e.contains("profiles.big") && e.contains("profiles: small"),
            "{e}"
        );
    }

    #[test]
    fn malformed_profiles_name_the_field() {
        for (text, field) in [
            ("profiles = 3\n[stages.a]\nx = 1\n", "profiles"),
            ("[stages.a]\nx = 1\n[profiles]\ncpu = 3\n", "profiles.cpu"),
            (
                "[stages.a]\nx = 1\n[profiles.cpu]\nx = 3\n",
                "profiles.cpu.x",
            ),
        ] {
            let e = read(text).unwrap_err().to_string();
            assert!(e.contains("p.toml") && e.contains(field), "{text}: {e}");
        }
    }
}
