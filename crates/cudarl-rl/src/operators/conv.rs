//! Convolution families: KernelBench's convolutions (level 1 `conv_standard_1D`,
//! `conv_standard_2D__square_input__square_kernel`, `conv_depthwise_2D_square_input_square_kernel`,
//! `conv_pointwise_2D`, `conv_standard_3D__cubic_input__cubic_kernel`,
//! `conv_transposed_2D__square_input__square_kernel`, their `asymmetric_kernel` kin; level 2
//! `Conv2d_ReLU_BiasAdd` and its kin) as seeded families.
//!
//! Kinds and tiers:
//! - tier 2, `conv:conv1d`: `nn.Conv1d(in_channels, out_channels, kernel_size, bias=False)` over
//!   `x` of shape `(batch_size, in_channels, length)`, no padding; the output is `(batch_size,
//!   out_channels, (length - kernel_size) / stride + 1)` (the dilated extent for
//!   `kernel_size` with `|dil`); some families stride 2 or 3 (`|stride2`, `|stride3`).
//! - `|dil` (1D and standard 2D kinds, three in ten): a dilation of 2-4 (1D) or 2-3 (2D),
//!   `dilation=2` a literal of the layer's call as the stride and padding are; the window's taps
//!   are that far apart and its extent `dilation * (kernel_size - 1) + 1` (KernelBench's
//!   `conv_standard_1D_dilated_strided__`, `conv_standard_2D_square_input_asymmetric_kernel___
//!   dilated____padded__`).
//! - tier 2, `conv:conv2d`: `nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)` over
//!   `(batch_size, in_channels, height, width)` with a square kernel; some families stride 2
//!   (`|stride2`) or pad by `kernel_size // 2` (`|pad`; an asymmetric window by half of the
//!   square size 3 or 5 drawn with it, so not "same" along both dimensions), both literals of
//!   the module's call.
//! - tier 2, `conv:depthwise2d`: `nn.Conv2d(in_channels, in_channels, kernel_size,
//!   groups=in_channels, bias=False)`. The reference language takes the group count as a
//!   literal, so a depthwise family keeps `in_channels` fixed across its shapes (8, 16 or 32).
//! - tier 2, `conv:pointwise2d`: the 1x1 convolution `nn.Conv2d(in_channels, out_channels,
//!   kernel_size=1, bias=False)`.
//! - tier 2, `conv:conv3d`: `nn.Conv3d(in_channels, out_channels, kernel_size, bias=False)` over
//!   `(batch_size, in_channels, depth, height, width)` with a cubic kernel, stride 1, no
//!   padding.
//! - tier 2, `conv:transposed2d`: `nn.ConvTranspose2d(in_channels, out_channels, kernel_size,
//!   bias=False)` with a square kernel, some families with stride 2 (`|stride2`) or padding 1
//!   (`|pad`); the weight is `(in_channels, out_channels, kernel_size, kernel_size)` and each
//!   output dimension `(d - 1) * stride - 2 * padding + kernel_size`.
//! - `|asym` (standard 2D, 3D and transposed kinds): an asymmetric window stated as KernelBench
//!   states it, the module constant `kernel_size = (3, 7)` (3D: `(3, 5, 7)`) passed to the
//!   layer; a tuple is no launcher size, so its extents are literals of the weight's shape and
//!   of the kernels ([`Window`]).
//! - tier 3, `conv:fused2d`: `nn.Conv2d(in_channels, out_channels, kernel_size)` with its bias,
//!   then 1-3 elementwise steps (activations, scaling, clamping) and optionally a parameter
//!   `self.bias` of shape `(out_channels, 1, 1)` added (broadcast over the batch and the
//!   pixels).
//!
//! PyTorch docs, `torch.nn.Conv1d` and `torch.nn.Conv2d`: output channel `co` of image `n` is
//! `sum_ci sum_kh sum_kw w[co, ci, kh, kw] x[n, g * Cin/groups + ci, oh * s - p + kh, ow * s - p
//! + kw]` (zero outside the input) plus the bias, `g` the group of `co`; the output size is
//! `(H + 2 p - K) / s + 1` per spatial dimension. With dilation `d` the taps are `oh * s - p + kh
//! * d`, and `K` is the dilated extent `d (K - 1) + 1`.
//!
//! Kernels: the naive one is one thread per output element looping over the input channels of
//! its group and the window. The fast ones: a block per output tile (32 x 8 pixels in 2D, 128
//! positions in 1D) and 4 or 8 output channels, the input tile with its halo and the filter taps
//! staged in shared memory a few input channels at a time, each thread accumulating its pixel's
//! output channels in registers (`tile_2d.cu`, `tile_1d.cu`); a block per 32 x 32 tile of one
//! depthwise plane, input tile and filter in shared memory, 4 rows per thread
//! (`depthwise_tile.cu`); the pointwise convolution as a batched matmul `W (Cout x Cin) X_n
//! (Cin x H W)` with 32 x 32 shared-memory tiles (`pointwise_gemm.cu`); for the 3D and transposed
//! kinds one thread per output position computing 4 or 8 output channels, each input value read
//! once for all of them and the filters' taps staged in shared memory 4 input channels at a time
//! (`cob_3d.cu`, `cob_transposed.cu`; a transposed output gathers the inputs `i` with
//! `i * stride - padding + k = o`, PyTorch docs, `torch.nn.ConvTranspose2d`). Kernel sizes 3 and
//! 5 and asymmetric windows get unrolled window loops; any other size runs the same code with
//! runtime bounds.

use std::collections::BTreeMap;

use cudarl_cuda::task::TaskSpec;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{
    HEADER, MM_TOL, Module, Step, chain_doc, cuda_chain, dilated_extent, draw_steps, finish,
    group_of, kb_spec, params, pick, ref_chain, render_module,
};
use crate::families::{Family, Shapes};

/// A convolution kind.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// `nn.Conv1d`, no bias, no padding, `stride` and dilation `dil`.
    Conv1d { stride: i64, dil: i64 },
    /// `nn.Conv2d`, no bias, square `stride`, `pad` and dilation `dil`.
    Conv2d { stride: i64, pad: i64, dil: i64 },
    /// Depthwise `nn.Conv2d` over `channels` channels (fixed across the shapes).
    Depthwise { channels: i64 },
    /// The 1x1 `nn.Conv2d`.
    Pointwise,
    /// `nn.Conv2d` with its bias, then elementwise steps.
    Fused,
    /// `nn.Conv3d`, no bias, stride 1, no padding, a cubic kernel.
    Conv3d,
    /// `nn.ConvTranspose2d`, no bias, square `stride` and `pad`, no output padding.
    Transposed2d { stride: i64, pad: i64 },
}

/// A convolution's window. `Square(k)` (cubic in 3D): the module constant and launcher size
/// `kernel_size`, `k` in the train shapes. `Tuple(kd, kh, kw)` (`kd` 1 in 2D): the module's
/// `kernel_size = (kh, kw)` (`(kd, kh, kw)` in 3D), as KernelBench's asymmetric-kernel problems
/// state it; `kb-specs` derives no launcher size from a tuple constant, so the extents are
/// literals of the shapes and the kernels.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Window {
    Square(i64),
    Tuple(i64, i64, i64),
}

impl Window {
    /// The extents `(depth, height, width)` as values.
    fn dims(self) -> (i64, i64, i64) {
        match self {
            Window::Square(k) => (k, k, k),
            Window::Tuple(d, h, w) => (d, h, w),
        }
    }

    /// The extents `[depth, height, width]` as shape and C expressions: `kernel_size`, or the
    /// literals of a tuple.
    fn extents(self) -> [String; 3] {
        match self {
            Window::Square(_) => ["kernel_size"; 3].map(String::from),
            Window::Tuple(d, h, w) => [d, h, w].map(|v| v.to_string()),
        }
    }

    /// The module's `kernel_size` constant of a `dims`-dimensional window (`5`, `(3, 7)`).
    fn constant(self, dims: usize) -> String {
        match self {
            Window::Square(k) => k.to_string(),
            Window::Tuple(d, h, w) => {
                let v: Vec<String> = [d, h, w][3 - dims..].iter().map(i64::to_string).collect();
                format!("({})", v.join(", "))
            }
        }
    }
}

/// `(batch_size, in_channels, out_channels, height, width)` of one shape; a 1D shape's length
/// is its width, a depthwise shape's `out_channels` is unused.
type Dims = (i64, i64, i64, i64, i64);

/// Train shapes of the 1D regimes: balanced, wide channels, long and irregular.
const CONV1D_REGIMES: [[Dims; 3]; 3] = [
    [
        (16, 32, 64, 0, 4096),
        (8, 64, 128, 0, 2048),
        (32, 16, 32, 0, 8192),
    ],
    [
        (8, 128, 256, 0, 1024),
        (4, 256, 512, 0, 512),
        (64, 32, 64, 0, 1024),
    ],
    [
        (32, 6, 24, 0, 8192),
        (10, 12, 36, 0, 6000),
        (7, 40, 72, 0, 3333),
    ],
];

/// Train shapes of the 2D regimes (standard and fused convolutions): large images with few
/// channels, small images with many channels, irregular sizes.
const CONV2D_REGIMES: [[Dims; 3]; 3] = [
    [
        (8, 16, 48, 128, 128),
        (16, 32, 64, 64, 64),
        (4, 8, 32, 224, 224),
    ],
    [
        (20, 64, 128, 32, 48),
        (32, 32, 64, 56, 56),
        (8, 128, 256, 28, 28),
    ],
    [
        (12, 6, 40, 100, 150),
        (6, 20, 36, 90, 130),
        (2, 48, 80, 75, 125),
    ],
];

/// `(batch_size, in_channels, out_channels, depth, height, width)` of one 3D shape.
type Dims3 = (i64, i64, i64, i64, i64, i64);

/// Train shapes of the 3D regimes: a few channels over larger volumes, many channels over small
/// ones, irregular.
const CONV3D_REGIMES: [[Dims3; 3]; 3] = [
    [
        (8, 16, 32, 12, 48, 48),
        (4, 32, 64, 16, 32, 32),
        (16, 8, 24, 10, 40, 40),
    ],
    [
        (10, 64, 128, 8, 16, 16),
        (2, 128, 64, 12, 12, 12),
        (20, 32, 96, 6, 20, 20),
    ],
    [
        (6, 12, 20, 14, 30, 26),
        (3, 7, 18, 11, 37, 29),
        (9, 10, 14, 13, 23, 31),
    ],
];

/// Train shapes of the transposed regimes (the output grows by the stride): small images with
/// many channels, smaller ones with more, irregular.
const TRANSPOSED_REGIMES: [[Dims; 3]; 3] = [
    [
        (8, 24, 16, 32, 32),
        (16, 16, 8, 24, 24),
        (4, 64, 32, 16, 16),
    ],
    [
        (16, 128, 64, 12, 12),
        (4, 256, 128, 8, 8),
        (32, 64, 32, 14, 14),
    ],
    [
        (6, 20, 12, 27, 35),
        (10, 9, 14, 19, 23),
        (3, 40, 24, 13, 45),
    ],
];

/// Train shapes `(batch_size, height, width)` of the depthwise regimes.
const DEPTHWISE_REGIMES: [[(i64, i64, i64); 3]; 3] = [
    [(12, 128, 128), (4, 256, 256), (20, 64, 96)],
    [(6, 112, 112), (10, 160, 96), (2, 224, 224)],
    [(7, 150, 100), (9, 99, 141), (3, 127, 129)],
];

/// Train shapes of the pointwise regimes.
const POINTWISE_REGIMES: [[Dims; 3]; 3] = [
    [
        (16, 64, 128, 56, 72),
        (8, 3, 64, 128, 128),
        (32, 256, 64, 32, 32),
    ],
    [
        (4, 512, 256, 28, 36),
        (64, 128, 32, 24, 24),
        (2, 32, 256, 64, 64),
    ],
    [
        (6, 40, 72, 100, 75),
        (10, 13, 129, 61, 67),
        (3, 200, 100, 50, 50),
    ],
];

impl Kind {
    /// The module constants, in the module's order.
    fn names(self) -> Vec<&'static str> {
        match self {
            Kind::Conv1d { .. } => vec![
                "batch_size",
                "in_channels",
                "out_channels",
                "kernel_size",
                "length",
            ],
            Kind::Conv2d { .. } | Kind::Fused | Kind::Transposed2d { .. } => vec![
                "batch_size",
                "in_channels",
                "out_channels",
                "kernel_size",
                "height",
                "width",
            ],
            Kind::Conv3d => vec![
                "batch_size",
                "in_channels",
                "out_channels",
                "kernel_size",
                "depth",
                "height",
                "width",
            ],
            Kind::Depthwise { .. } => {
                vec![
                    "batch_size",
                    "in_channels",
                    "kernel_size",
                    "height",
                    "width",
                ]
            }
            Kind::Pointwise => vec![
                "batch_size",
                "in_channels",
                "out_channels",
                "height",
                "width",
            ],
        }
    }

    /// The sizes of `d` with window `win` (a square one's `kernel_size`), named as the module
    /// names them.
    fn sizes(self, win: Window, (n, cin, cout, h, w): Dims) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::from([
            ("batch_size".to_string(), n),
            ("in_channels".to_string(), cin),
        ]);
        if !matches!(self, Kind::Depthwise { .. }) {
            m.insert("out_channels".into(), cout);
        }
        if let (false, Window::Square(k)) = (self == Kind::Pointwise, win) {
            m.insert("kernel_size".into(), k);
        }
        if matches!(self, Kind::Conv1d { .. }) {
            m.insert("length".into(), w);
        } else {
            m.insert("height".into(), h);
            m.insert("width".into(), w);
        }
        m
    }

    /// Train and hold-out shapes of regime `regime` with window `win`. The hold-out shapes
    /// are a degenerate one (one image, one channel where the kind allows it, the input as
    /// large as the window) and two with odd sizes; the second stays valid with every size
    /// capped at 33.
    fn shapes(self, win: Window, regime: usize) -> (Shapes, Shapes) {
        let r = regime % 3;
        let (kd, kh, kw) = win.dims();
        // The smallest input holds one dilated window.
        let d = self.dilation();
        let (kh, kw) = (dilated_extent(kh, d), dilated_extent(kw, d));
        if self == Kind::Conv3d {
            let maps = |v: &[Dims3]| -> Shapes {
                v.iter()
                    .map(|&(n, cin, cout, d, h, w)| {
                        let mut m = self.sizes(win, (n, cin, cout, h, w));
                        m.insert("depth".to_string(), d);
                        m
                    })
                    .collect()
            };
            let holdout = [
                (1, 1, 1, kd, kh, kw),
                (2, 3, 17, 9, 13, 11),
                (1, 5, 9, 21, 19, 23),
            ];
            return (maps(&CONV3D_REGIMES[r]), maps(&holdout));
        }
        let (train, holdout): (Vec<Dims>, Vec<Dims>) = match self {
            Kind::Conv1d { .. } => (
                CONV1D_REGIMES[r].to_vec(),
                vec![(1, 1, 1, 0, kw), (3, 7, 33, 0, 1001), (5, 17, 65, 0, 3001)],
            ),
            Kind::Conv2d { .. } | Kind::Fused => (
                CONV2D_REGIMES[r].to_vec(),
                vec![(1, 1, 1, kh, kw), (3, 5, 33, 47, 45), (2, 7, 65, 67, 129)],
            ),
            Kind::Depthwise { channels: c } => (
                DEPTHWISE_REGIMES[r]
                    .iter()
                    .map(|&(n, h, w)| (n, c, c, h, w))
                    .collect(),
                vec![(1, c, c, kh, kw), (3, c, c, 45, 47), (2, c, c, 131, 129)],
            ),
            Kind::Pointwise => (
                POINTWISE_REGIMES[r].to_vec(),
                vec![(1, 1, 1, 1, 1), (3, 17, 33, 9, 45), (2, 129, 65, 31, 63)],
            ),
            Kind::Transposed2d { .. } => (
                TRANSPOSED_REGIMES[r].to_vec(),
                vec![(1, 1, 1, 1, 1), (3, 5, 33, 9, 11), (2, 7, 13, 17, 31)],
            ),
            Kind::Conv3d => unreachable!("3D shapes are drawn above"),
        };
        let maps = |v: Vec<Dims>| v.into_iter().map(|d| self.sizes(win, d)).collect();
        (maps(train), maps(holdout))
    }

    /// `(stride, padding)`, the same along both spatial dimensions.
    fn stride_pad(self) -> (i64, i64) {
        match self {
            Kind::Conv2d { stride, pad, .. } | Kind::Transposed2d { stride, pad } => (stride, pad),
            Kind::Conv1d { stride, .. } => (stride, 0),
            _ => (1, 0),
        }
    }

    /// The dilation, the same along both spatial dimensions: the window's taps are this far
    /// apart (1: adjacent).
    fn dilation(self) -> i64 {
        match self {
            Kind::Conv1d { dil, .. } | Kind::Conv2d { dil, .. } => dil,
            _ => 1,
        }
    }
}

/// The output size along a dimension of input size `dim` for a window of extent `k` (a size
/// name or a literal), stride `s`, padding `p` and dilation `d`, as a shape formula: `(dim + 2 p
/// - d (k - 1) - 1) / s + 1` (PyTorch docs, `torch.nn.Conv2d`), the dilated extent `d k - d + 1`
/// a literal or `(2*kernel_size-1)`.
fn out_dim(dim: &str, k: &str, s: i64, p: i64, d: i64) -> String {
    let dilated;
    let k = match (d, k.parse::<i64>()) {
        (1, _) => k,
        (_, Ok(v)) => {
            dilated = dilated_extent(v, d).to_string();
            dilated.as_str()
        }
        (_, Err(_)) => {
            dilated = format!("({d}*{k}-{})", d - 1);
            dilated.as_str()
        }
    };
    match (s, p) {
        (1, 0) => format!("{dim}-{k}+1"),
        (1, p) => format!("{dim}+{}-{k}+1", 2 * p),
        (s, 0) => format!("({dim}-{k})/{s}+1"),
        (s, p) => format!("({dim}+{}-{k})/{s}+1", 2 * p),
    }
}

/// The output size along a dimension of input size `dim` of a transposed convolution with a
/// window of extent `k`, stride `s` and padding `p` (no output padding), as a shape formula:
/// `(dim - 1) s - 2 p + k`.
fn out_dim_transposed(dim: &str, k: &str, s: i64, p: i64) -> String {
    match (s, p) {
        (1, 0) => format!("{dim}+{k}-1"),
        (1, p) => format!("{dim}-{}+{k}-1", 2 * p),
        (s, 0) => format!("({dim}-1)*{s}+{k}"),
        (s, p) => format!("({dim}-1)*{s}-{}+{k}", 2 * p),
    }
}

/// The kernels' C prelude: stride, padding and dilation macros, then the sizes as `N, C, CO,
/// H, W, KH, KW, G` (a 1D convolution is a 2D one of height 1; a tuple window's extents are
/// literals) and the output size `HO x WO`.
fn prelude(kind: Kind, win: Window) -> (String, String) {
    let (s, p) = kind.stride_pad();
    let d = kind.dilation();
    let one_d = matches!(kind, Kind::Conv1d { .. });
    let (sh, ph, dh) = if one_d { (1, 0, 1) } else { (s, p, d) };
    let macros = format!(
        "#define STRIDE_H {sh}\n#define STRIDE_W {s}\n#define PAD_H {ph}\n#define PAD_W {p}\n\
         #define DIL_H {dh}\n#define DIL_W {d}\n"
    );
    let [_, kh, kw] = win.extents();
    let (co, hw, g) = match kind {
        Kind::Conv1d { .. } => ("out_channels", "1, W = length", "1"),
        Kind::Conv2d { .. } | Kind::Fused => ("out_channels", "height, W = width", "1"),
        Kind::Depthwise { .. } => ("in_channels", "height, W = width", "in_channels"),
        Kind::Pointwise => ("out_channels", "height, W = width", "1"),
        Kind::Conv3d | Kind::Transposed2d { .. } => {
            unreachable!("3D and transposed kernels have preludes of their own")
        }
    };
    let kk = match kind {
        Kind::Conv1d { .. } => format!("1, KW = {kw}"),
        Kind::Pointwise => "1, KW = 1".to_string(),
        _ => format!("{kh}, KW = {kw}"),
    };
    let alias = format!(
        "    const int64_t N = batch_size, C = in_channels, CO = {co}, G = {g};\n    \
         const int64_t H = {hw}, KH = {kk};\n    \
         const int64_t EH = DIL_H * (KH - 1) + 1, EW = DIL_W * (KW - 1) + 1;\n    \
         const int64_t HO = H + 2 * PAD_H >= EH ? (H + 2 * PAD_H - EH) / STRIDE_H + 1 : 0;\n    \
         const int64_t WO = W + 2 * PAD_W >= EW ? (W + 2 * PAD_W - EW) / STRIDE_W + 1 : 0;\n    \
         (void)N; (void)C; (void)CO; (void)G; (void)H; (void)W; (void)KH; (void)KW; (void)HO; (void)WO;\n"
    );
    (macros, alias)
}

/// What every kernel of a convolution family is written against: the family's kind and
/// window, the kernel's parameter list `decl` and argument names `names` ([`params`]), the
/// launcher's declaration `sig`, and `w`, the name of the weight argument.
#[derive(Debug, Clone, Copy)]
struct KernelParts<'a> {
    kind: Kind,
    win: Window,
    decl: &'a str,
    names: &'a str,
    sig: &'a str,
    w: &'a str,
}

/// The naive kernel: one thread per output element, a direct loop over the input channels of
/// its group and the window; `epilogue` updates `float v` of output channel `co`.
fn naive_kernel(parts: KernelParts<'_>, epilogue: &str, block: u32) -> String {
    let (kind, decl, names, sig, w) = (parts.kind, parts.decl, parts.names, parts.sig, parts.w);
    let (macros, alias) = prelude(kind, parts.win);
    format!(
        "// naive: one thread per output element; a direct loop over the input channels of its\n\
         // group and the kernel window (taps outside the input are the zero padding).\n\
         {HEADER}\n{macros}\n\
         __global__ void conv_naive({decl}) {{\n{alias}    \
         const float* WT = {w};\n    \
         const int64_t CPG = C / G, OPG = CO / G;\n    \
         const int64_t total = N * CO * HO * WO;\n    \
         const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         if (i >= total) return;\n    \
         const int64_t ow = i % WO;\n    \
         const int64_t oh = (i / WO) % HO;\n    \
         const int64_t co = (i / (WO * HO)) % CO;\n    \
         const int64_t n = i / (WO * HO * CO);\n    \
         const int64_t g = co / OPG;\n    \
         float acc = 0.0f;\n    \
         for (int64_t ci = 0; ci < CPG; ++ci) {{\n        \
         const float* xp = in0 + (n * C + g * CPG + ci) * H * W;\n        \
         const float* wp = WT + (co * CPG + ci) * KH * KW;\n        \
         for (int64_t kh = 0; kh < KH; ++kh) {{\n            \
         const int64_t ih = oh * STRIDE_H - PAD_H + kh * DIL_H;\n            \
         if (ih < 0 || ih >= H) continue;\n            \
         for (int64_t kw = 0; kw < KW; ++kw) {{\n                \
         const int64_t iw = ow * STRIDE_W - PAD_W + kw * DIL_W;\n                \
         if (iw < 0 || iw >= W) continue;\n                \
         acc += xp[ih * W + iw] * wp[kh * KW + kw];\n            }}\n        }}\n    }}\n    \
         float v = acc;\n{epilogue}    out[i] = v;\n}}\n\n\
         {sig} {{\n{alias}    \
         const int64_t total = N * CO * HO * WO;\n    \
         const int block = {block};\n    \
         const int64_t grid = (total + block - 1) / block;\n    \
         if (grid > 0) conv_naive<<<(unsigned)grid, block, 0, stream>>>({names});\n}}\n"
    )
}

/// The tiled kernel of a dense (one group) convolution: a block of `tw x th` threads computes
/// a `th x tw` tile of output pixels for `cob` output channels of one image; `cib` input
/// channels at a time, the input tile with its halo and the taps of the `cob` filters are
/// staged in shared memory (taps innermost by output channel, read as broadcasts), and each
/// thread accumulates its pixel's `cob` outputs in registers. blockIdx.x walks the tiles,
/// blockIdx.y the (image, channel block) pairs (striding past 65535).
fn tile_kernel(parts: KernelParts<'_>, epilogue: &str, cob: u32) -> String {
    let (kind, decl, names, sig, w) = (parts.kind, parts.decl, parts.names, parts.sig, parts.w);
    let (macros, alias) = prelude(kind, parts.win);
    let one_d = matches!(kind, Kind::Conv1d { .. });
    let (tw, th, cib, what) = if one_d {
        (128, 1, 8, "128 output positions")
    } else {
        (32, 8, 4, "8 x 32 output pixels")
    };
    // The template arguments (KHC, KWC): a tuple window's extents, else one instance for
    // kernel sizes 3, 5 and any other.
    let kh = |k: u32| if one_d { 1 } else { k };
    let (dispatch, unrolled) = match parts.win {
        Window::Tuple(_, h, w) => (
            format!("    run_tile<{h}, {w}>(grid, bytes, stream, {names});\n"),
            format!("The {h} x {w} window is compiled with unrolled loops."),
        ),
        Window::Square(_) => (
            format!(
                "    if (kernel_size == 3) run_tile<{}, 3>(grid, bytes, stream, {names});\n    \
                 else if (kernel_size == 5) run_tile<{}, 5>(grid, bytes, stream, {names});\n    \
                 else run_tile<{}, 0>(grid, bytes, stream, {names});\n",
                kh(3),
                kh(5),
                kh(0)
            ),
            "Kernel sizes 3 and 5 are compiled with unrolled window loops.".to_string(),
        ),
    };
    format!(
        "// fast: each block computes a tile of {what} for {cob} output channels of one image.\n\
         // {cib} input channels at a time, the input tile with its halo and the filters' taps\n\
         // are staged in shared memory (the taps ordered by output channel innermost, read as\n\
         // broadcasts); each thread accumulates its position's {cob} outputs in registers.\n\
         // {unrolled}\n\
         {HEADER}\n{macros}#define TW {tw}\n#define TH {th}\n#define COB {cob}\n#define CIB {cib}\n\n\
         template <int KHC, int KWC>\n\
         __global__ void __launch_bounds__(TW * TH) conv_tile({decl}) {{\n{alias}    \
         const float* WT = {w};\n    \
         const int kh_n = KHC > 0 ? KHC : (int)KH;\n    \
         const int kw_n = KWC > 0 ? KWC : (int)KW;\n    \
         const int taps = kh_n * kw_n;\n    \
         const int ih_t = (TH - 1) * STRIDE_H + DIL_H * (kh_n - 1) + 1;\n    \
         const int iw_t = (TW - 1) * STRIDE_W + DIL_W * (kw_n - 1) + 1;\n    \
         extern __shared__ float smem[];\n    \
         float* s_in = smem;\n    \
         float* s_w = smem + CIB * ih_t * iw_t;\n    \
         const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TW + tx;\n    \
         const int64_t tiles_w = (WO + TW - 1) / TW;\n    \
         const int64_t oh0 = ((int64_t)blockIdx.x / tiles_w) * TH;\n    \
         const int64_t ow0 = ((int64_t)blockIdx.x % tiles_w) * TW;\n    \
         const int64_t ih0 = oh0 * STRIDE_H - PAD_H, iw0 = ow0 * STRIDE_W - PAD_W;\n    \
         const int64_t cob_n = (CO + COB - 1) / COB;\n    \
         for (int64_t job = blockIdx.y; job < N * cob_n; job += gridDim.y) {{\n        \
         const int64_t n = job / cob_n, co0 = (job % cob_n) * COB;\n        \
         float acc[COB];\n\
         #pragma unroll\n        \
         for (int j = 0; j < COB; ++j) acc[j] = 0.0f;\n        \
         for (int64_t c0 = 0; c0 < C; c0 += CIB) {{\n            \
         for (int e = tid; e < CIB * ih_t * iw_t; e += TW * TH) {{\n                \
         const int c = e / (ih_t * iw_t), r = (e / iw_t) % ih_t, q = e % iw_t;\n                \
         const int64_t ci = c0 + c, ih = ih0 + r, iw = iw0 + q;\n                \
         s_in[e] = (ci < C && ih >= 0 && ih < H && iw >= 0 && iw < W)\n                    \
         ? in0[((n * C + ci) * H + ih) * W + iw] : 0.0f;\n            }}\n            \
         for (int e = tid; e < CIB * taps * COB; e += TW * TH) {{\n                \
         const int j = e % COB, t = (e / COB) % taps, c = e / (COB * taps);\n                \
         const int64_t co = co0 + j, ci = c0 + c;\n                \
         s_w[e] = (co < CO && ci < C) ? WT[(co * C + ci) * taps + t] : 0.0f;\n            }}\n            \
         __syncthreads();\n            \
         for (int c = 0; c < CIB; ++c) {{\n                \
         const float* si = s_in + (c * ih_t + ty * STRIDE_H) * iw_t + tx * STRIDE_W;\n                \
         const float* sw = s_w + c * taps * COB;\n\
         #pragma unroll\n                \
         for (int kh = 0; kh < kh_n; ++kh) {{\n\
         #pragma unroll\n                    \
         for (int kw = 0; kw < kw_n; ++kw) {{\n                        \
         const float xv = si[kh * DIL_H * iw_t + kw * DIL_W];\n                        \
         const float* wk = sw + (kh * kw_n + kw) * COB;\n\
         #pragma unroll\n                        \
         for (int j = 0; j < COB; ++j) acc[j] += xv * wk[j];\n                    }}\n                }}\n            }}\n            \
         __syncthreads();\n        }}\n        \
         const int64_t oh = oh0 + ty, ow = ow0 + tx;\n        \
         if (oh < HO && ow < WO) {{\n\
         #pragma unroll\n            \
         for (int j = 0; j < COB; ++j) {{\n                \
         const int64_t co = co0 + j;\n                \
         if (co < CO) {{\n                    \
         float v = acc[j];\n{epilogue}                    \
         out[((n * CO + co) * HO + oh) * WO + ow] = v;\n                }}\n            }}\n        }}\n    }}\n}}\n\n\
         template <int KHC, int KWC>\n\
         static void run_tile(dim3 grid, size_t bytes, cudaStream_t stream, {decl}) {{\n    \
         if (bytes > 48 * 1024)\n        \
         cudaFuncSetAttribute(conv_tile<KHC, KWC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);\n    \
         conv_tile<KHC, KWC><<<grid, dim3(TW, TH), bytes, stream>>>({names});\n}}\n\n\
         {sig} {{\n{alias}    \
         if (N * CO * HO * WO == 0) return;\n    \
         const int64_t tiles = ((HO + TH - 1) / TH) * ((WO + TW - 1) / TW);\n    \
         int64_t jobs = N * ((CO + COB - 1) / COB);\n    \
         if (jobs > 65535) jobs = 65535;\n    \
         const int64_t ih_t = (TH - 1) * STRIDE_H + EH, iw_t = (TW - 1) * STRIDE_W + EW;\n    \
         const size_t bytes = (size_t)(CIB * ih_t * iw_t + CIB * KH * KW * COB) * sizeof(float);\n    \
         const dim3 grid((unsigned)tiles, (unsigned)jobs);\n\
         {dispatch}}}\n",
    )
}

/// The depthwise kernel: a block of 32 x 8 threads computes a 32 x 32 output tile of one
/// `(image, channel)` plane, 4 rows per thread, from the input tile with its halo and the
/// channel's filter in shared memory. blockIdx.x walks the tiles, blockIdx.y the planes
/// (striding past 65535).
fn depthwise_kernel(parts: KernelParts<'_>) -> String {
    let (kind, decl, names, sig, w) = (parts.kind, parts.decl, parts.names, parts.sig, parts.w);
    let (macros, alias) = prelude(kind, parts.win);
    format!(
        "// fast: one block per 32 x 32 output tile of one (image, channel) plane, 32 x 8 threads\n\
         // computing 4 rows each; the input tile with its halo and the channel's filter are\n\
         // staged in shared memory. Kernel sizes 3 and 5 are compiled with unrolled window loops.\n\
         {HEADER}\n{macros}#define TW 32\n#define TH 8\n#define RPT 4\n\n\
         template <int KC>\n\
         __global__ void __launch_bounds__(TW * TH) dw_tile({decl}) {{\n{alias}    \
         const float* WT = {w};\n    \
         const int k_n = KC > 0 ? KC : (int)KH;\n    \
         const int oth = TH * RPT;\n    \
         const int ih_t = (oth - 1) * STRIDE_H + k_n;\n    \
         const int iw_t = (TW - 1) * STRIDE_W + k_n;\n    \
         extern __shared__ float smem[];\n    \
         float* s_in = smem;\n    \
         float* s_w = smem + ih_t * iw_t;\n    \
         const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TW + tx;\n    \
         const int64_t tiles_w = (WO + TW - 1) / TW;\n    \
         const int64_t oh0 = ((int64_t)blockIdx.x / tiles_w) * oth;\n    \
         const int64_t ow0 = ((int64_t)blockIdx.x % tiles_w) * TW;\n    \
         const int64_t ih0 = oh0 * STRIDE_H - PAD_H, iw0 = ow0 * STRIDE_W - PAD_W;\n    \
         for (int64_t plane = blockIdx.y; plane < N * C; plane += gridDim.y) {{\n        \
         const int64_t c = plane % C;\n        \
         const float* xp = in0 + plane * H * W;\n        \
         for (int e = tid; e < k_n * k_n; e += TW * TH) s_w[e] = WT[c * k_n * k_n + e];\n        \
         for (int e = tid; e < ih_t * iw_t; e += TW * TH) {{\n            \
         const int64_t ih = ih0 + e / iw_t, iw = iw0 + e % iw_t;\n            \
         s_in[e] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xp[ih * W + iw] : 0.0f;\n        }}\n        \
         __syncthreads();\n        \
         const int64_t ow = ow0 + tx;\n\
         #pragma unroll\n        \
         for (int r = 0; r < RPT; ++r) {{\n            \
         const int oy = ty + r * TH;\n            \
         const float* si = s_in + oy * STRIDE_H * iw_t + tx * STRIDE_W;\n            \
         float acc = 0.0f;\n\
         #pragma unroll\n            \
         for (int kh = 0; kh < k_n; ++kh) {{\n\
         #pragma unroll\n                \
         for (int kw = 0; kw < k_n; ++kw) acc += si[kh * iw_t + kw] * s_w[kh * k_n + kw];\n            }}\n            \
         const int64_t oh = oh0 + oy;\n            \
         if (oh < HO && ow < WO) out[(plane * HO + oh) * WO + ow] = acc;\n        }}\n        \
         __syncthreads();\n    }}\n}}\n\n\
         template <int KC>\n\
         static void run_dw(dim3 grid, size_t bytes, cudaStream_t stream, {decl}) {{\n    \
         if (bytes > 48 * 1024)\n        \
         cudaFuncSetAttribute(dw_tile<KC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);\n    \
         dw_tile<KC><<<grid, dim3(TW, TH), bytes, stream>>>({names});\n}}\n\n\
         {sig} {{\n{alias}    \
         if (N * C * HO * WO == 0) return;\n    \
         const int64_t tiles = ((HO + TH * RPT - 1) / (TH * RPT)) * ((WO + TW - 1) / TW);\n    \
         int64_t planes = N * C;\n    \
         if (planes > 65535) planes = 65535;\n    \
         const int64_t ih_t = (TH * RPT - 1) * STRIDE_H + KH, iw_t = (TW - 1) * STRIDE_W + KW;\n    \
         const size_t bytes = (size_t)(ih_t * iw_t + KH * KW) * sizeof(float);\n    \
         const dim3 grid((unsigned)tiles, (unsigned)planes);\n    \
         if (kernel_size == 3) run_dw<3>(grid, bytes, stream, {names});\n    \
         else if (kernel_size == 5) run_dw<5>(grid, bytes, stream, {names});\n    \
         else run_dw<0>(grid, bytes, stream, {names});\n}}\n"
    )
}

/// The pointwise kernel: per image, `out_n (Cout x P) = W (Cout x Cin) x_n (Cin x P)` with
/// `P = height * width`, as a matmul of 32 x 32 output tiles, 32 x 8 threads computing 4
/// outputs each, the tiles of `W` and `x_n` in padded shared memory. blockIdx.z walks the
/// images (striding past 65535).
fn pointwise_kernel(parts: KernelParts<'_>) -> String {
    let (kind, decl, names, sig, w) = (parts.kind, parts.decl, parts.names, parts.sig, parts.w);
    let (macros, alias) = prelude(kind, parts.win);
    format!(
        "// fast: a 1x1 convolution is a matmul per image, out_n (Cout x HW) = W (Cout x Cin)\n\
         // x_n (Cin x HW): 32 x 32 output tiles, 32 x 8 threads computing 4 outputs each, the\n\
         // tiles of W and x_n staged in padded shared memory (both read along their rows).\n\
         {HEADER}\n{macros}#define TS 32\n\n\
         __global__ void __launch_bounds__(256) pw_gemm({decl}) {{\n{alias}    \
         const float* WT = {w};\n    \
         const int64_t P = H * W;\n    \
         __shared__ float Ws[TS][TS + 1];\n    \
         __shared__ float Xs[TS][TS + 1];\n    \
         const int tx = threadIdx.x, ty = threadIdx.y;\n    \
         const int64_t p0 = (int64_t)blockIdx.x * TS, co0 = (int64_t)blockIdx.y * TS;\n    \
         for (int64_t n = blockIdx.z; n < N; n += gridDim.z) {{\n        \
         const float* xn = in0 + n * C * P;\n        \
         float acc[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};\n        \
         for (int64_t k0 = 0; k0 < C; k0 += TS) {{\n\
         #pragma unroll\n            \
         for (int i = 0; i < 4; ++i) {{\n                \
         const int r = ty + 8 * i;\n                \
         const int64_t co = co0 + r, ci = k0 + r, kx = k0 + tx, p = p0 + tx;\n                \
         Ws[r][tx] = (co < CO && kx < C) ? WT[co * C + kx] : 0.0f;\n                \
         Xs[r][tx] = (ci < C && p < P) ? xn[ci * P + p] : 0.0f;\n            }}\n            \
         __syncthreads();\n\
         #pragma unroll 8\n            \
         for (int kk = 0; kk < TS; ++kk) {{\n                \
         const float xv = Xs[kk][tx];\n\
         #pragma unroll\n                \
         for (int i = 0; i < 4; ++i) acc[i] += Ws[ty + 8 * i][kk] * xv;\n            }}\n            \
         __syncthreads();\n        }}\n\
         #pragma unroll\n        \
         for (int i = 0; i < 4; ++i) {{\n            \
         const int64_t co = co0 + ty + 8 * i, p = p0 + tx;\n            \
         if (co < CO && p < P) out[(n * CO + co) * P + p] = acc[i];\n        }}\n    }}\n}}\n\n\
         {sig} {{\n{alias}    \
         const int64_t P = H * W;\n    \
         if (N * CO * P == 0) return;\n    \
         int64_t gz = N;\n    \
         if (gz > 65535) gz = 65535;\n    \
         dim3 grid((unsigned)((P + TS - 1) / TS), (unsigned)((CO + TS - 1) / TS), (unsigned)gz);\n    \
         pw_gemm<<<grid, dim3(32, 8), 0, stream>>>({names});\n}}\n"
    )
}

/// A convolution family of `kind` with window `win` (ignored by the pointwise kind; a tuple
/// only for the standard 2D, 3D and transposed kinds), the
/// train shapes of `regime`, and for the fused kind the elementwise `steps` after the
/// convolution's bias (a `Step::AddBias` among them adds a parameter of shape
/// `(out_channels, 1, 1)`). `block` is the naive kernel's block size, `cob` the output channels
/// per thread of the tiled kernel.
fn conv_family(
    id: &str,
    (kind, win): (Kind, Window),
    regime: usize,
    steps: &[Step],
    (block, cob): (u32, u32),
) -> Family {
    let (train, holdout) = kind.shapes(win, regime);
    let fused = kind == Kind::Fused;
    let extra_bias = fused && steps.contains(&Step::AddBias);
    let l = kind.layout(win);
    let wname = format!("{}_weight", l.layer);
    let bname = format!("{}_bias", l.layer);
    // Buffers in the launcher's order: the input, the module's own parameter, the layer's.
    let x_shape: Vec<&str> = ["batch_size", "in_channels"]
        .into_iter()
        .chain(l.spatial.iter().copied())
        .collect();
    // `nn.ConvTranspose2d`'s weight is (in_channels, out_channels, kh, kw).
    let w_lead = if matches!(kind, Kind::Transposed2d { .. }) {
        ["in_channels", "out_channels"]
    } else {
        [l.cout, l.cpg]
    };
    let w_shape: Vec<&str> = w_lead
        .into_iter()
        .chain(l.kk.iter().map(String::as_str))
        .collect();
    let mut inputs: Vec<(&str, Vec<&str>)> = vec![("in0", x_shape)];
    if extra_bias {
        inputs.push(("bias", vec!["out_channels", "1", "1"]));
    }
    inputs.push((wname.as_str(), w_shape));
    if fused {
        inputs.push((bname.as_str(), vec!["out_channels"]));
    }
    let out_shape: Vec<&str> = ["batch_size", l.cout]
        .into_iter()
        .chain(l.out_spatial.iter().map(String::as_str))
        .collect();
    let reference = ref_chain(steps, &conv_reference(kind, (&wname, &bname)), "");
    let ins: Vec<(&str, &[&str])> = inputs.iter().map(|(a, s)| (*a, s.as_slice())).collect();
    // A tuple window's `kernel_size` is a module constant but no launcher size.
    let names = kind.names();
    let sizes: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n != "kernel_size" || matches!(win, Window::Square(_)))
        .collect();
    let spec = kb_spec(
        id,
        if fused { 3 } else { 2 },
        &ins,
        &out_shape,
        &sizes,
        reference,
        train,
        holdout,
        MM_TOL,
        conv_cost(kind, &l, steps),
    );
    let module = conv_module((kind, win), &l, steps, &spec, &inputs[0].1);
    let (file, naive, fast) =
        conv_kernels((kind, win), &spec, (&wname, &bname), steps, (block, cob));
    finish(
        spec,
        module,
        conv_group(kind, win, steps),
        naive,
        (file, fast),
    )
}

/// How a convolution kind names the dimensions of its buffers.
struct Layout {
    /// The output channels (`in_channels` for a depthwise one).
    cout: &'static str,
    /// The input channels each filter reads (`1` for a depthwise one).
    cpg: &'static str,
    /// The window's dimensions (size names or literals).
    kk: Vec<String>,
    /// The input's spatial dimensions, and the output's as shape formulas.
    spatial: &'static [&'static str],
    out_spatial: Vec<String>,
    /// The layer's attribute name (`conv1d`, `conv2d`, `conv`, `conv3d`, `conv_transpose2d`).
    layer: &'static str,
}

impl Kind {
    /// The names of the dimensions of the kind's buffers with window `win`.
    fn layout(self, win: Window) -> Layout {
        let (s, p) = self.stride_pad();
        let (cout, cpg) = match self {
            Kind::Depthwise { .. } => ("in_channels", "1"),
            _ => ("out_channels", "in_channels"),
        };
        let [kd, kh, kw] = win.extents();
        let kk: Vec<String> = match self {
            Kind::Conv1d { .. } => vec![kw],
            Kind::Pointwise => vec!["1".into(), "1".into()],
            Kind::Conv3d => vec![kd, kh, kw],
            _ => vec![kh, kw],
        };
        let spatial: &[&str] = match self {
            Kind::Conv1d { .. } => &["length"],
            Kind::Conv3d => &["depth", "height", "width"],
            _ => &["height", "width"],
        };
        let windowed = spatial.iter().zip(&kk);
        let out_spatial: Vec<String> = match self {
            Kind::Pointwise => vec!["height".into(), "width".into()],
            Kind::Transposed2d { .. } => windowed
                .map(|(d, k)| out_dim_transposed(d, k, s, p))
                .collect(),
            _ => windowed
                .map(|(d, k)| out_dim(d, k, s, p, self.dilation()))
                .collect(),
        };
        Layout {
            cout,
            cpg,
            kk,
            spatial,
            out_spatial,
            layer: self.layer(),
        }
    }

    /// The layer's attribute name in the module.
    fn layer(self) -> &'static str {
        match self {
            Kind::Conv1d { .. } => "conv1d",
            Kind::Fused => "conv",
            Kind::Conv3d => "conv3d",
            Kind::Transposed2d { .. } => "conv_transpose2d",
            _ => "conv2d",
        }
    }
}

/// The convolution's reference (the fused kind's with its bias), weight `wname`, bias `bname`.
fn conv_reference(kind: Kind, (wname, bname): (&str, &str)) -> String {
    let (s, p) = kind.stride_pad();
    let groups = match kind {
        Kind::Depthwise { channels } => channels,
        _ => 1,
    };
    // The layer's attribute is the function's name but for the fused kind's `conv`.
    let f = match kind {
        Kind::Fused => "conv2d",
        _ => kind.layer(),
    };
    let dil = match kind.dilation() {
        1 => String::new(),
        d => format!(", {d}"),
    };
    if kind == Kind::Fused {
        format!("{f}(in0, {wname}, {bname}, {s}, {p}, {groups})")
    } else {
        format!("{f}(in0, {wname}, {s}, {p}, {groups}{dil})")
    }
}

/// (bytes, flops): every buffer read or written once; two flops per multiply-add, one per step.
/// A transposed convolution's multiply-adds are counted from its input, each element times
/// `out_channels` times the kernel's elements (exact without padding; with padding it counts
/// the taps that fall outside the output too).
fn conv_cost(kind: Kind, l: &Layout, steps: &[Step]) -> (String, String) {
    let fused = kind == Kind::Fused;
    let cout = l.cout;
    let par = |d: &str| {
        if d.contains(['+', '-', '/']) {
            format!("({d})")
        } else {
            d.to_string()
        }
    };
    let x_elems = format!("batch_size*in_channels*{}", l.spatial.join("*"));
    let o_elems = format!(
        "batch_size*{cout}*{}",
        l.out_spatial
            .iter()
            .map(|d| par(d))
            .collect::<Vec<_>>()
            .join("*")
    );
    // The filter's elements per output channel (`in_channels*kernel_size*kernel_size`).
    let per_filter: Vec<&str> = std::iter::once(l.cpg)
        .chain(l.kk.iter().map(String::as_str))
        .filter(|d| *d != "1")
        .collect();
    let per_filter = if per_filter.is_empty() {
        "1".to_string()
    } else {
        per_filter.join("*")
    };
    let mut bytes = format!("4*{x_elems} + 4*{cout}*{per_filter} + 4*{o_elems}");
    if fused {
        bytes.push_str(" + 4*out_channels");
    }
    if fused && steps.contains(&Step::AddBias) {
        bytes.push_str(" + 4*out_channels");
    }
    let mut flops = if let Kind::Transposed2d { pad, .. } = kind {
        let along = |d: &str, k: &str| match pad {
            0 => format!("{d}*{k}"),
            p => format!("({d}*{k}-{})", 2 * p),
        };
        format!(
            "2*batch_size*in_channels*out_channels*{}*{}",
            along("height", &l.kk[0]),
            along("width", &l.kk[1])
        )
    } else {
        format!("2*{o_elems}*{per_filter}")
    };
    let epi_ops = steps.len() + usize::from(fused);
    if epi_ops > 0 {
        flops.push_str(&format!(" + {epi_ops}*{o_elems}"));
    }
    (bytes, flops)
}

/// A layer call's stride, padding and dilation arguments (`, stride=2, padding=1,
/// dilation=2`; none at 1, 0 and 1) and their words for the docstring (`stride 2, padding 1,
/// dilation 2`).
fn stride_pad_words(stride: i64, pad: i64, dil: i64) -> (String, String) {
    let mut opts = String::new();
    let mut how = vec![];
    if stride != 1 {
        opts.push_str(&format!(", stride={stride}"));
        how.push(format!("stride {stride}"));
    }
    if pad != 0 {
        opts.push_str(&format!(", padding={pad}"));
        how.push(format!("padding {pad}"));
    }
    if dil != 1 {
        opts.push_str(&format!(", dilation={dil}"));
        how.push(format!("dilation {dil}"));
    }
    let how = if how.is_empty() {
        "stride 1, no padding".to_string()
    } else {
        how.join(", ")
    };
    (opts, how)
}

/// The module's `__init__` parameters, `get_init_inputs`, layer constructor, docstring sentence
/// of `kind` with window `win`.
fn conv_layer(
    (kind, win): (Kind, Window),
    steps: &[Step],
) -> (Vec<&'static str>, Vec<&'static str>, String, String) {
    let (ks, window) = match (win, kind) {
        (Window::Tuple(..), _) => ("kernel_size: tuple", "an asymmetric kernel"),
        (_, Kind::Conv3d) => ("kernel_size: int", "a cubic kernel"),
        _ => ("kernel_size: int", "a square kernel"),
    };
    match kind {
        Kind::Conv1d { stride, dil } => {
            let (opts, how) = stride_pad_words(stride, 0, dil);
            (
                vec!["in_channels: int", "out_channels: int", "kernel_size: int"],
                vec!["in_channels", "out_channels", "kernel_size"],
                format!("nn.Conv1d(in_channels, out_channels, kernel_size{opts}, bias=False)"),
                format!("Performs a standard 1D convolution (no bias, {how})"),
            )
        }
        Kind::Conv2d { stride, pad, dil } => {
            let (opts, how) = stride_pad_words(stride, pad, dil);
            (
                vec!["in_channels: int", "out_channels: int", ks],
                vec!["in_channels", "out_channels", "kernel_size"],
                format!("nn.Conv2d(in_channels, out_channels, kernel_size{opts}, bias=False)"),
                format!("Performs a standard 2D convolution with {window} (no bias, {how})"),
            )
        }
        Kind::Transposed2d { stride, pad } => {
            let (opts, how) = stride_pad_words(stride, pad, 1);
            (
                vec!["in_channels: int", "out_channels: int", ks],
                vec!["in_channels", "out_channels", "kernel_size"],
                format!(
                    "nn.ConvTranspose2d(in_channels, out_channels, kernel_size{opts}, bias=False)"
                ),
                format!("Performs a transposed 2D convolution with {window} (no bias, {how})"),
            )
        }
        Kind::Conv3d => (
            vec!["in_channels: int", "out_channels: int", ks],
            vec!["in_channels", "out_channels", "kernel_size"],
            "nn.Conv3d(in_channels, out_channels, kernel_size, bias=False)".into(),
            format!(
                "Performs a standard 3D convolution with {window} (no bias, stride 1, no padding)"
            ),
        ),
        Kind::Depthwise { .. } => (
            vec!["in_channels: int", "kernel_size: int"],
            vec!["in_channels", "kernel_size"],
            "nn.Conv2d(in_channels, in_channels, kernel_size, groups=in_channels, bias=False)"
                .into(),
            "Performs a depthwise 2D convolution with a square kernel (one filter per \
             channel, no bias, stride 1, no padding)"
                .into(),
        ),
        Kind::Pointwise => (
            vec!["in_channels: int", "out_channels: int"],
            vec!["in_channels", "out_channels"],
            "nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False)".into(),
            "Performs a pointwise (1x1) 2D convolution (no bias)".into(),
        ),
        Kind::Fused => (
            vec!["in_channels: int", "out_channels: int", "kernel_size: int"],
            vec!["in_channels", "out_channels", "kernel_size"],
            "nn.Conv2d(in_channels, out_channels, kernel_size)".into(),
            format!(
                "Model that performs {}",
                chain_doc("a 2D convolution (with its bias)", &[], steps)
            ),
        ),
    }
}

/// The module of the convolution `kind` with window `win` in layout `l`'s attribute (then
/// `steps`) over `x_shape`.
fn conv_module(
    (kind, win): (Kind, Window),
    l: &Layout,
    steps: &[Step],
    spec: &TaskSpec,
    x_shape: &[&str],
) -> String {
    let fused = kind == Kind::Fused;
    let (init_params, init_inputs, layer_call, what) = conv_layer((kind, win), steps);
    let (layer, spatial) = (l.layer, l.kk.len());
    let constants = kind
        .names()
        .into_iter()
        .map(|n| {
            let v = match n {
                "kernel_size" => win.constant(spatial),
                _ => spec.train_shapes[0][n].to_string(),
            };
            (n.to_string(), v)
        })
        .collect();
    let mut init_body = vec![];
    if fused && steps.contains(&Step::AddBias) {
        init_body.push("self.bias = nn.Parameter(torch.randn(out_channels, 1, 1))".to_string());
    }
    init_body.push(format!("self.{layer} = {layer_call}"));
    let body: Vec<String> = if fused {
        std::iter::once(format!("x = self.{layer}(x)"))
            .chain(steps.iter().map(|s| s.torch()))
            .chain(["return x".to_string()])
            .collect()
    } else {
        vec![format!("return self.{layer}(x)")]
    };
    render_module(&Module {
        doc: format!("{what}."),
        init_params: init_params.iter().map(|s| s.to_string()).collect(),
        init_body,
        init_inputs: init_inputs.iter().map(|s| s.to_string()).collect(),
        forward_args: &["x"],
        body,
        constants,
        inputs: vec![format!("x = torch.rand({})", x_shape.join(", "))],
        returned: vec!["x".into()],
    })
}

/// The fast kernel's file, the naive kernel and the fast one (`block`, `cob` as [`conv_family`]).
fn conv_kernels(
    (kind, win): (Kind, Window),
    spec: &TaskSpec,
    (wname, bname): (&str, &str),
    steps: &[Step],
    (block, cob): (u32, u32),
) -> (&'static str, String, String) {
    let sig = spec.signature();
    let (decl, arg_names) = params(spec);
    let epilogue = |indent: &str| {
        let mut e = String::new();
        if kind == Kind::Fused {
            e.push_str(&format!("{indent}v = v + {bname}[co];\n"));
        }
        e.push_str(&cuda_chain(steps, "", "co", indent));
        e
    };
    let parts = KernelParts {
        kind,
        win,
        decl: &decl,
        names: &arg_names,
        sig: &sig,
        w: wname,
    };
    if matches!(kind, Kind::Conv3d | Kind::Transposed2d { .. }) {
        let (naive, fast) = volume_kernels(parts, block, cob);
        let file = if kind == Kind::Conv3d {
            "cob_3d.cu"
        } else {
            "cob_transposed.cu"
        };
        return (file, naive, fast);
    }
    let naive = naive_kernel(parts, &epilogue("    "), block);
    let (file, fast) = match kind {
        Kind::Depthwise { .. } => ("depthwise_tile.cu", depthwise_kernel(parts)),
        Kind::Pointwise => ("pointwise_gemm.cu", pointwise_kernel(parts)),
        _ => (
            if matches!(kind, Kind::Conv1d { .. }) {
                "tile_1d.cu"
            } else {
                "tile_2d.cu"
            },
            tile_kernel(parts, &epilogue("                    "), cob),
        ),
    };
    (file, naive, fast)
}

/// The sizes of a 3D or transposed convolution's kernels (`N, C, CO`, the window's `KD, KH,
/// KW`, the input's `D, H, W` and the output's `DO, HO, WO`; a transposed one is 2D: `KD = D =
/// DO = 1`) with window `win`, after its stride and padding macros.
fn volume_prelude(kind: Kind, win: Window) -> (String, String) {
    let (s, p) = kind.stride_pad();
    let [kd, kh, kw] = win.extents();
    let (kd, dims, outs) = if kind == Kind::Conv3d {
        (
            kd.as_str(),
            "depth, H = height, W = width",
            "D - KD + 1, HO = H - KH + 1, WO = W - KW + 1",
        )
    } else {
        (
            "1",
            "1, H = height, W = width",
            "1, HO = (H - 1) * STRIDE - 2 * PAD + KH, WO = (W - 1) * STRIDE - 2 * PAD + KW",
        )
    };
    let macros = format!("#define STRIDE {s}\n#define PAD {p}\n");
    let alias = format!(
        "    const int64_t N = batch_size, C = in_channels, CO = out_channels;\n    \
         const int64_t KD = {kd}, KH = {kh}, KW = {kw};\n    \
         const int64_t D = {dims};\n    \
         const int64_t DO = {outs};\n    \
         (void)N; (void)C; (void)CO; (void)KD; (void)KH; (void)KW; (void)D; (void)H; (void)W;\n    \
         (void)DO; (void)HO; (void)WO;\n"
    );
    (macros, alias)
}

/// The loops over the taps of output `(od, oh, ow)` for one input channel at `xp`, indented by
/// `ind`, each tap running `tap(x, t)` (C statements, one per line) with the input's value `x`
/// and the tap's index `t` (`(kd * kh_n + kh) * kw_n + kw`): a 3D convolution reads
/// `x[od + kd, oh + kh, ow + kw]`; a transposed one the input element `i` with
/// `i * STRIDE - PAD + k = o` along each dimension, where one exists.
fn volume_taps(kind: Kind, ind: &str, tap: impl Fn(&str, &str) -> Vec<String>) -> String {
    let mut lines: Vec<(usize, String)> = Vec::new();
    let body = if kind == Kind::Conv3d {
        lines.push((0, "for (int kd = 0; kd < kd_n; ++kd) {".into()));
        lines.push((1, "for (int kh = 0; kh < kh_n; ++kh) {".into()));
        lines.push((2, "for (int kw = 0; kw < kw_n; ++kw) {".into()));
        tap(
            "xp[((od + kd) * H + oh + kh) * W + ow + kw]",
            "(kd * kh_n + kh) * kw_n + kw",
        )
    } else {
        lines.push((0, "for (int kh = 0; kh < kh_n; ++kh) {".into()));
        lines.push((1, "const int64_t th = oh + PAD - kh;".into()));
        lines.push((
            1,
            "if (th < 0 || th % STRIDE != 0 || th / STRIDE >= H) continue;".into(),
        ));
        lines.push((1, "for (int kw = 0; kw < kw_n; ++kw) {".into()));
        lines.push((2, "const int64_t tw = ow + PAD - kw;".into()));
        lines.push((
            2,
            "if (tw < 0 || tw % STRIDE != 0 || tw / STRIDE >= W) continue;".into(),
        ));
        tap("xp[(th / STRIDE) * W + tw / STRIDE]", "kh * kw_n + kw")
    };
    let depth = if kind == Kind::Conv3d { 3 } else { 2 };
    lines.extend(body.into_iter().map(|l| (depth, l)));
    lines.extend((0..depth).rev().map(|d| (d, "}".to_string())));
    lines
        .into_iter()
        .map(|(d, l)| format!("{ind}{}{l}\n", "    ".repeat(d)))
        .collect()
}

/// The naive and the fast kernel of a 3D or transposed 2D convolution. Naive: one thread per
/// output element looping over the input channels and the window. Fast: each thread computes
/// one output position for `cob` output channels of one image, so each input value it reads
/// serves all of them; 4 input channels at a time, the `cob` filters' taps are staged in shared
/// memory (output channel innermost, read as broadcasts); kernel sizes 3 and 5 (a tuple
/// window's extents) are compiled with unrolled window loops.
fn volume_kernels(parts: KernelParts<'_>, block: u32, cob: u32) -> (String, String) {
    let kind = parts.kind;
    let (macros, alias) = volume_prelude(kind, parts.win);
    let text = VolumeText {
        macros,
        alias,
        what: if kind == Kind::Conv3d {
            "a 3D convolution"
        } else {
            "a transposed 2D convolution"
        },
        // The weight of (output channel co, input channel ci): (CO, C, taps) for a
        // convolution, (C, CO, taps) for a transposed one.
        wi: if kind == Kind::Conv3d {
            "(co * C + ci) * taps"
        } else {
            "(ci * CO + co) * taps"
        },
    };
    (
        volume_naive(parts, &text, block),
        volume_fast(parts, &text, cob),
    )
}

/// What the naive and the fast kernel of a 3D or transposed convolution share: the macros and
/// the sizes' aliases ([`volume_prelude`]), the kind in words and the offset of filter
/// `(co, ci)` in the weight.
struct VolumeText {
    macros: String,
    alias: String,
    what: &'static str,
    wi: &'static str,
}

/// The output position `(od, oh, ow)` of flat index `p`.
const VOLUME_POSITION: &str =
    "const int64_t ow = p % WO, oh = (p / WO) % HO, od = p / (WO * HO);\n    (void)od;\n";

/// The naive kernel ([`volume_kernels`]) with `block` threads a block.
fn volume_naive(parts: KernelParts<'_>, t: &VolumeText, block: u32) -> String {
    let (kind, decl, names, sig, w) = (parts.kind, parts.decl, parts.names, parts.sig, parts.w);
    let (macros, alias, what) = (&t.macros, &t.alias, t.what);
    let position = VOLUME_POSITION;
    format!(
        "// naive: {what}, one thread per output element; a direct loop over the input\n\
         // channels and the kernel window.\n\
         {HEADER}\n{macros}\n\
         __global__ void conv_naive({decl}) {{\n{alias}    \
         const float* WT = {w};\n    \
         const int kd_n = (int)KD, kh_n = (int)KH, kw_n = (int)KW;\n    \
         const int taps = kd_n * kh_n * kw_n;\n    \
         const int64_t P = DO * HO * WO;\n    \
         const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         if (i >= N * CO * P) return;\n    \
         const int64_t p = i % P, co = (i / P) % CO, n = i / (P * CO);\n    \
         {position}    \
         float acc = 0.0f;\n    \
         for (int64_t ci = 0; ci < C; ++ci) {{\n        \
         const float* xp = in0 + (n * C + ci) * D * H * W;\n        \
         const float* wp = WT + {wi};\n\
         {taps}    }}\n    \
         out[i] = acc;\n}}\n\n\
         {sig} {{\n{alias}    \
         if (DO <= 0 || HO <= 0 || WO <= 0 || N * CO == 0) return;\n    \
         const int64_t total = N * CO * DO * HO * WO;\n    \
         const int block = {block};\n    \
         conv_naive<<<(unsigned)((total + block - 1) / block), block, 0, stream>>>({names});\n}}\n",
        wi = t.wi,
        taps = volume_taps(kind, "        ", |x, t| vec![format!(
            "acc += {x} * wp[{t}];"
        )]),
    )
}

/// The fast kernel ([`volume_kernels`]) with `cob` output channels a thread.
fn volume_fast(parts: KernelParts<'_>, t: &VolumeText, cob: u32) -> String {
    let (kind, decl, names, sig, w) = (parts.kind, parts.decl, parts.names, parts.sig, parts.w);
    let (macros, alias, what) = (&t.macros, &t.alias, t.what);
    let position = VOLUME_POSITION;
    // The window's loop bounds: a tuple's extents are compile-time constants; a square window
    // of size 3 or 5 gets its own instance (`KC`), any other size runtime bounds.
    let square = |k: &str| format!("KC > 0 ? KC : (int){k}");
    let (bounds, dispatch, unrolled) = match parts.win {
        Window::Tuple(..) => (
            "(int)KD, kh_n = (int)KH, kw_n = (int)KW".to_string(),
            format!("    run_cob<0>(grid, bytes, stream, {names});\n"),
            "The window's extents are constants: its loops unroll.",
        ),
        Window::Square(_) => (
            format!(
                "{}, kh_n = {}, kw_n = {}",
                if kind == Kind::Conv3d {
                    square("KD")
                } else {
                    "1".to_string()
                },
                square("KH"),
                square("KW")
            ),
            format!(
                "    if (kernel_size == 3) run_cob<3>(grid, bytes, stream, {names});\n    \
                 else if (kernel_size == 5) run_cob<5>(grid, bytes, stream, {names});\n    \
                 else run_cob<0>(grid, bytes, stream, {names});\n"
            ),
            "Kernel sizes 3 and 5 are compiled with unrolled window loops.",
        ),
    };
    format!(
        "// fast: {what}; each thread computes one output position for {cob} output channels\n\
         // of one image, so each input value it reads serves all of them. 4 input channels at a\n\
         // time, the {cob} filters' taps are staged in shared memory (output channel innermost,\n\
         // read as broadcasts). {unrolled}\n\
         {HEADER}\n{macros}#define COB {cob}\n#define CIB 4\n#define TPB 128\n\n\
         template <int KC>\n\
         __global__ void __launch_bounds__(TPB) conv_cob({decl}) {{\n{alias}    \
         const float* WT = {w};\n    \
         const int kd_n = {bounds};\n    \
         const int taps = kd_n * kh_n * kw_n;\n    \
         extern __shared__ float s_w[];\n    \
         const int tid = threadIdx.x;\n    \
         const int64_t P = DO * HO * WO;\n    \
         const int64_t p = (int64_t)blockIdx.x * TPB + tid;\n    \
         {position}    \
         const int64_t cob_n = (CO + COB - 1) / COB;\n    \
         for (int64_t job = blockIdx.y; job < N * cob_n; job += gridDim.y) {{\n        \
         const int64_t n = job / cob_n, co0 = (job % cob_n) * COB;\n        \
         float acc[COB];\n\
         #pragma unroll\n        \
         for (int j = 0; j < COB; ++j) acc[j] = 0.0f;\n        \
         for (int64_t c0 = 0; c0 < C; c0 += CIB) {{\n            \
         for (int e = tid; e < CIB * taps * COB; e += TPB) {{\n                \
         const int j = e % COB, t = (e / COB) % taps, c = e / (COB * taps);\n                \
         const int64_t co = co0 + j, ci = c0 + c;\n                \
         s_w[e] = (co < CO && ci < C) ? WT[{wf} + t] : 0.0f;\n            }}\n            \
         __syncthreads();\n            \
         if (p < P) {{\n                \
         for (int c = 0; c < CIB && c0 + c < C; ++c) {{\n                    \
         const float* xp = in0 + (n * C + c0 + c) * D * H * W;\n                    \
         const float* sw = s_w + c * taps * COB;\n\
         #pragma unroll\n\
         {taps}                }}\n            }}\n            \
         __syncthreads();\n        }}\n        \
         if (p < P) {{\n\
         #pragma unroll\n            \
         for (int j = 0; j < COB; ++j) {{\n                \
         if (co0 + j < CO) out[(n * CO + co0 + j) * P + p] = acc[j];\n            }}\n        }}\n    }}\n}}\n\n\
         template <int KC>\n\
         static void run_cob(dim3 grid, size_t bytes, cudaStream_t stream, {decl}) {{\n    \
         if (bytes > 48 * 1024)\n        \
         cudaFuncSetAttribute(conv_cob<KC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);\n    \
         conv_cob<KC><<<grid, TPB, bytes, stream>>>({names});\n}}\n\n\
         {sig} {{\n{alias}    \
         if (DO <= 0 || HO <= 0 || WO <= 0 || N * CO == 0) return;\n    \
         const int64_t P = DO * HO * WO;\n    \
         int64_t jobs = N * ((CO + COB - 1) / COB);\n    \
         if (jobs > 65535) jobs = 65535;\n    \
         const size_t bytes = (size_t)(CIB * KD * KH * KW * COB) * sizeof(float);\n    \
         const dim3 grid((unsigned)((P + TPB - 1) / TPB), (unsigned)jobs);\n\
         {dispatch}}}\n",
        wf = t.wi,
        taps = volume_taps(kind, "                    ", |x, t| {
            vec![
                format!("const float xv = __ldg(&{x});"),
                format!("const float* wk = sw + ({t}) * COB;"),
                "#pragma unroll".into(),
                "for (int j = 0; j < COB; ++j) acc[j] += xv * wk[j];".into(),
            ]
        }),
    )
}

/// The family's group: the kind, its stride and padding variants, `|asym` for a tuple window,
/// and the fused kind's steps.
fn conv_group(kind: Kind, win: Window, steps: &[Step]) -> String {
    let asym = if matches!(win, Window::Tuple(..)) {
        "|asym"
    } else {
        ""
    };
    match kind {
        Kind::Conv1d { stride, dil } => group_of("conv:conv1d", &[], &variant(stride, 0, dil)),
        Kind::Conv2d { stride, pad, dil } => {
            group_of("conv:conv2d", &[], &(variant(stride, pad, dil) + asym))
        }
        Kind::Depthwise { .. } => group_of("conv:depthwise2d", &[], ""),
        Kind::Pointwise => group_of("conv:pointwise2d", &[], ""),
        Kind::Fused => group_of("conv:fused2d", steps, ""),
        Kind::Conv3d => group_of("conv:conv3d", &[], asym),
        Kind::Transposed2d { stride, pad } => {
            group_of("conv:transposed2d", &[], &(variant(stride, pad, 1) + asym))
        }
    }
}

/// The asymmetric windows drawn for 2D kinds, `(kh, kw)`: KernelBench's (3, 5) and (3, 7) and
/// their kin (extents 3, 5 and 7, which no first train shape's size equals).
const ASYM_2D: [(i64, i64); 4] = [(3, 5), (5, 3), (3, 7), (5, 7)];

/// The asymmetric windows drawn for the 3D kind, `(kd, kh, kw)`: KernelBench's (3, 5, 7) and
/// kin, the depth at most 5 (the shallowest train input is 6 deep).
const ASYM_3D: [(i64, i64, i64); 3] = [(3, 5, 7), (5, 3, 3), (3, 3, 5)];

/// A drawn window: square of `k`, or with probability `p` an asymmetric one.
fn draw_window(rng: &mut ChaCha8Rng, k: i64, p: f64, three: bool) -> Window {
    if !rng.random_bool(p) {
        Window::Square(k)
    } else if three {
        let (d, h, w) = pick(rng, &ASYM_3D);
        Window::Tuple(d, h, w)
    } else {
        let (h, w) = pick(rng, &ASYM_2D);
        Window::Tuple(1, h, w)
    }
}

/// A dilation: 1, or (three times in ten) one of `dils` (KernelBench level 1's dilated
/// convolutions use 2-4).
fn draw_dilation(rng: &mut ChaCha8Rng, dils: &[i64]) -> i64 {
    if rng.random_bool(0.3) {
        pick(rng, dils)
    } else {
        1
    }
}

/// A group's stride, padding and dilation variant: `|stride2`, `|pad`, `|dil`, any of them or
/// none.
fn variant(stride: i64, pad: i64, dil: i64) -> String {
    let mut extra = String::new();
    if stride != 1 {
        extra.push_str(&format!("|stride{stride}"));
    }
    if pad != 0 {
        extra.push_str("|pad");
    }
    if dil != 1 {
        extra.push_str("|dil");
    }
    extra
}

/// Draws one convolution family: a 1D convolution (about 12%; half stride 1, a quarter each 2 and
/// 3, three in ten dilated 2-4), a standard 2D one (19%; half of them with stride 2, padding `k //
/// 2` of the drawn size `k` or both; three in ten dilated 2 or 3), a depthwise one (12%), a
/// pointwise one (12%), a 2D convolution with its bias and 1-3 elementwise steps (23%; a third of
/// them with a `(out_channels, 1, 1)` bias parameter among the steps), a 3D one (12%) or a
/// transposed 2D one (12%; stride 1 or 2, padding 0 or 1); kernel size 3 or 5, one of three shape
/// regimes. A third of the standard 2D and transposed windows and half of the 3D ones are
/// asymmetric ([`ASYM_2D`], [`ASYM_3D`]).
pub(super) fn draw(rng: &mut ChaCha8Rng, id: &str) -> Family {
    let k = pick(rng, &[3, 5]);
    let regime = rng.random_range(0..3);
    let launch = (pick(rng, &[128, 256, 512]), pick(rng, &[4, 8]));
    let square = Window::Square(k);
    match rng.random_range(0..26) {
        20..=22 => {
            let win = draw_window(rng, k, 0.5, true);
            conv_family(id, (Kind::Conv3d, win), regime, &[], launch)
        }
        23..=25 => {
            let (stride, pad) = (pick(rng, &[1, 2]), pick(rng, &[0, 1]));
            let win = draw_window(rng, k, 1.0 / 3.0, false);
            conv_family(
                id,
                (Kind::Transposed2d { stride, pad }, win),
                regime,
                &[],
                launch,
            )
        }
        0..=2 => {
            let stride = pick(rng, &[1, 1, 2, 3]);
            let dil = draw_dilation(rng, &[2, 3, 4]);
            let kind = Kind::Conv1d { stride, dil };
            conv_family(id, (kind, square), regime, &[], launch)
        }
        3..=7 => {
            let (stride, pad) = match rng.random_range(0..10) {
                0..=4 => (1, 0),
                5..=6 => (2, 0),
                7..=8 => (1, k / 2),
                _ => (2, k / 2),
            };
            let win = draw_window(rng, k, 1.0 / 3.0, false);
            let dil = draw_dilation(rng, &[2, 3]);
            let kind = Kind::Conv2d { stride, pad, dil };
            conv_family(id, (kind, win), regime, &[], launch)
        }
        8..=10 => {
            let channels = pick(rng, &[8, 16, 32]);
            let kind = Kind::Depthwise { channels };
            conv_family(id, (kind, square), regime, &[], launch)
        }
        11..=13 => conv_family(
            id,
            (Kind::Pointwise, Window::Square(1)),
            regime,
            &[],
            launch,
        ),
        _ => {
            let n = rng.random_range(1..=3);
            let mut steps = draw_steps(rng, n, false);
            if rng.random_bool(0.3) {
                let at = rng.random_range(0..=steps.len());
                steps.insert(at, Step::AddBias);
            }
            conv_family(id, (Kind::Fused, square), regime, &steps, launch)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use cudarl_cuda::task::eval_formula;
    use rand::SeedableRng;

    use super::*;

    /// The template key of a family: its group without the steps (`conv:conv2d|stride2`).
    fn template(f: &Family) -> String {
        let g = f.spec.group.clone().expect("group");
        g.rsplit_once(':').map(|(a, _)| a.to_string()).unwrap_or(g)
    }

    #[test]
    fn every_kind_draws_validates_and_compiles_with_nvcc() {
        let mut by_template: BTreeMap<String, Family> = BTreeMap::new();
        for seed in 0..400u64 {
            let id = format!("gen_op_{seed:04}");
            let f = draw(&mut ChaCha8Rng::seed_from_u64(seed), &id);
            let g = draw(&mut ChaCha8Rng::seed_from_u64(seed), &id);
            f.spec
                .validate()
                .unwrap_or_else(|e| panic!("{id} {:?}: {e}", f.spec.group));
            assert_eq!(f.spec, g.spec);
            assert_eq!(f.naive, g.naive);
            assert_eq!(f.optimized, g.optimized);
            for src in std::iter::once(&f.naive).chain(f.optimized.iter().map(|o| &o.1)) {
                assert!(src.contains(&f.spec.signature()), "{id}");
            }
            let m = f.spec.module.as_deref().expect("module");
            assert!(m.contains("class Model(nn.Module)") && m.contains("def get_init_inputs()"));
            // kb-specs names a dimension by the module constant of its value when exactly one
            // has it: the constants of the first train shape differ (height and width aside,
            // which kb-specs tells apart by doubling each).
            let first = &f.spec.train_shapes[0];
            let mut seen: BTreeMap<i64, &str> = BTreeMap::new();
            for (name, v) in first {
                if let Some(other) = seen.insert(*v, name)
                    && !matches!((other, name.as_str()), ("height", "width"))
                {
                    panic!("{id}: {other} and {name} are both {v}");
                }
            }
            // A tuple window (`kernel_size = (3, 7)`) is no launcher size, and no constant has
            // one of its extents as its value (kb-specs keeps those dimensions literal).
            let tuple = m
                .lines()
                .find_map(|l| l.strip_prefix("kernel_size = ("))
                .map(|t| t.trim_end_matches(')'));
            if let Some(t) = tuple {
                assert!(
                    f.spec.group.as_deref().unwrap_or("").contains("|asym"),
                    "{id}"
                );
                assert!(!f.spec.sizes.iter().any(|s| s == "kernel_size"), "{id}");
                for e in t.split(", ") {
                    let e: i64 = e.parse().expect("extent");
                    assert!(first.values().all(|v| *v != e), "{id}: a size is {e}");
                }
            }
            // Every dimension is positive at the hold-out shape the module test runs at (every
            // size capped at 33).
            let capped: BTreeMap<String, i64> = f.spec.holdout_shapes[1]
                .iter()
                .map(|(k, v)| (k.clone(), (*v).min(33)))
                .collect();
            for shape in f.spec.train_shapes.iter().chain(&f.spec.holdout_shapes) {
                for s in [shape, &capped] {
                    for a in &f.spec.args {
                        for d in &a.shape {
                            let v = eval_formula(d, s).expect("dim");
                            assert!(v > 0, "{id}: {d} = {v}");
                        }
                    }
                }
            }
            by_template.entry(template(&f)).or_insert(f);
        }
        let got: BTreeSet<&str> = by_template.keys().map(String::as_str).collect();
        for want in [
            "conv:conv1d",
            "conv:conv1d|dil",
            "conv:conv1d|stride2",
            "conv:conv1d|stride3|dil",
            "conv:conv2d",
            "conv:conv2d|dil",
            "conv:conv2d|stride2|pad|dil",
            "conv:conv2d|stride2",
            "conv:conv2d|pad",
            "conv:conv2d|stride2|pad",
            "conv:conv2d|asym",
            "conv:conv3d",
            "conv:conv3d|asym",
            "conv:transposed2d",
            "conv:transposed2d|asym",
            "conv:transposed2d|stride2",
            "conv:transposed2d|pad",
            "conv:transposed2d|stride2|pad",
            "conv:depthwise2d",
            "conv:pointwise2d",
            "conv:fused2d",
        ] {
            assert!(got.contains(want), "{want} not in {got:?}");
        }
        assert!(got.iter().any(|g| g.ends_with("|dil|asym")), "{got:?}");
        super::super::tests::compile_with_nvcc(by_template.values());
    }
}
