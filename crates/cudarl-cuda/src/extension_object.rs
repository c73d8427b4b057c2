//! Checks on a built torch extension (the shared object a `ModelNew` file's `load_inline` call
//! or a SakanaAI-style extension was built into), like the native path's host-object checks:
//! what it imports from torch must be allocation, views, accessors, streams and guards
//! (docs/architecture.md, "The ModelNew allow-list").
//!
//! Every undefined dynamic symbol is read (`object`), its qualified name taken from the Itanium
//! mangling (`_ZN2at4_ops5zeros4callE...` is `at::_ops::zeros::call`; vtables and type info by
//! the class they belong to), and:
//!
//! - a torch name (in the `at`, `c10`, `torch` or `caffe2` namespaces, `THP*`, or any name
//!   torch's own libraries export outside `std`, such as the `aoti_torch_*` C shims) must match
//!   `[extension_objects] torch_symbols` of `configs/harness/static_rules.toml`: the creation
//!   and view ops of `at::_ops` (`empty_like`, `zeros`, `view`, ...), `at::TensorBase`'s
//!   accessors, CUDA streams and guards, `c10`'s tensor internals and error reporting,
//!   pybind11's tensor caster;
//! - any name matching `refused_symbols` is refused wherever it lives: the dispatcher
//!   (`c10::Dispatcher`: any op by its schema name), the global context (TF32 and cuBLAS
//!   settings), and the Python entry points that run code (`PyRun_*`, `PyImport_*`, ...).
//!
//! This stops torch compute written as C++ calls into libtorch. It does not stop an extension
//! that reaches torch through Python's C API (pybind11's `attr("relu")`), or through `dlsym`,
//! which the static CUDA runtime an extension links imports anyway: the kernels one forward ran
//! ([`crate::standin`]) remain the evidence for those. The C and C++ runtime's names are not
//! checked here; what a process may do is the sandbox's to decide.
//!
//! Measured on 12 built honest extensions (the ReLU `ModelNew` of `tests/kernels/kb/` and 11
//! SakanaAI kernels of the bundled archive sample, levels 1-3): torch imports `zeros`,
//! `empty_memory_format`, `empty_like`, `__dispatch_contiguous`, `data_ptr<float>`, streams,
//! `c10` internals and pybind11's tensor caster; two level-3 MLP kernels call `at::linear` beside
//! their kernels and are refused.

use std::sync::LazyLock;

use std::collections::HashSet;
use std::sync::OnceLock;

use object::{Object, ObjectSymbol};
use regex::Regex;

use crate::static_check::{Action, ExtensionRules, Finding};

/// The rule id of an extension importing a torch name outside the allow-list.
pub const RULE: &str = "extension-symbol";

/// The qualified name of an Itanium-mangled symbol (`_ZN3c104cuda20getCurrentCUDAStreamEa` is
/// `c10::cuda::getCurrentCUDAStream`), from its leading nested or unscoped name; `None` for a
/// name that is not mangled that way (C names, vtables, guards).
pub fn qualified(mangled: &str) -> Option<String> {
    // A vtable, VTT, type info or its name (`_ZTV`, `_ZTT`, `_ZTI`, `_ZTS`) by its class; a
    // function's local entity (`_ZZ`) by its function.
    let rest = mangled.strip_prefix("_Z")?;
    let rest = ["TV", "TT", "TI", "TS", "Z"]
        .iter()
        .find_map(|p| rest.strip_prefix(p))
        .unwrap_or(rest);
    let b = rest.as_bytes();
    let mut i = 0;
    let nested = b.first() == Some(&b'N');
    if nested {
        i += 1;
        while i < b.len() && matches!(b[i], b'K' | b'V' | b'r' | b'R' | b'O') {
            i += 1;
        }
    }
    let mut parts: Vec<&str> = Vec::new();
    if b[i..].starts_with(b"St") {
        parts.push("std");
        i += 2;
    }
    while i < b.len() && b[i].is_ascii_digit() {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let n: usize = std::str::from_utf8(&b[start..i]).ok()?.parse().ok()?;
        let name = std::str::from_utf8(b.get(i..i + n)?).ok()?;
        parts.push(name);
        i += n;
        if !nested {
            break;
        }
    }
    (!parts.is_empty()).then(|| parts.join("::"))
}

/// Whether an imported name is torch's: in one of its namespaces, `THP*`, or exported by its
/// libraries (`exports`) outside the C++ runtime's namespaces.
fn in_torch(raw: &str, qualified: Option<&str>, exports: &HashSet<String>) -> bool {
    static TORCH: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^(?:at|c10|torch|caffe2)::").expect("re"));
    static RUNTIME: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^(?:std|__gnu_cxx|__cxxabiv1)::").expect("re"));
    raw.starts_with("THP")
        || qualified.is_some_and(|q| TORCH.is_match(q))
        || exports.contains(raw) && !qualified.is_some_and(|q| RUNTIME.is_match(q))
}

/// The names torch's own shared libraries export (the dynamic symbols defined by `libtorch*.so`
/// and `libc10*.so` in `lib_dirs`), read once per process through a read cache (only their
/// symbol tables: torch 2.11's 101,605 names in about 0.7 s). A library that cannot be read adds
/// nothing; the namespace rule still applies.
pub fn torch_exports(lib_dirs: &[String]) -> &'static HashSet<String> {
    static EXPORTS: OnceLock<HashSet<String>> = OnceLock::new();
    EXPORTS.get_or_init(|| {
        let mut out = HashSet::new();
        for dir in lib_dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !(name.starts_with("libtorch") || name.starts_with("libc10"))
                    || !name.ends_with(".so")
                {
                    continue;
                }
                let Ok(f) = std::fs::File::open(e.path()) else {
                    continue;
                };
                let cache = object::ReadCache::new(f);
                let Ok(file) = object::File::parse(&cache) else {
                    continue;
                };
                out.extend(
                    file.dynamic_symbols()
                        .filter(|s| !s.is_undefined())
                        .filter_map(|s| s.name().ok().map(str::to_string)),
                );
            }
        }
        out
    })
}

/// The findings on a built extension's shared object (an ELF file): one reject naming every
/// torch import outside the allow-list, every refused import and every import whose name is
/// not text, or none. `exports`: [`torch_exports`] (may be empty).
///
/// # Errors
/// The bytes are not an object file `object` can read.
pub fn check(
    bytes: &[u8],
    rules: &ExtensionRules,
    exports: &HashSet<String>,
) -> Result<Vec<Finding>, crate::inspect::ObjectError> {
    let file = object::File::parse(bytes).map_err(|source| crate::inspect::ObjectError {
        what: "shared object",
        source,
    })?;
    let mut bad: Vec<String> = Vec::new();
    for s in file.dynamic_symbols().filter(|s| s.is_undefined()) {
        let Ok(raw) = s.name() else {
            bad.push("(a name that is not text)".into());
            continue;
        };
        let raw = raw.split('@').next().unwrap_or(raw);
        let q = qualified(raw);
        let name = q.as_deref().unwrap_or(raw);
        let refused = rules
            .refused
            .iter()
            .any(|r| r.is_match(raw) || r.is_match(name));
        let outside =
            in_torch(raw, q.as_deref(), exports) && !rules.torch.iter().any(|r| r.is_match(name));
        if refused || outside {
            bad.push(name.to_string());
        }
    }
    bad.sort();
    bad.dedup();
    if bad.is_empty() {
        return Ok(vec![]);
    }
    let mut matched = bad.join(" ");
    matched.truncate(80);
    Ok(vec![Finding {
        rule: RULE.into(),
        action: Action::Reject,
        line: 0,
        matched,
        message: format!(
            "the extension imports {}: torch compute ops or ways to run code by name, beside its kernels (allowed from torch: tensor creation, views, accessors, streams and guards)",
            bad.iter()
                .map(|b| format!("`{b}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_come_from_the_mangling() {
        assert_eq!(
            qualified("_ZN2at4_ops5zeros4callEN3c108ArrayRefINS2_6SymIntEEE").as_deref(),
            Some("at::_ops::zeros::call")
        );
        assert_eq!(
            qualified("_ZNK2at10TensorBase8data_ptrIfEEPT_v").as_deref(),
            Some("at::TensorBase::data_ptr")
        );
        assert_eq!(
            qualified("_ZN3c106SymIntC1ENS_13intrusive_ptrE").as_deref(),
            Some("c10::SymInt")
        );
        assert_eq!(
            qualified("_ZNSt6thread6_StateD2Ev").as_deref(),
            Some("std::thread::_State")
        );
        assert_eq!(qualified("_Z3fooi").as_deref(), Some("foo"));
        assert_eq!(qualified("PyRun_SimpleString"), None);
        assert_eq!(
            qualified("_ZTVN10__cxxabiv117__class_type_infoE").as_deref(),
            Some("__cxxabiv1::__class_type_info")
        );
        assert_eq!(
            qualified("_ZTVN5torch8autograd12AutogradMetaE").as_deref(),
            Some("torch::autograd::AutogradMeta")
        );
    }

    /// A real shared object (built by the C compiler) importing an allowed creation op, a
    /// compute op, the dispatcher, `PyRun_SimpleString`, the global context and a C-linkage
    /// name torch's libraries export (`aoti_torch_cuda_relu`): all but the first are refused,
    /// and the same object without them passes.
    #[test]
    fn torch_imports_outside_the_allow_list_are_refused_in_a_real_shared_object() {
        let rules = crate::Rules::builtin();
        let build = |extra: &[(&str, &str)]| -> Vec<u8> {
            let dir = tempfile::tempdir().unwrap();
            let mut c = String::from(
                "extern void zeros(void) __asm__(\"_ZN2at4_ops5zeros4callEN3c108ArrayRefINS2_6SymIntEEE\");\n\
                 extern void stream(void) __asm__(\"_ZN3c104cuda20getCurrentCUDAStreamEa\");\n\
                 extern int memcpy_like(void) __asm__(\"memcpy\");\n",
            );
            let mut body = String::from("zeros(); stream(); memcpy_like();");
            for (i, (sym, _)) in extra.iter().enumerate() {
                c.push_str(&format!("extern void f{i}(void) __asm__(\"{sym}\");\n"));
                body.push_str(&format!(" f{i}();"));
            }
            c.push_str(&format!("void forward(void) {{ {body} }}\n"));
            std::fs::write(dir.path().join("ext.c"), c).unwrap();
            let o = std::process::Command::new("cc")
                .args(["-shared", "-fPIC", "-o", "ext.so", "ext.c"])
                .current_dir(dir.path())
                .output()
                .expect("cc");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            std::fs::read(dir.path().join("ext.so")).unwrap()
        };
        let exports: HashSet<String> = ["aoti_torch_cuda_relu"].map(String::from).into();
        assert_eq!(
            check(&build(&[]), rules.extension_rules(), &exports).unwrap(),
            vec![]
        );
        let bad = [
            (
                "_ZN2at4_ops4relu4callERKNS_6TensorE",
                "at::_ops::relu::call",
            ),
            (
                "_ZN3c1010Dispatcher9singletonEv",
                "c10::Dispatcher::singleton",
            ),
            ("PyRun_SimpleString", "PyRun_SimpleString"),
            ("_ZN2at13globalContextEv", "at::globalContext"),
            ("aoti_torch_cuda_relu", "aoti_torch_cuda_relu"),
        ];
        let f = check(&build(&bad), rules.extension_rules(), &exports).unwrap();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].rule.as_str(), f[0].action), (RULE, Action::Reject));
        for (_, name) in bad {
            assert!(
                f[0].message.contains(&format!("`{name}`")),
                "{name}: {}",
                f[0].message
            );
        }
        assert!(!f[0].message.contains("zeros"), "{}", f[0].message);
    }
}
