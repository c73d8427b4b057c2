# Source this to run cargo by hand with the same environment as the Makefile:
#   . scripts/env.sh && cargo test -p cudarl-cuda
# tch (torch-sys) builds against the torch wheel in .venv (LIBTORCH_USE_PYTORCH=1, found through
# the venv's python), and binaries load libtorch from there at run time.
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export VIRTUAL_ENV="$_root/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
_tlib=$(ls -d "$VIRTUAL_ENV"/lib/python3*/site-packages/torch/lib 2>/dev/null | head -1)
[ -n "$_tlib" ] && export LD_LIBRARY_PATH="$_tlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _root _tlib
