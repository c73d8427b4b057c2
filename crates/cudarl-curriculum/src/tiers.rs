//! Tier assignment from op features, driven by `configs/curriculum/op_categories.toml`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize;

use crate::ops::base_name;

/// Highest curriculum tier.
pub const MAX_TIER: i64 = 3;

/// Errors loading the category file.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct CategoryError {
    /// The file.
    pub file: String,
    /// What is wrong (TOML errors carry line and column).
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rules {
    level_tier: BTreeMap<String, i64>,
    unknown_op_tier: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    categories: BTreeMap<String, i64>,
    rules: Rules,
    ops: BTreeMap<String, Vec<String>>,
}

/// The op category file of the default pipeline, relative to the project root.
pub const OP_CATEGORIES: &str = "configs/curriculum/op_categories.toml";

/// Parsed category table.
#[derive(Debug, Clone)]
pub struct Categories {
    tier_of_category: BTreeMap<String, i64>,
    category_of_op: HashMap<String, String>,
    level_tier: BTreeMap<i64, i64>,
    unknown_op_tier: i64,
}

/// Tier of one problem and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierDecision {
    /// Tier 0..3.
    pub tier: i64,
    /// One-line reason, e.g. `L1, max op tier: torch.matmul (tiled, 2)`.
    pub reason: String,
    /// Categories of the features (sorted, unique).
    pub categories: Vec<String>,
    /// Features with no category (counted at `unknown_op_tier`).
    pub unknown_ops: Vec<String>,
}

impl Categories {
    /// Parses the category TOML (`file` is used in messages).
    ///
    /// # Errors
    /// TOML errors, unknown keys, an op listed under an undeclared category, or an op listed
    /// under two categories.
    pub fn parse(text: &str, file: &str) -> Result<Categories, CategoryError> {
        let err = |m: String| CategoryError {
            file: file.to_string(),
            message: m,
        };
        let raw: RawFile =
            toml::from_str(text).map_err(|e| err(e.to_string().trim_end().to_string()))?;
        let mut category_of_op = HashMap::new();
        for (cat, ops) in &raw.ops {
            if !raw.categories.contains_key(cat) {
                return Err(err(format!(
                    "ops.{cat}: category `{cat}` is not declared in [categories]"
                )));
            }
            for op in ops {
                let key = op.replace('_', "").to_lowercase();
                if let Some(prev) = category_of_op.insert(key.clone(), cat.clone())
                    && &prev != cat
                {
                    return Err(err(format!(
                        "op `{op}` is listed under both `{prev}` and `{cat}`"
                    )));
                }
            }
        }
        let mut level_tier = BTreeMap::new();
        for (k, v) in raw.rules.level_tier {
            let l: i64 = k
                .parse()
                .map_err(|_| err(format!("rules.level_tier: `{k}` is not a level number")))?;
            level_tier.insert(l, v);
        }
        Ok(Categories {
            tier_of_category: raw.categories,
            category_of_op,
            level_tier,
            unknown_op_tier: raw.rules.unknown_op_tier,
        })
    }

    /// Category of a feature (`None` if unknown).
    pub fn category(&self, feature: &str) -> Option<&str> {
        self.category_of_op
            .get(&base_name(feature))
            .map(String::as_str)
    }

    /// Decides the tier of a problem of `level` (None for non-KernelBench tasks) with `features`.
    pub fn decide(&self, level: Option<i64>, features: &[String]) -> TierDecision {
        let mut cats = BTreeSet::new();
        let mut unknown = Vec::new();
        let mut best: Option<(i64, String, String)> = None;
        for f in features {
            let (cat, tier) = match self.category(f) {
                Some(c) => {
                    let t = self.tier_of_category[c];
                    (c.to_string(), t)
                }
                None => {
                    unknown.push(f.clone());
                    ("unknown".to_string(), self.unknown_op_tier)
                }
            };
            if tier < 0 {
                continue;
            }
            cats.insert(cat.clone());
            if best.as_ref().is_none_or(|b| tier > b.0) {
                best = Some((tier, f.clone(), cat));
            }
        }
        let categories: Vec<String> = cats.into_iter().collect();
        if let Some(&t) = level.and_then(|l| self.level_tier.get(&l)) {
            return TierDecision {
                tier: t.min(MAX_TIER),
                reason: format!(
                    "KernelBench level {} problems are tier {t} (fused ops / architectures)",
                    level.unwrap_or(0)
                ),
                categories,
                unknown_ops: unknown,
            };
        }
        let (tier, reason) = match best {
            Some((t, f, c)) => (t.min(MAX_TIER), format!("highest op: {f} ({c}, tier {t})")),
            None => (
                self.unknown_op_tier,
                "no recognized ops; unknown_op_tier".to_string(),
            ),
        };
        TierDecision {
            tier,
            reason: match level {
                Some(l) => format!("L{l}, {reason}"),
                None => reason,
            },
            categories,
            unknown_ops: unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cats() -> Categories {
        let text = include_str!("../../../configs/curriculum/op_categories.toml");
        Categories::parse(text, "op_categories.toml").unwrap()
    }

    fn feats(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn tiers_by_op_and_level() {
        let c = cats();
        assert_eq!(c.decide(Some(1), &feats(&["torch.relu"])).tier, 0);
        assert_eq!(c.decide(Some(1), &feats(&["torch.sum"])).tier, 1);
        assert_eq!(c.decide(Some(1), &feats(&["Tensor.transpose"])).tier, 1);
        assert_eq!(c.decide(Some(1), &feats(&["torch.matmul"])).tier, 2);
        assert_eq!(c.decide(Some(1), &feats(&["torch.softmax"])).tier, 2);
        assert_eq!(c.decide(Some(1), &feats(&["nn.LayerNorm"])).tier, 2);
        let d = c.decide(Some(2), &feats(&["nn.Conv2d", "torch.relu", "op.add"]));
        assert_eq!(d.tier, 3);
        assert_eq!(d.categories, vec!["elementwise", "tiled"]);
        let d = c.decide(Some(1), &feats(&["torch.frobnicate"]));
        assert_eq!(
            (d.tier, d.unknown_ops.clone()),
            (2, feats(&["torch.frobnicate"]))
        );
        // creation/meta ops do not raise the tier
        assert_eq!(
            c.decide(Some(1), &feats(&["Tensor.clone", "torch.relu"]))
                .tier,
            0
        );
    }

    #[test]
    fn bad_files_are_named() {
        let e = Categories::parse("[categories]\nx = 0\n[rules]\nlevel_tier = {}\nunknown_op_tier = 2\n[ops]\ny = [\"a\"]\n", "f.toml").unwrap_err();
        assert!(e.to_string().contains("f.toml: ops.y"), "{e}");
        let e = Categories::parse("[categories\n", "g.toml").unwrap_err();
        assert!(e.to_string().starts_with("g.toml:"), "{e}");
    }
}
