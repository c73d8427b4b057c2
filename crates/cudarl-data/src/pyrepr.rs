//! A parser for Python literal reprs (`repr()` of dicts, lists, tuples, strings, numbers,
//! `None`/`True`/`False`, `nan`/`inf`), the format of the SakanaAI archive's `NCU_Profile`,
//! `Torch_Profile` and `Clang_Tidy` columns. It accepts what `ast.literal_eval` accepts for
//! these types, plus `nan` and `inf`, which `repr` prints for such floats.

use std::collections::BTreeMap;

/// A parsed Python literal.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An int that fits in i64.
    Int(i64),
    /// A float (also ints too large for i64).
    Float(f64),
    /// A str.
    Str(String),
    /// A list or tuple.
    List(Vec<PyValue>),
    /// A dict with string keys (other key types are rendered as their repr).
    Dict(BTreeMap<String, PyValue>),
}

impl PyValue {
    /// Numeric value as f64 (ints and floats).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            PyValue::Int(i) => Some(*i as f64),
            PyValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// Int value (ints, and floats with no fractional part).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            PyValue::Int(i) => Some(*i),
            PyValue::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(*f as i64),
            _ => None,
        }
    }

    /// String value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Dict value.
    pub fn as_dict(&self) -> Option<&BTreeMap<String, PyValue>> {
        match self {
            PyValue::Dict(d) => Some(d),
            _ => None,
        }
    }
}

/// A parse error with the byte offset where it happened.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid Python literal at byte {offset}: {message}")]
pub struct ParseError {
    /// Byte offset in the input.
    pub offset: usize,
    /// What was expected.
    pub message: String,
}

/// Parses one Python literal; trailing whitespace is allowed, anything else is an error.
///
/// # Errors
/// [`ParseError`] with the offset of the first unexpected byte.
pub fn parse(input: &str) -> Result<PyValue, ParseError> {
    let mut p = Parser {
        s: input.as_bytes(),
        i: 0,
        text: input,
    };
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(p.err("trailing characters"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    text: &'a str,
}

const MAX_DEPTH: usize = 64;

impl Parser<'_> {
    fn err(&self, m: &str) -> ParseError {
        ParseError {
            offset: self.i,
            message: m.to_string(),
        }
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<PyValue, ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        self.ws();
        match self.peek() {
            None => Err(self.err("unexpected end of input")),
            Some(b'{') => {
                self.i += 1;
                let mut m = BTreeMap::new();
                loop {
                    if self.eat(b'}') {
                        break;
                    }
                    let k = self.value(depth + 1)?;
                    let key = match k {
                        PyValue::Str(s) => s,
                        other => format!("{other:?}"),
                    };
                    if !self.eat(b':') {
                        return Err(self.err("expected ':'"));
                    }
                    let v = self.value(depth + 1)?;
                    m.insert(key, v);
                    if self.eat(b',') {
                        continue;
                    }
                    if self.eat(b'}') {
                        break;
                    }
                    return Err(self.err("expected ',' or '}'"));
                }
                Ok(PyValue::Dict(m))
            }
            Some(open @ (b'[' | b'(')) => {
                self.i += 1;
                let close = if open == b'[' { b']' } else { b')' };
                let mut v = Vec::new();
                loop {
                    if self.eat(close) {
                        break;
                    }
                    v.push(self.value(depth + 1)?);
                    if self.eat(b',') {
                        continue;
                    }
                    if self.eat(close) {
                        break;
                    }
                    return Err(self.err("expected ',' or closing bracket"));
                }
                Ok(PyValue::List(v))
            }
            Some(q @ (b'\'' | b'"')) => self.string(q),
            Some(c) if c == b'-' || c == b'+' || c == b'.' || c.is_ascii_digit() => self.number(),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
                {
                    self.i += 1;
                }
                match &self.text[start..self.i] {
                    "None" => Ok(PyValue::None),
                    "True" => Ok(PyValue::Bool(true)),
                    "False" => Ok(PyValue::Bool(false)),
                    "nan" => Ok(PyValue::Float(f64::NAN)),
                    "inf" => Ok(PyValue::Float(f64::INFINITY)),
                    _ => {
                        self.i = start;
                        Err(self.err("unknown name"))
                    }
                }
            }
            Some(_) => Err(self.err("unexpected character")),
        }
    }

    fn number(&mut self) -> Result<PyValue, ParseError> {
        let start = self.i;
        if matches!(self.peek(), Some(b'-' | b'+')) {
            self.i += 1;
        }
        if self.text[self.i..].starts_with("inf") {
            self.i += 3;
            let neg = self.s[start] == b'-';
            return Ok(PyValue::Float(if neg {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }));
        }
        if self.text[self.i..].starts_with("nan") {
            self.i += 3;
            return Ok(PyValue::Float(f64::NAN));
        }
        let mut is_float = false;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' | b'_' => self.i += 1,
                b'.' | b'e' | b'E' => {
                    is_float = true;
                    self.i += 1;
                    if (c == b'e' || c == b'E') && matches!(self.peek(), Some(b'-' | b'+')) {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
        let lit: String = self.text[start..self.i]
            .chars()
            .filter(|&c| c != '_')
            .collect();
        if !is_float && let Ok(v) = lit.parse::<i64>() {
            return Ok(PyValue::Int(v));
        }
        lit.parse::<f64>().map(PyValue::Float).map_err(|_| {
            self.i = start;
            self.err("invalid number")
        })
    }

    fn string(&mut self, q: u8) -> Result<PyValue, ParseError> {
        // Triple-quoted strings do not appear in reprs; a repr str is single-line.
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i] != q && self.s[self.i] != b'\\' {
                self.i += 1;
            }
            out.push_str(&self.text[start..self.i]);
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some(c) if c == q => {
                    self.i += 1;
                    return Ok(PyValue::Str(out));
                }
                Some(_) => {
                    // backslash escape
                    self.i += 1;
                    let Some(e) = self.peek() else {
                        return Err(self.err("unterminated escape"));
                    };
                    self.i += 1;
                    match e {
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'0' => out.push('\0'),
                        b'\\' => out.push('\\'),
                        b'\'' => out.push('\''),
                        b'"' => out.push('"'),
                        b'a' => out.push('\x07'),
                        b'b' => out.push('\x08'),
                        b'f' => out.push('\x0c'),
                        b'v' => out.push('\x0b'),
                        b'\n' => {}
                        b'x' | b'u' | b'U' => {
                            let n = match e {
                                b'x' => 2,
                                b'u' => 4,
                                _ => 8,
                            };
                            let hex = self
                                .text
                                .get(self.i..self.i + n)
                                .ok_or_else(|| self.err("short escape"))?;
                            let cp = u32::from_str_radix(hex, 16)
                                .map_err(|_| self.err("bad hex escape"))?;
                            out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                            self.i += n;
                        }
                        other => {
                            // Unknown escapes are kept verbatim, as Python does.
                            out.push('\\');
                            out.push(other as char);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ncu_like_dicts() {
        let s = r#"{'metrics': {'SM Busy': {'unit': '%', 'avg_value': 42.7, 'variance': 4.9e-32, 'n': 5}}, 'rules': {'R': {'type': 'WRN', 'description': "it's \"x\"\n"}}}"#;
        let v = parse(s).unwrap();
        let m = v.as_dict().unwrap()["metrics"].as_dict().unwrap()["SM Busy"]
            .as_dict()
            .unwrap();
        assert_eq!(m["unit"].as_str(), Some("%"));
        assert_eq!(m["avg_value"].as_f64(), Some(42.7));
        assert_eq!(m["variance"].as_f64(), Some(4.9e-32));
        assert_eq!(m["n"].as_i64(), Some(5));
        let r = v.as_dict().unwrap()["rules"].as_dict().unwrap()["R"]
            .as_dict()
            .unwrap();
        assert_eq!(r["description"].as_str(), Some("it's \"x\"\n"));
    }

    #[test]
    fn scalars_and_errors() {
        assert_eq!(parse("None").unwrap(), PyValue::None);
        assert_eq!(
            parse(" (1, -2.5e3, True) ").unwrap(),
            PyValue::List(vec![
                PyValue::Int(1),
                PyValue::Float(-2500.0),
                PyValue::Bool(true)
            ])
        );
        assert!(parse("nan").unwrap().as_f64().unwrap().is_nan());
        assert_eq!(parse("-inf").unwrap().as_f64(), Some(f64::NEG_INFINITY));
        assert_eq!(parse(r"'\x41\u00e9'").unwrap(), PyValue::Str("Aé".into()));
        let e = parse("{'a': 1,").unwrap_err();
        assert_eq!(e.offset, 8);
        assert!(parse("{'a' 1}").is_err());
        assert!(parse("os.system('x')").is_err());
        assert!(parse(&"[".repeat(100)).is_err());
    }
}
