//! "Did you mean" for a mistyped name (a node, a task, a problem): the known name nearest by
//! Jaro-Winkler similarity (`strsim`, the metric clap uses for its own suggestions), when it is
//! close enough to be a typo.

/// Least Jaro-Winkler similarity (0..1) of a suggestion to the name given; clap's threshold.
const LEAST_SIMILARITY: f64 = 0.7;

/// Least normalized Levenshtein similarity (0..1) besides: names that share only a long prefix
/// (`kb/L1/...`) are not typos of each other.
const LEAST_EDIT_SIMILARITY: f64 = 0.6;

/// The name of `known` most similar to `name`, if any is at least [`LEAST_SIMILARITY`]
/// similar and within [`LEAST_EDIT_SIMILARITY`] by edits (ties: the first).
pub fn nearest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(f64, &str)> = None;
    for k in known {
        let s = strsim::jaro_winkler(name, k);
        if s >= LEAST_SIMILARITY
            && strsim::normalized_levenshtein(name, k) >= LEAST_EDIT_SIMILARITY
            && best.is_none_or(|(b, _)| s > b)
        {
            best = Some((s, k));
        }
    }
    best.map(|(_, k)| k)
}

/// `"; did you mean `NAME`?"` for the [`nearest`] known name, or nothing.
pub fn did_you_mean<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    nearest(name, known).map_or(String::new(), |k| format!("; did you mean `{k}`?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_the_nearest_name_and_an_unrelated_name_none() {
        let nodes = ["curriculum", "validate", "rl-train", "eval", "sft-train"];
        assert_eq!(nearest("curriculm", nodes), Some("curriculum"));
        assert_eq!(nearest("rl_train", nodes), Some("rl-train"));
        assert_eq!(nearest("valdiate", nodes), Some("validate"));
        assert_eq!(nearest("xyzzy", nodes), None);
        let problems = ["kb/L1/19_ReLU", "kb/L1/20_LeakyReLU"];
        assert_eq!(nearest("kb/L1/19_Relu", problems), Some("kb/L1/19_ReLU"));
        assert_eq!(nearest("kb/L1/zzzz", problems), None);
        assert_eq!(did_you_mean("evl", nodes), "; did you mean `eval`?");
        assert_eq!(did_you_mean("qqqq", nodes), "");
    }
}
