//! Checks on what was built, not only on what was written: the candidate's preprocessed text,
//! its host object and its PTX, kept by nvcc (`--keep`) and read before anything loads the
//! shared object (a rejecting finding discards it). Macros, token pasting, line splices,
//! digraphs and `__has_include` are resolved by the preprocessor itself, and what the object
//! imports, defines or registers is read from the ELF file, so spelling tricks that fool a regex
//! over the source do not fool these checks.
//!
//! - [`preprocessed`]: the source rules ([`crate::Rules`]) on the lines of the preprocessed
//!   host and device texts that come from the candidate's own file (linemarkers say which), and
//!   every header the candidate's file includes, resolved to its path, against the include
//!   allow-list.
//! - [`object()`]: the host object (an ELF relocatable file), below.
//! - [`ptx`]: no reads of the `%globaltimer`/`%clock`/`%clock64` special registers.
//!
//! What the object may hold (`[objects]` in `configs/harness/static_rules.toml`):
//!
//! - `object-symbol`: every undefined symbol is on the import allow-list (`native_symbols`).
//! - `object-ifunc`: no `IFUNC` symbols (their resolvers run at load time).
//! - `object-constructor`: no section whose name is or starts with `.preinit_array`,
//!   `.init_array`, `.fini_array`, `.ctors`, `.dtors`, `.init` or `.fini`, or whose type is a
//!   constructor or destructor array, except `.init_array` itself. The linker folds all of them
//!   into the load-time arrays: `__attribute__((constructor(101)))` is `.init_array.00101`,
//!   `destructor(101)` `.fini_array.00101`, a function-pointer array the candidate places in
//!   `.ctors.00100` or `.dtors` runs as well. `.init_array` holds at most one entry in all, nvcc's
//!   registration constructor (`constructor`).
//! - `object-wx`: no section both writable and executable, and no writable section the linker
//!   puts into `.text` by its name. `object-section`: no executable section outside `.text` and
//!   `.text.*`, where the compiler puts all host code (a function placed in `.data.x` is
//!   executable code the linker puts among the writable data).
//! - `object-instruction`: the encodings of `syscall` (`0f 05`), `sysenter` (`0f 34`),
//!   `int 0x80` (`cd 80`), `rdtsc` (`0f 31`) and `rdtscp` (`0f 01 f9`) at no byte offset of any
//!   code section (executable, or named so that the linker makes it code), not only where a linear
//!   disassembly puts instructions: a computed jump one byte into `mov edx, 0x9090050f` runs the
//!   `syscall` in its immediate, and the candidate chooses immediates and displacements (a
//!   constant, inline assembly), so no offset is exempt and any occurrence refuses. Measured on
//!   285 honest objects (the kernels of `tests/kernels/honest/` and `tests/kernels/kb_native/`,
//!   the 38 task kernels of `datasets/tasks/`, the naive and fast kernels of 113 of the 450
//!   operator families the default pipeline generates), built as the harness builds them: no
//!   occurrence at any offset, decoded or not, so a false-positive rate of 0 of 285 (at most about
//!   1% at 95% confidence), and none in their linked libraries either
//!   (`benchmarks/results/object_byte_scan_false_positives_cpu_2026-12-04.json`). An honest
//!   launcher whose constant or jump happens to hold one of these byte pairs (a comparison with
//!   1295, `0x050f`) is refused; the finding names the bytes. The object's relocation fields hold
//!   zeros until the link, so the linked library is scanned the same way before anything loads it
//!   ([`linked`]): a displacement the candidate steers through the layout (the size of a static
//!   array between its code and the data it addresses) is seen there.
//! - `object-export`: every symbol the object defines (global, weak or unique, any visibility) is
//!   the launcher `launch`, the shim's `cudarl_entry`, a C++ name (`_Z...`: kernels and their
//!   device stubs, the host stubs of `__device__` functions, the candidate's helpers, the inline
//!   functions and variables of the headers it includes; no C++ name is a C name of libc or the
//!   CUDA runtime), the host compiler's `DW.ref.__gxx_personality_v0`, or an `extern "C"` kernel
//!   (a name nvcc made a device stub `__device_stub__Z<length><name>` for), and none is a name the
//!   object may import (`malloc`, `cudaLaunchKernel`, `__cudaRegisterFatBinary`, `_Znwm`, ...);
//!   an `extern "C"` kernel's name is none of `reserved_exports` either (the CUDA runtime's,
//!   driver's and libraries' prefixes, the harness's `cudarl_*`, libc's process, file, socket,
//!   loader, thread, signal and clock functions). A candidate that defines `cudaGetLastError`
//!   answers the shim's check of its launches; one that defines `malloc` or `cudaLaunchKernel`
//!   takes the runtime's names. The same 285 objects define 214 distinct names, all allowed
//!   (`benchmarks/results/object_exports_honest_cpu_2026-12-04.json`). An object without the
//!   launcher is left to the link, which fails naming the launcher it expects.
//!
//! The findings use the rule ids `include`, the source rules' ids, `object-symbol`,
//! `object-ifunc`, `object-constructor`, `object-wx`, `object-section`, `object-instruction`,
//! `object-export` and `device-timer`; all reject.

use std::sync::LazyLock;

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
use regex::Regex;

use crate::static_check::{Action, Finding, ObjectRules, Rules};

/// The candidate's file name inside the build directory (linemarkers name it).
pub const SOURCE_NAME: &str = "kernel.cu";

fn reject(rule: &str, line: u32, matched: String, message: String) -> Finding {
    let mut matched = matched;
    matched.truncate(80);
    Finding {
        rule: rule.into(),
        action: Action::Reject,
        line,
        matched,
        message,
    }
}

static LINEMARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^#\s*(\d+)\s+"((?:[^"\\]|\\.)*)"((?:\s+\d+)*)\s*$"#).expect("re")
});

/// The lines of a preprocessed text that come from `file`, each with its line number in that
/// file, and every file `file` includes directly (its path as the preprocessor opened it, and
/// the line of the `#include`).
pub struct Split {
    /// `(line in the candidate's file, text)`.
    pub lines: Vec<(u32, String)>,
    /// `(path, line of the include)`.
    pub includes: Vec<(String, u32)>,
}

/// Splits preprocessor output (`# <line> "<file>" <flags>` linemarkers, GCC's format) into the
/// candidate's own lines and its direct includes.
pub fn split(pp: &str, file: &str) -> Split {
    let mut lines = Vec::new();
    let mut includes = Vec::new();
    let mut current = String::new();
    let mut next_line = 1u32;
    // The include stack: the file we are in and the line to return to.
    let mut stack: Vec<(String, u32)> = Vec::new();
    for l in pp.lines() {
        if let Some(c) = LINEMARKER.captures(l) {
            let n: u32 = c[1].parse().unwrap_or(1);
            let f = c[2].replace("\\\\", "\\").replace("\\\"", "\"");
            let flags: Vec<&str> = c[3].split_whitespace().collect();
            if flags.contains(&"1") {
                // Entering an include from `current` at its line `next_line - 1`.
                if current == file {
                    includes.push((f.clone(), next_line.saturating_sub(1).max(1)));
                }
                stack.push((current.clone(), next_line));
            } else if flags.contains(&"2") {
                stack.pop();
            }
            current = f;
            next_line = n;
            continue;
        }
        if current == file {
            lines.push((next_line, l.to_string()));
        }
        next_line = next_line.saturating_add(1);
    }
    Split { lines, includes }
}

/// Whether `path` (as the preprocessor opened it) is an allowed header: it ends with
/// `/<name>` for a name on the allow-list of `format`, and lies under one of `roots` (the
/// toolkit's and the host compiler's system include directories).
fn allowed_header(rules: &Rules, format: &str, path: &str, roots: &[String]) -> bool {
    let under_root = roots.iter().any(|r| path.starts_with(r.as_str()));
    under_root
        && rules
            .allowed_includes(format)
            .iter()
            .any(|name| path.ends_with(&format!("/{name}")))
}

/// The source rules of `format` and the include allow-list on the candidate's lines of
/// preprocessed texts (host and device passes; each rule reported once, at its first match).
/// `roots` are the system include directories a header may come from.
pub fn preprocessed(rules: &Rules, texts: &[&str], format: &str, roots: &[String]) -> Vec<Finding> {
    let mut out: Vec<Finding> = Vec::new();
    for text in texts {
        let s = split(text, SOURCE_NAME);
        for (path, line) in &s.includes {
            if path == SOURCE_NAME || out.iter().any(|f| f.rule == "include" && f.line == *line) {
                continue;
            }
            if !allowed_header(rules, format, path, roots) {
                let name = path.rsplit('/').next().unwrap_or(path);
                out.push(reject(
                    "include",
                    *line,
                    format!("#include <{name}>"),
                    format!(
                        "includes `{name}`, which is not on the {format} include allow-list (after the preprocessor resolved it)"
                    ),
                ));
            }
        }
        // One text per candidate line, so findings name the candidate's own line numbers.
        let mut body = String::new();
        let mut numbers = Vec::new();
        for (n, l) in &s.lines {
            body.push_str(l);
            body.push('\n');
            numbers.push(*n);
        }
        for mut f in rules.check_text(&body, format) {
            if out.iter().any(|g| g.rule == f.rule) {
                continue;
            }
            f.line = numbers
                .get(f.line.saturating_sub(1) as usize)
                .copied()
                .unwrap_or(f.line);
            f.message = format!("{} (after preprocessing)", f.message);
            out.push(f);
        }
    }
    out
}

/// Reads `%globaltimer`, `%clock` or `%clock64` in PTX (timer reads inside the kernel), and two
/// flags on precision: tensor-core math on reduced-precision operands
/// ([`TENSOR_CORE_PRECISION`]) and half-precision arithmetic ([`HALF_PRECISION_MATH`]).
pub fn ptx(text: &str) -> Vec<Finding> {
    static TIMER: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"%(globaltimer(?:_lo|_hi)?|clock64|clock(?:_hi)?)\b").expect("re")
    });
    // The opcode of a tensor-core instruction (`mma.sync`, `mma.sp`, `wmma.mma.sync`,
    // `wgmma.mma_async`, `tcgen05.mma`) or of a conversion to TF32, wherever it stands in a
    // statement (inline assembly puts several on a line, in braces), and the reduced-precision
    // types its opcode names.
    static MMA: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?:^|[\s{;])((?:w?gmma\.mma_async|wmma\.mma|mma\.sync|mma\.sp|tcgen05\.mma|cvt(?:\.\w+)*\.tf32)[\w.:]*)")
            .expect("re")
    });
    // Arithmetic that rounds to a half type (scalar or packed: `add.f16`, `fma.rn.bf16x2`,
    // `ex2.approx.f16`) and conversions of f32 to one (`cvt.rn.f16.f32`, `cvt.rn.bf16x2.f32`).
    // Moves, comparisons, min/max and conversions from a half type lose nothing.
    static HALF: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?:^|[\s{;])((?:(?:add|sub|mul|fma|mad|div|ex2|tanh|sqrt|rsqrt|rcp|lg2|sin|cos)(?:\.(?:rn|rz|rm|rp|ftz|sat|approx|full|relu|oob))*\.(?:f16x2|bf16x2|f16|bf16)|cvt(?:\.(?:rn|rz|rm|rp|rna|rs|sat|relu|satfinite|ftz))*\.(?:f16x2|bf16x2|f16|bf16)\.f32)\b)",
        )
        .expect("re")
    });
    static LOW: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"[.:](tf32|f16|bf16|e4m3|e5m2|e2m1|e3m2|e2m3|f8f6f4|mxf\w+|s8|u8|s4|u4|b1|i8)\b",
        )
        .expect("re")
    });
    let mut out: Vec<Finding> = TIMER
        .find(text)
        .map(|m| {
            reject(
                "device-timer",
                0,
                m.as_str().into(),
                format!(
                    "the kernel reads the GPU clock ({}); timing is the harness's, not the kernel's",
                    m.as_str()
                ),
            )
        })
        .into_iter()
        .collect();
    let mut types: Vec<&str> = MMA
        .captures_iter(text)
        .flat_map(|c| {
            LOW.captures_iter(c.get(1).expect("group").as_str())
                .map(|t| t.get(1).expect("group").as_str())
        })
        .collect();
    types.sort_unstable();
    types.dedup();
    let half: Vec<&str> = HALF
        .captures_iter(text)
        .map(|c| c.get(1).expect("group").as_str())
        .collect();
    if let Some(first) = half.first() {
        let mut f = reject(
            HALF_PRECISION_MATH,
            0,
            (*first).into(),
            format!(
                "the kernel computes in half precision ({} in its PTX, {} such instructions): f16/bf16 arithmetic or a rounding of f32 values to f16/bf16",
                first,
                half.len()
            ),
        );
        f.action = Action::Flag;
        out.push(f);
    }
    if !types.is_empty() {
        let mut f = reject(
            TENSOR_CORE_PRECISION,
            0,
            types.join(" "),
            format!(
                "the kernel does tensor-core math on {} operands or converts to TF32 (mma/wmma/wgmma/tcgen05/cvt in its PTX), which rounds f32 inputs",
                types.join("/")
            ),
        );
        f.action = Action::Flag;
        out.push(f);
    }
    out
}

/// The rule id of tensor-core math on reduced-precision operands in the PTX ([`ptx`]): a flag,
/// which rejects the kernel of an `f32` task that does not declare `allow_tf32`
/// ([`crate::verdict::build_native`]).
pub const TENSOR_CORE_PRECISION: &str = "tensor-core-precision";

/// The rule id of half-precision arithmetic in the PTX ([`ptx`]): a flag, which rejects the
/// kernel of an `f32` task as [`TENSOR_CORE_PRECISION`] does.
pub const HALF_PRECISION_MATH: &str = "half-precision-math";

/// The launcher the generated shim calls: undefined when the candidate does not define it,
/// which the link reports as a missing launcher (not a forbidden import).
pub const LAUNCHER: &str = "launch";

/// The entry point the generated shim defines and the runner calls
/// ([`crate::task::entry_shim`]).
pub const ENTRY: &str = "cudarl_entry";

/// The one symbol of the host compiler's own an object defines: the hidden, weak pointer to
/// the C++ personality routine its unwind tables name.
const PERSONALITY_REF: &str = "DW.ref.__gxx_personality_v0";

/// Bytes that are not an ELF file `object` can read (a truncated or hostile build output).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ObjectError {
    /// What the bytes were to be: `object file` (a candidate's object) or `shared object` (a
    /// built extension).
    pub what: &'static str,
    /// `object`'s error.
    pub source: object::Error,
}

impl From<object::Error> for ObjectError {
    fn from(source: object::Error) -> ObjectError {
        ObjectError {
            what: "object file",
            source,
        }
    }
}

/// Checks a compiled host object (an ELF relocatable file; see the module docs). Findings come
/// in this order: imports, IFUNC symbols, load-time sections, code sections, instructions,
/// exports.
///
/// # Errors
/// The bytes are not an object file `object` can read.
pub fn object(bytes: &[u8], rules: &ObjectRules) -> Result<Vec<Finding>, ObjectError> {
    let file = object::File::parse(bytes)?;
    let mut out = Vec::new();
    let mut bad: Vec<String> = file
        .symbols()
        .filter(|s| s.is_undefined())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .filter(|n| !n.is_empty() && n != LAUNCHER && !rules.allows(n))
        .collect();
    bad.sort();
    bad.dedup();
    if !bad.is_empty() {
        out.push(reject(
            "object-symbol",
            0,
            bad.join(" "),
            format!(
                "the host code calls {}, which a kernel launcher has no use for (allowed: CUDA launches, memsets/copies on the stream, attributes and occupancy queries, libm, printf)",
                bad.iter().map(|b| format!("`{b}`")).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    for s in file.symbols() {
        if let object::SymbolFlags::Elf { st_info, .. } = s.flags()
            && st_info.st_type() == object::elf::STT_GNU_IFUNC
        {
            out.push(reject(
                "object-ifunc",
                0,
                s.name().unwrap_or("?").into(),
                "defines an IFUNC symbol (its resolver runs when the library is loaded)".into(),
            ));
            break;
        }
    }
    out.extend(load_time_sections(&file, rules));
    out.extend(code_sections(&file));
    out.extend(
        code_hits_of(&file)
            .into_iter()
            .next()
            .map(|h| instruction_finding(&h, "host code")),
    );
    // Without the launcher the link fails and says which launcher it expects: a misnamed one
    // (`launch_kernel`) is explained there, not as a name the object may not define.
    let has_launcher = file
        .symbols()
        .any(|s| !s.is_undefined() && s.name() == Ok(LAUNCHER));
    let exported = refused_exports(&file, rules);
    if has_launcher && !exported.is_empty() {
        out.push(reject(
            "object-export",
            0,
            exported.join(" "),
            format!(
                "the object defines {}: with C linkage it may define only the launcher `{LAUNCHER}`, the shim's `{ENTRY}` and `extern \"C\"` kernels, and no name of the CUDA runtime, libc, the C++ runtime or the harness (make a helper function or host variable `static`, or give it C++ linkage)",
                exported.iter().map(|b| format!("`{b}`")).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    Ok(out)
}

/// The defined, non-local symbols of `file` that an object may not define (sorted): a name it
/// may import (`[objects] native_symbols`), and any C (unmangled) name other than the ABI's
/// ([`LAUNCHER`], [`ENTRY`]), the host compiler's [`PERSONALITY_REF`] and an `extern "C"`
/// kernel (a name nvcc made a device stub for) outside `[objects] reserved_exports`. C++
/// (`_Z`-mangled) names are the candidate's kernels, device functions' host stubs, helpers and
/// the inline functions of the headers it includes; none of them can be a C name of libc or the
/// CUDA runtime.
fn refused_exports(file: &object::File<'_>, rules: &ObjectRules) -> Vec<String> {
    let defined: Vec<(String, bool)> = file
        .symbols()
        .filter(|s| {
            !s.is_undefined()
                && !matches!(
                    s.kind(),
                    object::SymbolKind::Section | object::SymbolKind::File
                )
        })
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.is_local())))
        .filter(|(n, _)| !n.is_empty())
        .collect();
    let stubs: Vec<&str> = defined
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.contains("__device_stub__"))
        .collect();
    let mut bad: Vec<String> = defined
        .iter()
        .filter(|(_, local)| !local)
        .map(|(n, _)| n)
        .filter(|n| !export_allowed(n, &stubs, rules))
        .cloned()
        .collect();
    bad.sort();
    bad.dedup();
    bad
}

/// One non-local symbol an object defines.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Export {
    /// Its name.
    pub name: String,
    /// `GLOBAL`, `WEAK` or `UNIQUE`.
    pub binding: &'static str,
    /// `DEFAULT`, `PROTECTED`, `HIDDEN` or `INTERNAL`.
    pub visibility: &'static str,
    /// The object check lets the object define it (`object-export`).
    pub allowed: bool,
}

/// Every defined, non-local symbol of an object, with whether `rules` allow it (sorted by name).
///
/// # Errors
/// The bytes are not an object file `object` can read.
pub fn exports(bytes: &[u8], rules: &ObjectRules) -> Result<Vec<Export>, ObjectError> {
    let file = object::File::parse(bytes)?;
    let refused = refused_exports(&file, rules);
    let mut out: Vec<Export> = file
        .symbols()
        .filter(|s| !s.is_undefined() && !s.is_local())
        .filter_map(|s| {
            let name = s.name().ok()?.to_string();
            let (binding, visibility) = match s.flags() {
                object::SymbolFlags::Elf { st_info, st_other } => (
                    match st_info.st_bind() {
                        object::elf::STB_GLOBAL => "GLOBAL",
                        object::elf::STB_WEAK => "WEAK",
                        object::elf::STB_GNU_UNIQUE => "UNIQUE",
                        _ => "OTHER",
                    },
                    match st_other.visibility() {
                        object::elf::STV_DEFAULT => "DEFAULT",
                        object::elf::STV_PROTECTED => "PROTECTED",
                        object::elf::STV_HIDDEN => "HIDDEN",
                        _ => "INTERNAL",
                    },
                ),
                _ => ("OTHER", "OTHER"),
            };
            Some(Export {
                allowed: !refused.contains(&name),
                name,
                binding,
                visibility,
            })
        })
        .filter(|e| !e.name.is_empty())
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Whether an object may define the non-local symbol `name` (see [`refused_exports`]); `stubs`
/// are the names of the object's defined symbols that contain `__device_stub__`.
fn export_allowed(name: &str, stubs: &[&str], rules: &ObjectRules) -> bool {
    if name == LAUNCHER || name == ENTRY {
        return true;
    }
    if rules.allows(name) {
        return false;
    }
    if name.starts_with("_Z") || name == PERSONALITY_REF {
        return true;
    }
    // nvcc names the device stub of `extern "C" __global__ void k(...)` after the kernel's C++
    // mangling: `_Z<n>__device_stub__Z1k<parameters>`.
    let key = format!("__device_stub__Z{}{name}", name.len());
    stubs.iter().any(|s| s.contains(&key)) && !rules.reserves(name)
}

/// Section names that run code when the library is loaded or unloaded (prefixes: the linker
/// folds `.init_array.NNNNN`, `.ctors`, `.ctors.NNNNN` into `.init_array` and the `.fini`/
/// `.dtors` ones into `.fini_array`).
const LOAD_TIME_PREFIXES: [&str; 7] = [
    ".preinit_array",
    ".init_array",
    ".fini_array",
    ".ctors",
    ".dtors",
    ".init",
    ".fini",
];

/// Whether a section of this name and type holds code or pointers run at load or unload time.
fn load_time_section(name: &str, sh_type: object::elf::SectionType) -> bool {
    LOAD_TIME_PREFIXES.iter().any(|p| name.starts_with(p))
        || [
            object::elf::SHT_INIT_ARRAY,
            object::elf::SHT_FINI_ARRAY,
            object::elf::SHT_PREINIT_ARRAY,
        ]
        .contains(&sh_type)
}

fn elf_section_flags(sec: &object::Section<'_, '_>) -> (object::elf::SectionType, u64) {
    match sec.flags() {
        object::SectionFlags::Elf { sh_type, sh_flags } => (sh_type, sh_flags.0),
        _ => (object::elf::SHT_NULL, 0),
    }
}

/// `object-constructor`: every load-time section ([`load_time_section`]) but `.init_array`
/// itself, and more than one `.init_array` entry in all, or one that is not nvcc's
/// registration constructor.
fn load_time_sections(file: &object::File<'_>, rules: &ObjectRules) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut entries: Vec<String> = Vec::new();
    for sec in file.sections() {
        let name = sec.name().unwrap_or("");
        let (sh_type, _) = elf_section_flags(&sec);
        if !load_time_section(name, sh_type) {
            continue;
        }
        if name == ".init_array" && sh_type == object::elf::SHT_INIT_ARRAY {
            let mut targets = init_targets(file, &sec);
            // A slot without a relocation is an entry too (an absolute address).
            let slots = sec.size().div_ceil(8) as usize;
            targets.resize(targets.len().max(slots), "?".into());
            entries.extend(targets);
        } else if !out.iter().any(|f: &Finding| f.matched == name) {
            out.push(reject(
                "object-constructor",
                0,
                name.into(),
                format!(
                    "has a `{name}` section: code that runs at load or unload (constructors and destructors with a priority, `.ctors`/`.dtors` arrays and the like)"
                ),
            ));
        }
    }
    if entries.len() > 1 || entries.iter().any(|t| t != &rules.constructor) {
        out.push(reject(
            "object-constructor",
            0,
            entries.join(" "),
            "has constructors beyond nvcc's registration (`__attribute__((constructor))`, a global with a dynamic initializer): code that runs at load".into(),
        ));
    }
    out
}

/// The function names `.init_array`'s relocations point at (section-relative targets resolved
/// to the symbol defined at that offset).
fn init_targets<'d>(file: &object::File<'d>, sec: &object::Section<'d, '_>) -> Vec<String> {
    let mut out = Vec::new();
    for (_, rel) in sec.relocations() {
        let RelocationTarget::Symbol(i) = rel.target() else {
            out.push("?".into());
            continue;
        };
        let Ok(sym) = file.symbol_by_index(i) else {
            out.push("?".into());
            continue;
        };
        let name = sym.name().unwrap_or("");
        if sym.kind() == object::SymbolKind::Section {
            let at = sym.address().wrapping_add(rel.addend() as u64);
            let found = file.symbols().find(|s| {
                s.section_index() == sym.section_index()
                    && s.kind() == object::SymbolKind::Text
                    && s.address() == at
            });
            out.push(found.and_then(|s| s.name().ok()).unwrap_or("?").to_string());
        } else {
            out.push(name.to_string());
        }
    }
    out
}

/// Whether the linker puts an input section of this name into an executable output section
/// whatever its flags (GNU ld's default script: `.text`, `.text.*`, `.stub`,
/// `.gnu.linkonce.t.*`, `.gnu.warning`, the PLTs, `.init`, `.fini`).
fn linker_code_name(name: &str) -> bool {
    name == ".text"
        || name.starts_with(".text.")
        || name == ".stub"
        || name.starts_with(".gnu.linkonce.t.")
        || name == ".gnu.warning"
        || [".plt", ".iplt", ".plt.got", ".plt.sec", ".init", ".fini"].contains(&name)
}

/// Whether a section ends up executable after the link: `SHF_EXECINSTR`, or a name the linker
/// puts into executable code ([`linker_code_name`]).
fn is_code(name: &str, sh_flags: u64) -> bool {
    sh_flags & object::elf::SHF_EXECINSTR.0 != 0 || linker_code_name(name)
}

/// `object-wx` and `object-section`: a section both writable and executable (a writable one the
/// linker makes code counts, and so does code the linker puts among writable data), and code
/// outside `.text`/`.text.*` (where the compiler puts all of it; elsewhere the linker's
/// placement decides what else shares its pages).
fn code_sections(file: &object::File<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for sec in file.sections() {
        let name = sec.name().unwrap_or("");
        let (sh_type, sh_flags) = elf_section_flags(&sec);
        if !is_code(name, sh_flags) || load_time_section(name, sh_type) {
            continue;
        }
        let text = name == ".text" || name.starts_with(".text.");
        if sh_flags & object::elf::SHF_WRITE.0 != 0 {
            if !out.iter().any(|f: &Finding| f.rule == "object-wx") {
                out.push(reject(
                    "object-wx",
                    0,
                    name.into(),
                    format!(
                        "the section `{name}` is both writable and executable: code that can be rewritten at run time escapes every check on the object"
                    ),
                ));
            }
        } else if !text && !out.iter().any(|f: &Finding| f.rule == "object-section") {
            out.push(reject(
                "object-section",
                0,
                name.into(),
                format!(
                    "executable code in the section `{name}`: the compiler puts host code only in `.text` and `.text.*`"
                ),
            ));
        }
    }
    out
}

/// The `object-instruction` finding for hit `h` in `what` (the host code, the linked library).
fn instruction_finding(h: &CodeHit, what: &str) -> Finding {
    let how = if h.decoded {
        String::new()
    } else {
        format!(
            ", hidden inside `{}`, the instruction a linear disassembly decodes at {:#x} (a jump into its middle runs it)",
            h.within_bytes, h.within
        )
    };
    reject(
        "object-instruction",
        0,
        format!("{} at {}+{:#x}", h.what, h.section, h.offset),
        format!(
            "the {what} contains the encoding of `{}` (a raw system call or clock read) at `{}`+{:#x}{how}",
            h.what, h.section, h.offset
        ),
    )
}

/// `object-instruction` on the linked shared object (`bytes`): the same scan as [`object()`]'s
/// over every code section of the library (its PLT, the C runtime's start files, and the
/// object's code with the values the linker wrote into its relocation fields, which the object
/// holds as zeros). On the 285 honest builds of
/// `benchmarks/results/object_byte_scan_false_positives_cpu_2026-12-04.json` no linked library
/// has a hit; on an H100 host one honest kernel of 938 had one, in a displacement the link wrote
/// (`benchmarks/results/main_job_pooling_h100_2026-12-07.json`), which the build then linked
/// away (`Compiler::scan_linked` in `crates/cudarl-cuda/src/compile.rs`).
///
/// # Errors
/// The bytes are not an ELF file `object` can read.
pub fn linked(bytes: &[u8]) -> Result<Vec<Finding>, ObjectError> {
    Ok(code_hits(bytes)?
        .into_iter()
        .next()
        .map(|h| instruction_finding(&h, "linked library"))
        .into_iter()
        .collect())
}

/// The system-call and clock-read instructions refused in host code, by encoding.
pub const REFUSED_ENCODINGS: [(&[u8], &str); 5] = [
    (&[0x0f, 0x05], "syscall"),
    (&[0x0f, 0x34], "sysenter"),
    (&[0xcd, 0x80], "int 0x80"),
    (&[0x0f, 0x31], "rdtsc"),
    (&[0x0f, 0x01, 0xf9], "rdtscp"),
];

/// One refused encoding in an object's code.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CodeHit {
    /// The section.
    pub section: String,
    /// Its offset in the section.
    pub offset: u64,
    /// The instruction it encodes (`syscall`, `rdtsc`, ...).
    pub what: &'static str,
    /// A linear disassembly of the section (from its start) decodes that instruction there.
    pub decoded: bool,
    /// The offset of the linearly decoded instruction the encoding starts in.
    pub within: u64,
    /// That instruction's bytes, hex.
    pub within_bytes: String,
}

/// Every refused encoding ([`REFUSED_ENCODINGS`]) at every byte offset of every code section
/// ([`is_code`]) of an object, in section order.
///
/// # Errors
/// The bytes are not an object file `object` can read.
pub fn code_hits(bytes: &[u8]) -> Result<Vec<CodeHit>, ObjectError> {
    let file = object::File::parse(bytes)?;
    Ok(code_hits_of(&file))
}

fn code_hits_of(file: &object::File<'_>) -> Vec<CodeHit> {
    let mut out = Vec::new();
    for sec in file.sections() {
        let name = sec.name().unwrap_or("");
        let (_, sh_flags) = elf_section_flags(&sec);
        if !is_code(name, sh_flags) {
            continue;
        }
        let Ok(data) = sec.data() else { continue };
        out.extend(scan_code(data).into_iter().map(|mut h| {
            h.section = name.to_string();
            h
        }));
    }
    out
}

/// [`REFUSED_ENCODINGS`] at every byte offset of `code`, each with the linearly decoded
/// instruction it starts in (section names left empty).
fn scan_code(code: &[u8]) -> Vec<CodeHit> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    // (start, length, what) of every linearly decoded instruction.
    let mut linear: Vec<(usize, usize, Option<&'static str>)> = Vec::new();
    let mut d = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    for ins in &mut d {
        let what = match ins.mnemonic() {
            Mnemonic::Syscall => Some("syscall"),
            Mnemonic::Sysenter => Some("sysenter"),
            Mnemonic::Int if ins.immediate8() == 0x80 => Some("int 0x80"),
            Mnemonic::Rdtsc => Some("rdtsc"),
            Mnemonic::Rdtscp => Some("rdtscp"),
            _ => None,
        };
        linear.push((ins.ip() as usize, ins.len(), what));
    }
    let mut out = Vec::new();
    for at in 0..code.len() {
        for (enc, what) in REFUSED_ENCODINGS {
            if !code[at..].starts_with(enc) {
                continue;
            }
            let i = linear.partition_point(|(s, _, _)| *s <= at);
            let (start, len, decoded) = match i.checked_sub(1).map(|i| linear[i]) {
                Some((s, l, w)) if at < s + l => (s, l, w == Some(what)),
                _ => (at, 0, false),
            };
            out.push(CodeHit {
                section: String::new(),
                offset: at as u64,
                what,
                decoded,
                within: start as u64,
                within_bytes: code[start..(start + len).min(code.len())]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_the_candidates_lines_with_their_numbers() {
        let pp = "# 1 \"kernel.cu\"\n# 1 \"<built-in>\" 1\n# 1 \"kernel.cu\" 2\n# 1 \"/usr/include/stdio.h\" 1 3 4\nint printf(const char*, ...);\n# 3 \"kernel.cu\" 2\nint x = 1;\n\nvoid f() { system(\"ls\"); }\n";
        let s = split(pp, "kernel.cu");
        assert_eq!(
            s.includes,
            vec![
                ("<built-in>".to_string(), 1),
                ("/usr/include/stdio.h".to_string(), 1)
            ]
        );
        let text: Vec<(u32, &str)> = s.lines.iter().map(|(n, l)| (*n, l.as_str())).collect();
        assert_eq!(
            text,
            vec![
                (3, "int x = 1;"),
                (4, ""),
                (5, "void f() { system(\"ls\"); }")
            ]
        );
    }

    /// (offset, what, decoded) of every hit.
    fn hits(code: &[u8]) -> Vec<(u64, &'static str, bool)> {
        scan_code(code)
            .into_iter()
            .map(|h| (h.offset, h.what, h.decoded))
            .collect()
    }

    #[test]
    fn the_byte_scan_finds_decoded_and_hidden_encodings() {
        // mov eax, 59; syscall: decoded where it stands.
        assert_eq!(
            hits(&[0xb8, 0x3b, 0, 0, 0, 0x0f, 0x05]),
            vec![(5, "syscall", true)]
        );
        // rdtsc; rdtscp; int 0x80; sysenter, each decoded.
        assert_eq!(
            hits(&[0x0f, 0x31, 0x0f, 0x01, 0xf9, 0xcd, 0x80, 0x0f, 0x34]),
            vec![
                (0, "rdtsc", true),
                (2, "rdtscp", true),
                (5, "int 0x80", true),
                (7, "sysenter", true)
            ]
        );
        // mov edx, 0x9090050f: a syscall inside the immediate, one byte into the instruction
        // (what `hidden_syscall_immediate.cu` jumps to).
        let h = scan_code(&[0xba, 0x0f, 0x05, 0x90, 0x90]);
        assert_eq!(
            (h.len(), h[0].offset, h[0].what, h[0].decoded, h[0].within),
            (1, 1, "syscall", false, 0)
        );
        assert_eq!(h[0].within_bytes, "ba0f059090");
        // movabs rax, imm64 holding `rdtsc; ret` (what `hidden_rdtsc_immediate.cu` calls).
        assert_eq!(
            hits(&[0x48, 0xb8, 0x0f, 0x31, 0xc3, 0x90, 0x90, 0, 0, 0]),
            vec![(2, "rdtsc", false)]
        );
        // shr eax, 15; add eax, 0x10: `0f 05` across two instructions.
        assert_eq!(
            hits(&[0xc1, 0xe8, 0x0f, 0x05, 0x10, 0, 0, 0]),
            vec![(2, "syscall", false)]
        );
        // int 0x80 inside a jump's displacement.
        assert_eq!(
            hits(&[0xe9, 0xcd, 0x80, 0, 0]),
            vec![(1, "int 0x80", false)]
        );
        // push rbp; mov rbp, rsp; mov eax, 0x0f; pop rbp; ret: no encoding, and none cut off
        // at the end.
        assert!(hits(&[0x55, 0x48, 0x89, 0xe5, 0xb8, 0x0f, 0, 0, 0, 0x5d, 0xc3]).is_empty());
        assert!(hits(&[0x90, 0x0f]).is_empty());
        assert!(hits(&[0x90, 0x0f, 0x01]).is_empty());
    }

    #[test]
    fn load_time_sections_are_matched_by_prefix_and_type() {
        let prog = object::elf::SHT_PROGBITS;
        for name in [
            ".init_array",
            ".init_array.00101",
            ".fini_array",
            ".fini_array.00101",
            ".preinit_array",
            ".ctors",
            ".ctors.00100",
            ".dtors",
            ".dtors.65535",
            ".init",
            ".fini",
        ] {
            assert!(load_time_section(name, prog), "{name}");
        }
        for name in [
            ".text",
            ".data",
            ".rodata",
            ".rela.init_array",
            ".nv_fatbin",
            "",
        ] {
            assert!(!load_time_section(name, prog), "{name}");
        }
        // Named like data, typed as a constructor array.
        assert!(load_time_section(".mydata", object::elf::SHT_INIT_ARRAY));
        assert!(load_time_section(".mydata", object::elf::SHT_PREINIT_ARRAY));
        assert!(load_time_section(".mydata", object::elf::SHT_FINI_ARRAY));
    }

    #[test]
    fn code_is_what_is_executable_or_what_the_linker_puts_in_text() {
        let x = object::elf::SHF_EXECINSTR.0;
        assert!(is_code(".text", x) && is_code(".text._ZN4dim3C2Ejjj", x));
        assert!(is_code(".wxbuf", x) && is_code(".data.fast", x));
        // Not marked executable, but placed in `.text` by the linker's script.
        assert!(is_code(".text.hidden", 0) && is_code(".gnu.linkonce.t.x", 0));
        assert!(!is_code(".rodata", 0) && !is_code(".textual", 0) && !is_code(".data", 0));
    }

    #[test]
    fn exports_are_the_abi_kernels_and_cxx_names_never_runtime_names() {
        let rules = crate::Rules::builtin();
        let r = rules.object_rules();
        let stubs = [
            "_Z21__device_stub__Z2ckPfPf",
            "_Z27__device_stub__Z11cudarl_noopv",
            "_Z22__device_stub__Z6mallocm",
        ];
        for ok in [
            LAUNCHER,
            ENTRY,
            PERSONALITY_REF,
            "ck",
            "_Z15vector_add_vec4PKfS0_Pfl",
            "_Z42__device_stub__Z15vector_add_vec4PKfS0_PflPKfS0_Pfl",
            "_Z4geluf",
            "_ZN4dim3C1Ejjj",
            "_ZSt3minIlERKT_S2_S2_",
        ] {
            assert!(export_allowed(ok, &stubs, r), "{ok}");
        }
        for bad in [
            "malloc",
            "cudaLaunchKernel",
            "cudaGetLastError",
            "cudaStreamSynchronize",
            "__cudaRegisterFatBinary",
            "cudarl_noop",
            "cudarl_entry_shim",
            "global_host_var",
            "ck2",
            "_Znwm",
            "_ZdlPv",
            "_ZSt17__throw_bad_allocv",
        ] {
            assert!(!export_allowed(bad, &stubs, r), "{bad}");
        }
        // The pairing is by the length-prefixed name: `c` is not `ck`'s kernel.
        assert!(!export_allowed("c", &stubs, r));
    }

    #[test]
    fn the_shim_defines_the_entry_the_export_rule_allows() {
        let shim = crate::task::entry_shim("", "extern \"C\" void launch()", &[]);
        assert!(
            shim.contains(&format!("extern \"C\" int {ENTRY}(")),
            "{shim}"
        );
    }

    #[test]
    fn ptx_tensor_core_math_on_reduced_precision_is_flagged() {
        let tf32 = "\tmma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};";
        let f = ptx(tf32);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].rule.as_str(), f[0].action, f[0].matched.as_str()),
            (TENSOR_CORE_PRECISION, Action::Flag, "tf32")
        );
        let wmma = "\twmma.mma.sync.aligned.row.col.m16n16k16.f32.f16.f16.f32 {%f1}, {%r1}, {%r2}, {%f2};\n@%p1 mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2};";
        assert_eq!(ptx(wmma)[0].matched, "bf16 f16");
        // Inline assembly: in braces and after another instruction on one line; int8 operands;
        // a conversion to TF32 alone.
        assert_eq!(
            ptx("{ mov.b32 %r1, %r2; mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1}, {%r1}, {%r2}, {%f2}; }")[0].matched,
            "tf32"
        );
        assert_eq!(
            ptx("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r1}, {%r2}, {%r3}, {%r4};")[0]
                .matched,
            "s8"
        );
        assert_eq!(ptx("\tcvt.rna.tf32.f32 %r1, %f1;")[0].matched, "tf32");
        // Half-precision arithmetic, scalar and packed, and f32 rounded to a half type.
        for (line, op) in [
            ("\tadd.rn.f16x2 %r3, %r1, %r2;", "add.rn.f16x2"),
            ("{ fma.rn.bf16x2 %r4, %r1, %r2, %r3; }", "fma.rn.bf16x2"),
            ("\tmul.f16 %rs3, %rs1, %rs2;", "mul.f16"),
            ("\tex2.approx.f16 %rs2, %rs1;", "ex2.approx.f16"),
            ("\tcvt.rn.bf16x2.f32 %r1, %f2, %f1;", "cvt.rn.bf16x2.f32"),
            ("\tcvt.rn.f16.f32 %rs1, %f1;", "cvt.rn.f16.f32"),
        ] {
            let f = ptx(line);
            assert_eq!(f.len(), 1, "{line}");
            assert_eq!(
                (f[0].rule.as_str(), f[0].action, f[0].matched.as_str()),
                (HALF_PRECISION_MATH, Action::Flag, op),
                "{line}"
            );
        }
        // Reading half inputs into f32, moving and comparing halves lose nothing.
        for line in [
            "\tcvt.f32.f16 %f1, %rs1;",
            "\tcvt.f32.bf16 %f1, %rs1;",
            "\tmov.b32 {%rs1, %rs2}, %r1;",
            "\tmax.f16x2 %r3, %r1, %r2;",
            "\tsetp.lt.f16 %p1, %rs1, %rs2;",
            "\tadd.f32 %f3, %f1, %f2;",
            "\tld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];",
        ] {
            assert!(ptx(line).is_empty(), "{line}");
        }
        assert_eq!(
            ptx("tcgen05.mma.cta_group::1.kind::tf32 [%r1], %rd1, %rd2, %r3, p;")[0].matched,
            "tf32"
        );
        // f32 math, and half types outside tensor-core instructions, are not tensor-core math
        // (the rounding to f16 is half-precision math).
        assert!(
            ptx("\tfma.rn.f32 %f3, %f1, %f2, %f3;\n\tcvt.rn.f16.f32 %rs1, %f3;\n\tld.global.b16 %rs2, [%rd1];")
                .iter()
                .all(|f| f.rule == HALF_PRECISION_MATH)
        );
        assert!(
            ptx(
                "\tmma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%fd1}, {%fd2}, {%fd3}, {%fd4};"
            )
            .is_empty()
        );
    }

    #[test]
    fn ptx_timer_reads_are_found() {
        assert_eq!(ptx("mov.u64 %rd1, %globaltimer;").len(), 1);
        assert_eq!(ptx("mov.u32 %r1, %clock;")[0].matched, "%clock");
        assert!(ptx("mov.u32 %r1, %tid.x; // clocks").is_empty());
    }
}
