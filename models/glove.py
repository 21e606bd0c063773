"""GloVe word vectors in torch, trained from a word–word co-occurrence matrix.

Pennington, Socher & Manning (2014), "GloVe: Global Vectors for Word Representation", EMNLP.
The model fits, over the nonzero cells X_ij of the co-occurrence matrix, the weighted least squares

    J = Σ_ij f(X_ij) · (w_i·w̃_j + b_i + b̃_j − log X_ij)²,     f(x) = min(1, (x / x_max)^α)

and returns w + w̃ per word (the paper's section 4.2: the sum is a little better than either),
its singular values raised to `spectrum_power` (default 1.5; 1 leaves them as trained). Stretching
the leading directions trades relatedness for similarity (after Artetxe et al. 2018): on the dev
halves it lifted SimLex-999 for a smaller WS353 cost (docs/embeddings.md).

Unobserved cells (`negative` > 0, the default; `negative=0` is the paper's objective). The sum
above ignores every zero cell, so "i and j never occur together" reaches the vectors only through
the biases, which absorb it; on a ~1 M-token corpus that caps word similarity far below PPMI-SVD
(docs/embeddings.md measures the ceiling). A zero cell is a censored observation: the pair's count
is below the smallest count an observed pair has, x_min (1/window for harmonic counts). So each
batch also draws `negative` unobserved cells per observed cell — the observed cell's row word with
a context drawn ∝ count^0.75, as word2vec draws its negatives — and adds a one-sided penalty

    negative_weight · max(0, w_i·w̃_j + b_i + b̃_j − log(negative_bound · x_min))²

that is zero whenever the model already predicts the pair below the bound (a Tobit-style censored
least squares; Swivel, Shazeer et al. 2016, treats GloVe's zeros with a similar soft hinge). The
bound is half the smallest count by default, not x_min itself: an unseen pair's count is below
any observed one, and half an occurrence is the usual point estimate for it (add-½ smoothing);
on the dev pairs it lifted SimLex-999 with WS353 unchanged (docs/embeddings.md). A drawn pair
that did occur is rare (~1 % of pairs do here) and left as it is drawn.

Training, as in the reference C code (glove.c), with mini-batches instead of Hogwild threads:
- every epoch the nonzero cells are shuffled (seeded) and visited once, in batches of
  `batch_size` cells; a batch's gradient is the sum of its cells' gradients (so a word seen in
  many cells of one batch gets one summed step, which AdaGrad then scales);
- AdaGrad per parameter (Duchi et al. 2011; the paper's optimizer, step 0.05): G ← G + g²,
  θ ← θ − lr·g / √G, with G starting at `adagrad_init` (G0, default 1): plain SGD with step lr
  while a parameter's summed squared gradients are small against G0, AdaGrad after. glove.c's
  form (u = η·g, G ← G + u², θ ← θ − u/√G, G starting at 1) is the same rule with lr = 1 and
  G0 = 1/η², i.e. an asymptotic step of 1 — with mini-batches that made frequent words jump and
  the dev scores peak after a few epochs and then fall (docs/embeddings.md), hence the paper's form;
  `optimizer="adam"` is optional (Kingma & Ba 2015, standard bias-corrected Adam, dense moments);
- initial vectors and biases uniform in [−0.5, 0.5) / dim, as in glove.c.

Rows of the matrix are vocabulary ids. A word with no nonzero cell in its row or column (the
special tokens `<unk> <s> </s> <pad>`, which the co-occurrence counts skip) is never trained: its
output vector is all zeros, which cosine-based consumers treat as "no information".

Device: "auto" trains on CUDA when torch sees a GPU (the GPU-worker path), otherwise on CPU. All
training tensors live on the device, gradients are scattered with `index_add_` into preallocated
dense buffers and the optimizer updates them in place, and the only host synchronisation is one
per epoch (the loss). On CPU the run is deterministic for a seed (same numbers bit for bit);
CUDA's `index_add_` uses atomics, so GPU runs agree only to rounding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp
import torch
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.estimator import Estimator
from lexiflow.models.glove_config import GloVeConfig, Optimizer
from lexiflow.models.progress import Progress
from lexiflow.models.threads import limit_threads
from lexiflow.models.vectors import reweight_spectrum

logger = logging.getLogger("lexiflow.glove")

_CPU_CHUNK_CELLS = 16384  # cells (observed + unobserved) per gradient chunk on the CPU




def weighting(x: np.ndarray | torch.Tensor, x_max: float, alpha: float) -> np.ndarray | torch.Tensor:
    """f(x) = min(1, (x / x_max)^α), the GloVe cell weight (0 at x = 0, 1 from x_max on)."""
    if isinstance(x, torch.Tensor):
        return torch.clamp(x / x_max, max=1.0) ** alpha
    return np.minimum(np.asarray(x, dtype=np.float64) / x_max, 1.0) ** alpha


def initial_parameters(vocab_size: int, dim: int, seed: int) -> list[np.ndarray]:
    """w (V,d), w̃ (V,d), b (V,), b̃ (V,): uniform in [-0.5, 0.5) / dim as in glove.c.

    Drawn on the CPU from the seed, so every device starts from the same point.
    """
    gen = torch.Generator().manual_seed(seed)
    shapes = ((vocab_size, dim), (vocab_size, dim), (vocab_size,), (vocab_size,))
    return [((torch.rand(shape, generator=gen) - 0.5) / dim).numpy() for shape in shapes]


class GloVe(Estimator):
    """GloVe estimator: `GloVe(...).fit(cooccurrence).vectors_` (V × dim float32, w + w̃)."""

    def __init__(
        self,
        dim: int = GloVeConfig.dim,
        x_max: float = GloVeConfig.x_max,
        alpha: float = GloVeConfig.alpha,
        epochs: int = GloVeConfig.epochs,
        lr: float = GloVeConfig.lr,
        batch_size: int = GloVeConfig.batch_size,
        optimizer: Optimizer = GloVeConfig.optimizer,
        adagrad_init: float = GloVeConfig.adagrad_init,
        negative: int = GloVeConfig.negative,
        negative_weight: float = GloVeConfig.negative_weight,
        negative_bound: float = GloVeConfig.negative_bound,
        spectrum_power: float = GloVeConfig.spectrum_power,
        device: str = GloVeConfig.device,
        seed: int = GloVeConfig.seed,
        threads: int = GloVeConfig.threads,
    ) -> None:
        self.dim, self.x_max, self.alpha, self.epochs, self.lr = dim, x_max, alpha, epochs, lr
        self.batch_size, self.optimizer, self.device, self.seed = batch_size, optimizer, device, seed
        self.adagrad_init, self.negative, self.negative_weight = adagrad_init, negative, negative_weight
        self.negative_bound, self.spectrum_power, self.threads = negative_bound, spectrum_power, threads

    @property
    def config(self) -> GloVeConfig:
        return GloVeConfig(**self.get_params())

    def fit(
        self,
        matrix: sp.spmatrix | sp.sparray,
        progress: Callable[[float | None], None] | None = None,
        on_epoch: Callable[[dict[str, float], np.ndarray], None] | None = None,
        start: Sequence[np.ndarray] | None = None,
    ) -> GloVe:
        """Train on a (V × V) co-occurrence matrix whose rows/columns are vocabulary ids.

        `on_epoch(record, vectors)`, if given, sees each epoch's history record and the vectors so
        far (for learning curves / early-stopping studies; it costs a device-to-host copy per epoch).
        `start`: w, w̃, b, b̃ to continue from (an earlier fit's `state_`, rows by vocabulary id), NaN rows
        where a word starts at random as in a cold fit. `state_` holds them after the fit.
        """
        cfg = self.config
        cfg.validate()
        with limit_threads(cfg.threads, "glove.threads"):
            return self._fit(cfg, matrix, progress, on_epoch, start)

    def _fit(self, cfg: GloVeConfig, matrix: sp.spmatrix | sp.sparray, progress: Callable[[float | None], None] | None,
             on_epoch: Callable[[dict[str, float], np.ndarray], None] | None,
             start: Sequence[np.ndarray] | None) -> GloVe:
        rows, cols, counts, vocab_size = _cells(matrix)
        dev = resolve_device(cfg.device, "glove.device")
        self.device_ = str(dev)
        n, d = len(counts), cfg.dim

        # Cell data, on the device once: (n,) each.
        i_all = torch.from_numpy(rows).to(dev)
        j_all = torch.from_numpy(cols).to(dev)
        log_x = torch.from_numpy(np.log(counts).astype(np.float32)).to(dev)
        f_x = torch.from_numpy(weighting(counts, cfg.x_max, cfg.alpha).astype(np.float32)).to(dev)

        initial = initial_parameters(vocab_size, d, cfg.seed)
        for ours, given in zip(initial, start or (), strict=False):
            known = ~np.isnan(given.reshape(len(given), -1)).any(axis=1)
            ours[known] = given[known]
        params = [torch.from_numpy(p).to(dev) for p in initial]
        grads = [torch.zeros_like(p) for p in params]
        step = _AdaGrad(params, cfg.lr, cfg.adagrad_init) if cfg.optimizer == "adagrad" else _Adam(params, cfg.lr)
        w, w_ctx, b, b_ctx = params
        g_w, g_ctx, g_b, g_bctx = grads
        shuffle = torch.Generator(device=dev).manual_seed(cfg.seed)
        trained = np.zeros(vocab_size, dtype=bool)
        trained[rows] = True
        trained[cols] = True

        if cfg.negative:  # unobserved cells: contexts drawn ∝ count^0.75, held below negative_bound · x_min
            context_mass = np.bincount(cols, weights=counts, minlength=vocab_size) ** 0.75
            noise = torch.from_numpy(noise_table(context_mass)).to(dev)
            log_bound = float(np.log(cfg.negative_bound * counts.min()))

        def accumulate(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """Add these cells' gradients (and their unobserved cells') to `grads`; their two loss sums."""
            i, j = i_all[idx], j_all[idx]  # (B,)
            wi, wj = w.index_select(0, i), w_ctx.index_select(0, j)  # (B,d)
            diff = torch.einsum("bd,bd->b", wi, wj) + b[i] + b_ctx[j] - log_x[idx]  # (B,)
            fdiff = f_x[idx] * diff
            loss = (fdiff * diff).sum(dtype=torch.float64)
            g = 2.0 * fdiff  # dJ/d(prediction) per cell
            g_ctx.index_add_(0, j, wi * g[:, None])
            g_bctx.index_add_(0, j, g)
            row_grad = wj.mul_(g[:, None])  # wj is a copy: reuse it for dJ/dw_i
            if not cfg.negative:
                g_w.index_add_(0, i, row_grad)
                g_b.index_add_(0, i, g)
                return loss, torch.zeros_like(loss)
            # each cell's row word again, with `negative` drawn contexts
            drawn = noise[torch.randint(len(noise), (len(idx), cfg.negative), generator=shuffle, device=dev)]  # (B,k)
            wn = w_ctx.index_select(0, drawn.view(-1)).view(len(idx), cfg.negative, d)  # (B,k,d)
            over = torch.einsum("bd,bkd->bk", wi, wn) + b[i][:, None] + b_ctx[drawn] - log_bound
            over.clamp_(min=0.0)  # an unobserved cell costs only when predicted above the bound
            unobserved = cfg.negative_weight * over.square().sum(dtype=torch.float64)
            gn = over.mul_(2.0 * cfg.negative_weight)  # (B,k)
            g_w.index_add_(0, i, row_grad.add_(torch.einsum("bk,bkd->bd", gn, wn)))
            g_b.index_add_(0, i, g.add_(gn.sum(1)))
            # CPU: scatter only the cells above the bound; on a GPU selecting them (nonzero) would sync every chunk
            add_context_gradients(g_ctx, g_bctx, drawn, gn, wi, only_active=dev.type == "cpu")
            return loss, unobserved

        # CPU: gradients in chunks whose temporaries stay small enough for the allocator to reuse
        # (fresh blocks of tens of MB are page-faulted on every use: 3x slower per row); CUDA: whole batches.
        chunk = cfg.batch_size if dev.type == "cuda" else max(1, _CPU_CHUNK_CELLS // (1 + cfg.negative))
        self.history_: list[dict[str, float]] = []
        with Progress("glove", total=cfg.epochs * n, unit="cells", callback=progress) as bar:
            for epoch in range(1, cfg.epochs + 1):
                start = time.perf_counter()
                order = torch.randperm(n, generator=shuffle, device=dev)
                loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
                unobserved_sum = torch.zeros((), dtype=torch.float64, device=dev)
                for lo in range(0, n, cfg.batch_size):
                    batch = order[lo:lo + cfg.batch_size]
                    for buf in grads:
                        buf.zero_()
                    for c in range(0, len(batch), chunk):
                        loss, unobserved = accumulate(batch[c:c + chunk])
                        loss_sum += loss
                        unobserved_sum += unobserved
                    step(grads)
                    bar.update(len(batch))  # within the epoch: a long epoch reports rate and ETA as it goes
                loss = loss_sum.item() / n  # the epoch's one host sync (also waits for the GPU)
                seconds = time.perf_counter() - start
                if not np.isfinite(loss):
                    raise ParameterError(f"GloVe diverged in epoch {epoch} (loss {loss}); lower lr={cfg.lr}")
                self.history_.append({"epoch": epoch, "loss": loss, "seconds": seconds,
                                      "cells_per_s": n / max(seconds, 1e-12)})
                if cfg.negative:
                    self.history_[-1]["unobserved_loss"] = unobserved_sum.item() / (n * cfg.negative)
                logger.debug("glove epoch %d: loss %.5f, %.2fs", epoch, loss, seconds)
                if on_epoch is not None:
                    on_epoch(self.history_[-1], _output(w, w_ctx, trained, cfg.spectrum_power))

        self.vectors_ = _output(w, w_ctx, trained, cfg.spectrum_power)
        self.state_ = [p.cpu().numpy() for p in params]
        self.n_cells_ = n
        return self


def add_context_gradients(g_ctx: torch.Tensor, g_bctx: torch.Tensor, drawn: torch.Tensor, gn: torch.Tensor,
                          wi: torch.Tensor, only_active: bool) -> None:
    """Scatter the unobserved cells' gradients into the context rows they drew: w̃_j gets gn·w_i and
    b̃_j gets gn (drawn, gn: (B, k); wi: (B, d)). `only_active` skips the cells with gn = 0 first."""
    if only_active:
        cell, slot = gn.nonzero(as_tuple=True)
        ctx, ctx_g, ctx_grad = drawn[cell, slot], gn[cell, slot], wi[cell] * gn[cell, slot, None]
    else:
        ctx, ctx_g, ctx_grad = drawn.reshape(-1), gn.reshape(-1), (wi[:, None] * gn[..., None]).reshape(-1, wi.shape[1])
    g_ctx.index_add_(0, ctx, ctx_grad)
    g_bctx.index_add_(0, ctx, ctx_g)


def noise_table(mass: np.ndarray, size: int = 10_000_000) -> np.ndarray:
    """word2vec's unigram table: id k fills ⌊size·P(≤k)⌋ − ⌊size·P(<k)⌋ slots, so a uniform slot
    is a draw ∝ mass in O(1) (a binary search per draw costs ~20× more here); ids without mass get none."""
    ends = np.floor(np.cumsum(mass) / mass.sum() * size).astype(np.int64)
    ends[-1] = size
    return np.repeat(np.arange(len(mass), dtype=np.int64), np.diff(ends, prepend=0))


def _output(w: torch.Tensor, w_ctx: torch.Tensor, trained: np.ndarray, spectrum_power: float) -> np.ndarray:
    """w + w̃ as float32 numpy, spectrum reweighted; untrained rows (specials) zero, not their random init."""
    vectors = (w + w_ctx).cpu().numpy().astype(np.float32)
    vectors[~trained] = 0.0
    return reweight_spectrum(vectors, spectrum_power)


def _cells(matrix: sp.spmatrix | sp.sparray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Nonzero cells (row, col, count) of a square, nonnegative matrix."""
    if not sp.issparse(matrix):
        raise InputError("GloVe.fit: the co-occurrence matrix must be a scipy.sparse matrix (V × V)")
    if matrix.shape[0] != matrix.shape[1]:
        raise InputError(f"GloVe.fit: the co-occurrence matrix must be square, got shape {matrix.shape}")
    coo = sp.coo_matrix(matrix)
    coo.sum_duplicates()
    if coo.nnz and coo.data.min() < 0:
        raise InputError("GloVe.fit: co-occurrence counts must be nonnegative")
    keep = coo.data > 0
    if not keep.any():
        raise InputError("GloVe.fit: the co-occurrence matrix has no nonzero cell (empty corpus?)")
    return (coo.row[keep].astype(np.int64), coo.col[keep].astype(np.int64),
            coo.data[keep].astype(np.float64), matrix.shape[0])


class _AdaGrad:
    """AdaGrad (Duchi et al. 2011): G += g²; θ -= lr·g / √G, with G starting at `init` (G0).
    glove.c's form is lr = 1, G0 = 1/η² (see the module docstring).
    In place and dense: rows a batch does not touch have g = 0, so their G and θ stay as they were.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, init: float) -> None:
        self.params, self.lr = params, lr
        self.acc = [torch.full_like(p, init) for p in params]

    def __call__(self, grads: list[torch.Tensor]) -> None:
        for p, g, acc in zip(self.params, grads, self.acc, strict=True):
            acc.addcmul_(g, g)
            p.addcdiv_(g, acc.sqrt(), value=-self.lr)


class _Adam:
    """Kingma & Ba (2015) with bias correction, β = (0.9, 0.999), ε = 1e-8; dense moments."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def __call__(self, grads: list[torch.Tensor]) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t  # python floats: no device sync
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)
