//! Export of artifacts from the store to a directory, for other tools (pyarrow, polars, HF
//! datasets; VERL's schema comes with the VERL backend).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::{DataError, Result};

/// Mode of exported files: `rw-r--r--` (the store's blobs are read-only; an export is the
/// user's to edit, not everyone's).
pub const FILE_MODE: u32 = 0o644;

/// Writes `dir/file_name` through `fill` (given a temporary path beside it), with mode
/// [`FILE_MODE`], then renames it into place: a reader sees the old file or the whole new one.
fn publish(
    dir: &Path,
    file_name: &str,
    fill: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<std::path::PathBuf> {
    let werr = |e: std::io::Error| DataError::Write {
        file: dir.join(file_name).display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(werr)?;
    let dst = dir.join(file_name);
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    fill(&tmp).map_err(werr)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(FILE_MODE)).map_err(werr)?;
    std::fs::rename(&tmp, &dst).map_err(werr)?;
    Ok(dst)
}

/// Copies `src` to `dir/file_name`, replacing an existing file atomically (temp + rename), with
/// mode [`FILE_MODE`].
///
/// # Errors
/// [`DataError::Write`] naming the destination.
pub fn copy_out(src: &Path, dir: &Path, file_name: &str) -> Result<std::path::PathBuf> {
    publish(dir, file_name, |tmp| std::fs::copy(src, tmp).map(|_| ()))
}

/// Writes `bytes` to `dir/file_name` atomically (temp + rename) with mode [`FILE_MODE`].
///
/// # Errors
/// [`DataError::Write`] naming the destination.
pub fn write_file(dir: &Path, file_name: &str, bytes: &[u8]) -> Result<std::path::PathBuf> {
    publish(dir, file_name, |tmp| std::fs::write(tmp, bytes))
}

/// Gives every file directly in `dir` mode [`FILE_MODE`]; returns their names, sorted.
///
/// # Errors
/// [`DataError::Write`] naming the file.
pub fn make_shareable(dir: &Path) -> Result<Vec<String>> {
    let werr = |p: &Path, e: std::io::Error| DataError::Write {
        file: p.display().to_string(),
        message: e.to_string(),
    };
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| werr(dir, e))? {
        let e = e.map_err(|e| werr(dir, e))?;
        if e.file_type().map_err(|x| werr(&e.path(), x))?.is_file() {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(FILE_MODE))
                .map_err(|x| werr(&e.path(), x))?;
            names.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_files_are_rw_r_r_and_replace_a_read_only_copy() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("blob");
        std::fs::write(&src, b"x").unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o444)).unwrap();
        let out = d.path().join("out");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let a = copy_out(&src, &out, "t.parquet").unwrap();
        assert_eq!(mode(&a), FILE_MODE);
        // Again over the first copy (a read-only destination would not stop the rename).
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o444)).unwrap();
        copy_out(&src, &out, "t.parquet").unwrap();
        assert_eq!(mode(&a), FILE_MODE);
        let w = write_file(&out, "export.json", b"{}").unwrap();
        assert_eq!(mode(&w), FILE_MODE);
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(make_shareable(&out).unwrap(), ["export.json", "t.parquet"]);
        assert_eq!(mode(&a), FILE_MODE);
    }
}
