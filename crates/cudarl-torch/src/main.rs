//! `cudarl-pipe-worker`: the sandboxed GPU worker spawned by `cudarl-pipe` (JSON jobs on stdin,
//! heartbeats and results on stdout; see `cudarl_cuda::worker`). Not meant to be run by hand.

fn main() {
    std::process::exit(cudarl_torch::worker::worker_main(
        &cudarl_cuda::worker::Limits::default(),
    ));
}
