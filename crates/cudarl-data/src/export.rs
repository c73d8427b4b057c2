//! Export of artifacts from the store to a directory, for other tools (pyarrow, polars, HF
//! datasets; VERL's schema comes with the VERL backend).

use std::path::Path;

use crate::error::{DataError, Result};

/// Copies `src` to `dir/file_name`, replacing an existing file atomically (temp + rename), and
/// makes the copy writable (CAS blobs are read-only).
///
/// # Errors
/// [`DataError::Write`] naming the destination.
pub fn copy_out(src: &Path, dir: &Path, file_name: &str) -> Result<std::path::PathBuf> {
    let werr = |e: std::io::Error| DataError::Write {
        file: dir.join(file_name).display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(werr)?;
    let dst = dir.join(file_name);
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    std::fs::copy(src, &tmp).map_err(werr)?;
    let mut perm = std::fs::metadata(&tmp).map_err(werr)?.permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&tmp, perm).map_err(werr)?;
    std::fs::rename(&tmp, &dst).map_err(werr)?;
    Ok(dst)
}
