"""A graphical model in numpy for AIM's rounds: mbi's mirror descent, junction tree and model size, without a compiled
program per model.

AIM refits its model after every round, and every round may add a clique. mbi compiles XLA programs for each new set
of cliques (about ten per refit, 0.4 s each on a 2-core CPU): that compilation was most of an AIM release. The
models AIM builds between rounds are small (a few thousand to a few hundred thousand cells), so numpy runs the same
algorithm without compiling anything:

- the junction tree is mbi's (``mbi.junction_tree.make_junction_tree``, its greedy elimination order, its maximal
  cliques and message order), so a model here has the cliques and the size mbi's would;
- ``Model.fit`` is mbi's ``MirrorDescent`` step (the L2 loss 0.5 sum ||(mu_c - y_c) / sigma_c||^2, the initial step
  2 / (L total) with mbi's Lipschitz constant, Armijo's test halving or growing the step by 1.01), with HUGIN message
  passing in log space as mbi's ``message_passing_hugin``; the total is mbi's minimum-variance estimate;
- ``model_cells`` is mbi's ``hypothetical_model_size`` in cells, computed on bit masks (mbi's is pure Python over
  sets: 4 ms a call, and AIM asks it for every candidate in every round);
- ``Model.marginal`` answers a pair that no clique of the tree holds by chaining conditionals along the tree's path
  between two cliques that hold its columns (the separators make the rest independent).

Everything here is post-processing of the noisy counts; the last fit of a release and its sampling stay with mbi,
warm-started from this model's potentials (``Model.potentials_for``).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

import numpy as np

Clique = tuple[int, ...]  # column indices, ascending
SHRINK, GROW = 0.5, 1.02
# linear-space calibration stands only while every message and clique keeps a mass above this (relative to its
# largest factor, 1): a cell that underflowed is then below 1e-208 of the largest, else the log-space recursion runs
TINY = 1e-100
BLOCK = 50  # mirror-descent steps between two convergence checks (mbi's CALLBACK_EVERY)


def load_mbi():
    """mbi, with JAX in float64 (counts of large tables need it) and without the persistent compilation cache (many
    small programs: the cache only costs), set before mbi is first imported."""
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import mbi

    return mbi


def model_cells(sizes: Sequence[int], cliques: Sequence[Clique]) -> int:
    """Cells of the maximal cliques of mbi's junction tree on ``cliques`` (``mbi.junction_tree.hypothetical_model_size``
    times 2^20 / 8), every column of ``sizes`` a node: a tree graph eliminated leaves first (its edges are the
    cliques), any other graph by mbi's greedy order (the column whose closed neighbourhood has the fewest cells, the
    first in column order on a tie); the triangulated graph's maximal cliques are the maximal elimination cliques."""
    d = len(sizes)
    adj = [0] * d
    edges = set()
    for cl in cliques:
        for a, b in itertools.combinations(cl, 2):
            if a != b:
                adj[a] |= 1 << b
                adj[b] |= 1 << a
                edges.add((min(a, b), max(a, b)))
    if d == 1:
        return int(sizes[0])
    if edges and len(edges) == d - 1 and _connected(adj):  # a tree: no fill, its edges are the maximal cliques
        return sum(int(sizes[a]) * int(sizes[b]) for a, b in edges)

    def cells(mask: int) -> int:
        out = 1
        while mask:
            low = mask & -mask
            out *= int(sizes[low.bit_length() - 1])
            mask ^= low
        return out

    left = list(range(d))
    adj = list(adj)
    elim = []
    while left:
        best, best_cost = None, None
        for a in left:
            c = cells(adj[a] | (1 << a))
            if best_cost is None or c < best_cost:
                best, best_cost = a, c
        nbrs = adj[best]
        elim.append(nbrs | (1 << best))
        m = nbrs
        while m:
            low = m & -m
            v = low.bit_length() - 1
            adj[v] = (adj[v] | nbrs) & ~low & ~(1 << best)
            m ^= low
        left.remove(best)
    distinct = set(elim)
    maximal = [c for c in distinct if not any(c != o and c & o == c for o in distinct)]
    return sum(cells(c) for c in maximal)


def _connected(adj: list) -> bool:
    seen, todo = 1, 1
    while todo:
        low = todo & -todo
        todo ^= low
        new = adj[low.bit_length() - 1] & ~seen
        seen |= new
        todo |= new
    return seen == (1 << len(adj)) - 1


def maximal_subset(cliques: Sequence[Clique]) -> list[Clique]:
    """The cliques not contained in another (duplicates once), in their first order of appearance."""
    sets = [frozenset(c) for c in cliques]
    out, seen = [], set()
    for cl, s in zip(cliques, sets):
        if s in seen or any(s < o for o in sets):
            continue
        seen.add(s)
        out.append(tuple(sorted(cl)))
    return out


class Model:
    """A graphical model on ``cliques`` (the maximal measured cliques) over columns of ``sizes``: log potentials per
    clique, ``total`` rows. ``fit`` runs mirror descent on measurements; ``marginal`` answers one- and two-way
    counts. ``potentials``: an earlier model's, carried into this one (mbi's ``CliqueVector.expand``)."""

    def __init__(
        self, sizes: Sequence[int], cliques: Sequence[Clique], total: float, potentials: Optional[dict] = None
    ):
        import networkx as nx

        mbi = load_mbi()
        self.sizes = tuple(int(s) for s in sizes)
        self.cliques = maximal_subset(cliques)
        self.total = float(total)
        names = [str(i) for i in range(len(self.sizes))]
        domain = mbi.Domain(names, list(self.sizes))
        tree, _ = mbi.junction_tree.make_junction_tree(domain, [tuple(names[i] for i in c) for c in self.cliques])
        relabel = {node: tuple(sorted(int(a) for a in node)) for node in tree.nodes}
        self._tree = nx.relabel_nodes(tree, relabel)
        self.maximal = sorted(self._tree.nodes)
        self._order = _collect_distribute(self._tree)
        self._home = {c: self._smallest_holder(c, self.maximal) for c in self.cliques}
        self._trees = {
            k: _reduction_tree(k, [c for c in self.cliques if self._home[c] == k], self.sizes) for k in self.maximal
        }
        self.theta = {c: np.zeros(self._shape(c)) for c in self.cliques}
        for c, v in (potentials or {}).items():  # earlier potentials, each added to a clique that holds it
            home = self._smallest_holder(c, self.cliques)
            self.theta[home] = self.theta[home] + np.asarray(v, np.float64).reshape(self._within(c, home))
        self._beliefs = None

    def _smallest_holder(self, c, among) -> Clique:
        """The clique of ``among`` with the fewest cells that holds ``c`` (the first such on a tie), as mbi's
        ``clique_mapping`` with a domain routes a measurement."""
        return min((k for k in among if set(c) <= set(k)), key=self._cells)

    # shapes
    def _shape(self, c: Clique) -> tuple:
        return tuple(self.sizes[a] for a in c)

    def _cells(self, c: Clique) -> int:
        return math.prod(self._shape(c))

    @property
    def cells(self) -> int:
        """The model's size: the cells of its junction tree's maximal cliques (``model_cells`` of its cliques)."""
        return sum(self._cells(k) for k in self.maximal)

    def _within(self, c: Clique, k: Clique) -> tuple:
        """The shape that broadcasts an array on ``c`` (a subset of ``k``, both ascending) into ``k``'s axes."""
        return tuple(self.sizes[a] if a in c else 1 for a in k)

    @staticmethod
    def _axes_out(c: Clique, k: Clique) -> tuple:
        return tuple(i for i, a in enumerate(k) if a not in c)

    # inference
    def _calibrate(self, theta: dict) -> dict:
        """Each maximal clique's calibrated probabilities (summing to 1) under the log potentials ``theta``: HUGIN
        message passing (mbi's ``message_passing_hugin``) in linear space. The potentials are exponentiated once per
        clique (shifted by their maximum), messages are sums rescaled to a maximum of 1 and HUGIN's division skips a
        separator cell whose message is 0 (the cells it would divide are 0 already). Scalars cancel in the final
        normalisation, so this is the log-space recursion's result up to rounding, at one exp per clique instead of
        one per message; where a message or a clique underflows entirely, the log-space recursion decides."""
        return self._calibrate_logs(self._log_potentials(theta))

    def _calibrate_logs(self, logs: dict) -> dict:
        """``_calibrate`` from the maximal cliques' log potentials."""
        pot = {k: np.exp(b - b.max()) for k, b in logs.items()}
        messages = {}
        for i, j in self._order:
            sep = tuple(a for a in i if a in j)
            tau = pot[i]
            if (j, i) in messages:
                back = messages[(j, i)].reshape(self._within(sep, i))
                if back.min() > 0.0:
                    tau = tau / back
                else:
                    tau = np.divide(tau, back, out=np.zeros(np.broadcast_shapes(tau.shape, back.shape)), where=back > 0)
            msg = tau.sum(axis=self._axes_out(sep, i)).reshape(self._shape(sep))
            top = msg.max()
            if not TINY < top < math.inf:
                return self._calibrate_log(logs)
            msg = msg / top
            messages[(i, j)] = msg
            pot[j] = pot[j] * msg.reshape(self._within(sep, j))
        for k, p in pot.items():
            total = p.sum()
            if not TINY < total < math.inf:
                return self._calibrate_log(logs)
            pot[k] = p / total
        return pot

    def _log_potentials(self, theta: dict) -> dict:
        """The log potentials summed into the maximal cliques (each measured clique into its home), along each home's
        ``_reduction_tree`` upwards: cliques that lack the same columns are added on the smaller array first."""
        logs = {}
        for k in self.maximal:
            acc = _tree_up(self._trees[k], theta)
            shape = self._shape(k)
            logs[k] = np.zeros(shape) if acc is None else acc if acc.shape == shape else acc + np.zeros(shape)
        return logs

    def _calibrate_log(self, logs: dict) -> dict:
        """``_calibrate`` in log space (mbi's recursion as written), from ``_log_potentials``: the fallback where
        linear space underflows."""
        beliefs = dict(logs)
        messages = {}
        for i, j in self._order:
            sep = tuple(a for a in i if a in j)
            tau = beliefs[i]
            if (j, i) in messages:
                tau = tau - messages[(j, i)].reshape(self._within(sep, i))
            axes = self._axes_out(sep, i)
            top = tau.max(axis=axes, keepdims=True)
            msg = (np.log(np.exp(tau - top).sum(axis=axes, keepdims=True)) + top).reshape(self._shape(sep))
            messages[(i, j)] = msg
            beliefs[j] = beliefs[j] + msg.reshape(self._within(sep, j))
        probs = {}
        for k, b in beliefs.items():
            p = np.exp(b - b.max())
            probs[k] = p / p.sum()
        return probs

    def _marginals(self, probs: dict, cliques) -> dict:
        """Counts (scaled to ``total``) on each of ``cliques`` (the model's), each from the maximal clique it is
        assigned to, down that clique's ``_reduction_tree``: a column summed out once serves every clique without it."""
        found: dict = {}
        for k in self.maximal:
            _tree_down(self._trees[k], probs[k], found)
        return {c: found[c] * self.total for c in cliques}

    # fitting
    def _route(self, measurements) -> list:
        """(clique ascending, the model's smallest clique holding it, counts on the ascending clique, std)."""
        route = []
        for c, y, std in measurements:
            y = np.asarray(y, np.float64).reshape(self._shape(tuple(c))).transpose(np.argsort(c))  # columns ascending
            c = tuple(sorted(c))
            route.append((c, self._smallest_holder(c, self.cliques), y, max(float(std), 1e-12)))
        return route

    def lipschitz(self, measurements) -> float:
        """mbi's ``calculate_l2_lipschitz_from_metadata`` (exact for identity queries): the largest over the model's
        cliques of sum 1/sigma^2 * cells(clique) / cells(measured clique) over the measurements routed to it."""
        blocks: dict = {}
        for c, home, _, std in self._route(measurements):
            blocks[home] = blocks.get(home, 0.0) + self._cells(home) / self._cells(c) / std**2
        return max(blocks.values()) if blocks else 1.0

    def objective(self, measurements) -> "Objective":
        """The refit's loss on ``measurements`` (``Objective``)."""
        return Objective(self, measurements)

    def fit(
        self, measurements: Sequence[tuple[Clique, np.ndarray, float]], iters: int, tol: Optional[float] = None
    ) -> "Model":
        """Up to ``iters`` steps of mbi's mirror descent (Armijo line search) from the current potentials, on
        ``measurements``: (clique, noisy counts, noise std) with every clique held by one of the model's cliques.
        ``tol``: stop early, as mbi's ``estimate(tol=...)`` does, once the loss fell by at most ``tol`` times itself
        over each of two blocks of ``BLOCK`` steps in a row.

        mbi's iterates, computed with less work: the measurements of one clique are merged (``Objective``), and each
        step's gradient is added straight into the maximal cliques' log potentials (where a term of the log density
        sits does not change the density), so nothing is summed from the potentials of the measured cliques per step;
        those are kept apart only to carry into the next model."""
        obj = self.objective(measurements)
        alpha = 2.0 / (self.lipschitz(measurements) * self.total)
        logs = self._log_potentials(self.theta)
        beliefs = self._calibrate_logs(logs)
        mu = obj.marginals(beliefs)
        loss, grad = obj.loss_gradient(mu)
        moved = {c: np.zeros(self._shape(c)) for c in obj.cliques}  # the measured cliques' potentials, moved
        block_start, stalls, step = loss, 0, 0
        for step in range(1, iters + 1):
            up = obj.to_maximal(grad)
            logs2 = {k: logs[k] - alpha * up[k] if k in up else logs[k] for k in self.maximal}
            beliefs2 = self._calibrate_logs(logs2)
            mu2 = obj.marginals(beliefs2)
            loss2, grad2 = obj.loss_gradient(mu2)
            decrease = sum(float(np.vdot(grad[c], mu[c] - mu2[c])) for c in obj.cliques)
            if loss - loss2 >= 0.5 * alpha * decrease:
                for c in obj.cliques:
                    moved[c] -= alpha * grad[c]
                logs, beliefs, mu, loss, grad, alpha = logs2, beliefs2, mu2, loss2, grad2, 1.01 * alpha
            else:
                alpha *= 0.5
            if tol is not None and step % BLOCK == 0:
                stalls = stalls + 1 if block_start - loss <= tol * max(abs(loss), 1.0) else 0
                block_start = loss
                if stalls >= 2:
                    break
        self.steps = step
        theta = dict(self.theta)
        for c, v in moved.items():  # into the model's smallest clique holding c, as mbi keeps its potentials
            home = self._smallest_holder(c, self.cliques)
            theta[home] = theta[home] + v.reshape(self._within(c, home))
        self.theta, self._beliefs = theta, beliefs
        self.loss = loss
        return self

    def fit_accelerated(
        self,
        measurements: Sequence[tuple[Clique, np.ndarray, float]],
        iters: int,
        tol: Optional[float] = None,
        watch: Optional[tuple[Clique, float]] = None,
    ) -> "Model":
        """``fit``'s problem by accelerated mirror descent (mbi's ``UniversalAcceleratedMethod`` at its fixed step
        1 / (L total), no line search) with function-value restarts (the momentum starts again where the loss rose,
        O'Donoghue and Candes 2015), keeping the best potentials seen: it reaches in 100 to 300 steps the loss mbi's
        mirror descent reaches in 1000 (benchmarks/studies/aim_refit.py). Up to ``iters`` steps; ``tol``: stop once
        the best loss (0.5 sum of squared errors in noise stds: one unit is one cell moved by one std) fell by at
        most ``tol`` over each of two blocks of ``BLOCK`` steps in a row, and, with ``watch`` = (clique, bound), the
        clique's counts moved by at most ``bound`` in L1 over each of them."""
        obj = self.objective(measurements)
        scale = 1.0 / (self.lipschitz(measurements) * self.total)
        logs = self._log_potentials(self.theta)
        beliefs = self._calibrate_logs(logs)
        z = obj.marginals(beliefs)
        x, t = z, -1.0
        last = obj.loss_gradient(z)[0]
        moved = {c: np.zeros(self._shape(c)) for c in obj.cliques}
        wc = tuple(sorted(watch[0])) if watch else None
        best = (last, beliefs, dict(moved), z[wc] if wc else None, logs, z)
        block_start, block_marginal, stalls, step = last, best[3], 0, 0
        for step in range(1, iters + 1):
            t = 1.0 if t < 0 else 2.0 / (1.0 + math.sqrt(1.0 + 4.0 / t**2))
            _, grad = obj.loss_gradient({c: (1 - t) * x[c] + t * z[c] for c in obj.cliques})
            up = obj.to_maximal(grad)
            size = scale / t
            logs = {k: logs[k] - size * up[k] if k in up else logs[k] for k in self.maximal}
            for c in obj.cliques:
                moved[c] = moved[c] - size * grad[c]
            beliefs = self._calibrate_logs(logs)
            z = obj.marginals(beliefs)
            x = {c: (1 - t) * x[c] + t * z[c] for c in obj.cliques}
            now = obj.loss_gradient(z)[0]
            if now < best[0]:
                best = (now, beliefs, dict(moved), z[wc] if wc else None, logs, z)
            if now > last:  # overshot: from the best point again, without momentum, at half the step
                now, logs, z, moved = best[0], best[4], best[5], dict(best[2])
                t, x, scale = -1.0, best[5], scale * SHRINK
            else:
                scale *= GROW
            last = now
            if tol is not None and step % BLOCK == 0:
                still = block_start - best[0] <= tol
                if wc:
                    still = still and float(np.abs(best[3] - block_marginal).sum()) <= watch[1]
                stalls = stalls + 1 if still else 0
                block_start, block_marginal = best[0], best[3]
                if stalls >= 2:
                    break
        self.steps = step
        self.loss, beliefs, moved = best[:3]
        theta = dict(self.theta)
        for c, v in moved.items():
            home = self._smallest_holder(c, self.cliques)
            theta[home] = theta[home] + v.reshape(self._within(c, home))
        self.theta, self._beliefs = theta, beliefs
        return self

    # queries
    def beliefs(self) -> dict:
        """Each maximal clique's calibrated probabilities, computed once per potentials (``_beliefs = None``
        recomputes)."""
        if self._beliefs is None:
            self._beliefs = self._calibrate(self.theta)
        return self._beliefs

    def marginal(self, clique: Clique) -> np.ndarray:
        """The model's counts on ``clique`` (ascending columns, any size a maximal clique holds, or a pair)."""
        clique = tuple(clique)
        beliefs = self.beliefs()
        holder = [k for k in self.maximal if set(clique) <= set(k)]
        if holder:
            k = min(holder, key=self._cells)
            return self._probabilities(beliefs, k).sum(axis=self._axes_out(clique, k)) * self.total
        if len(clique) != 2:
            raise ValueError(f"no clique of the model holds {clique} and it is not a pair")
        import networkx as nx

        a, b = clique
        starts = [k for k in self.maximal if a in k]
        ends = [k for k in self.maximal if b in k]
        paths = [nx.shortest_path(self._tree, s, e) for s in starts for e in ends if nx.has_path(self._tree, s, e)]
        if not paths:  # the tree is a forest and the columns sit in different trees: independent
            return np.multiply.outer(self.marginal((a,)), self.marginal((b,))) / self.total
        path = min(paths, key=len)
        # p(a, S_1) from the first clique, then p(a, S_next) = sum over S p(a, S) p(S_next | S) along the path (the
        # separator S makes a independent of the far side), the last step's S_next being (b,)
        first = path[0]
        sep = tuple(x for x in first if x in path[1])
        held = tuple(sorted({a, *sep}))
        m = self._probabilities(beliefs, first).sum(axis=self._axes_out(held, first))
        for step, k in enumerate(path[1:], start=1):
            s_in = tuple(x for x in path[step - 1] if x in k)
            s_out = tuple(x for x in k if x in path[step + 1]) if step + 1 < len(path) else (b,)
            both = tuple(sorted({*s_in, *s_out}))
            p = self._probabilities(beliefs, k)
            joint = p.sum(axis=self._axes_out(both, k))
            given = joint.sum(axis=self._axes_out(s_in, both), keepdims=True)
            cond = np.divide(joint, given, out=np.zeros_like(joint), where=given > 0)
            out = tuple(sorted({a, *s_out}))
            m = np.einsum(m, list(held), cond, list(both), list(out))
            held = out
        return m * self.total

    @staticmethod
    def _probabilities(beliefs: dict, k: Clique) -> np.ndarray:
        """Clique ``k``'s calibrated probabilities."""
        return beliefs[k]

    def potentials_for(self, names: Sequence[str]) -> dict:
        """The potentials keyed by column names (mbi's warm start: ``mbi.CliqueVector`` of ``mbi.Factor``)."""
        return {tuple(names[i] for i in c): v for c, v in self.theta.items()}


class Objective:
    """A refit's loss 0.5 sum ||(mu_c - y_c) / sigma_c||^2 over measurements (clique, noisy counts, std) on a
    ``Model``: the measurements of one clique merged into one (inverse-variance weighted; the loss differs by a
    constant, ``constant``, kept so the loss is the unmerged one), each routed to the model's smallest maximal clique
    holding it, the marginals of a step read off the maximal cliques along reduction trees (``_reduction_tree``)."""

    def __init__(self, model: Model, measurements):
        self.model = model
        groups: dict = {}
        for c, y, std in measurements:
            y = np.asarray(y, np.float64).reshape(model._shape(tuple(c))).transpose(np.argsort(c))
            groups.setdefault(tuple(sorted(c)), []).append((y, max(float(std), 1e-12)))
        self.cliques, self.y, self.std, self.constant = [], {}, {}, 0.0
        for c, group in groups.items():
            w = [1.0 / s**2 for _, s in group]
            total = sum(w)
            y = group[0][0] if len(group) == 1 else sum(wi * yi for wi, (yi, _) in zip(w, group)) / total
            if len(group) > 1:
                self.constant += 0.5 * (sum(wi * float(np.vdot(yi, yi)) for wi, (yi, _) in zip(w, group))
                                        - total * float(np.vdot(y, y)))  # fmt: skip
            self.cliques.append(c)
            self.y[c], self.std[c] = y, 1.0 / math.sqrt(total)
        self.home = {c: model._smallest_holder(c, model.maximal) for c in self.cliques}
        self._trees = {
            k: _reduction_tree(k, [c for c in self.cliques if self.home[c] == k], model.sizes) for k in model.maximal
        }

    def marginals(self, beliefs: dict) -> dict:
        """The measured cliques' counts under calibrated ``beliefs`` (``Model._calibrate``'s)."""
        found: dict = {}
        for k, tree in self._trees.items():
            _tree_down(tree, beliefs[k], found)
        return {c: found[c] * self.model.total for c in self.cliques}

    def loss_gradient(self, mu: dict) -> tuple[float, dict]:
        """The loss at the measured cliques' counts ``mu`` and its gradient in them."""
        loss, grad = self.constant, {}
        for c in self.cliques:
            diff = (mu[c] - self.y[c]) / self.std[c]
            loss += 0.5 * float(np.vdot(diff, diff))
            grad[c] = diff / self.std[c]
        return loss, grad

    def to_maximal(self, grad: dict) -> dict:
        """The gradients of the measured cliques summed into the maximal cliques that hold them (broadcast)."""
        out = {}
        for k, tree in self._trees.items():
            acc = _tree_up(tree, grad)
            if acc is not None:
                out[k] = acc
        return out


def _reduction_tree(s: Clique, targets: Sequence[Clique], sizes: Sequence[int]) -> tuple:
    """(the targets equal to ``s``, [(axis of ``s``, the tree on ``s`` without that column)]): each target (a subset
    of ``s``, ascending) is reached by summing out one column at a time. At each node the column summed out is the one
    the most remaining targets lack (ties: the larger column, then the first), and the targets lacking it go down that
    branch, so cliques that drop the same columns share the sums."""
    exact = [c for c in targets if tuple(c) == tuple(s)]
    rest = [c for c in targets if tuple(c) != tuple(s)]
    children = []
    while rest:
        a = max(s, key=lambda col: (sum(col not in c for c in rest), sizes[col], -s.index(col)))
        group = [c for c in rest if a not in c]
        children.append((s.index(a), _reduction_tree(tuple(x for x in s if x != a), group, sizes)))
        rest = [c for c in rest if a in c]
    return exact, children


def _tree_down(tree: tuple, arr: np.ndarray, out: dict) -> None:
    """Every target of ``tree`` (built on the clique whose array is ``arr``) into ``out``, by the tree's sums."""
    exact, children = tree
    for c in exact:
        out[c] = arr
    for axis, child in children:
        _tree_down(child, arr.sum(axis=axis), out)


def _tree_up(tree: tuple, theta: dict) -> Optional[np.ndarray]:
    """The sum of the targets' arrays (``theta[c]``, on c's columns) broadcast onto the tree's clique (size-1 axes
    where no target holds a column), or None without targets: ``_tree_down``'s transpose."""
    exact, children = tree
    acc = None
    for c in exact:
        acc = theta[c] if acc is None else acc + theta[c]
    for axis, child in children:
        sub = _tree_up(child, theta)
        if sub is not None:
            sub = np.expand_dims(sub, axis)
            acc = sub if acc is None else acc + sub
    return acc


def _collect_distribute(tree) -> list:
    """HUGIN's message order on a junction forest, fixed by the cliques alone: in each tree, rooted at its smallest
    clique, every clique's message to its parent after its children's (collect), then the parents' messages back down
    (distribute); neighbours in ascending order."""
    order, seen = [], set()
    for root in sorted(tree.nodes):
        if root in seen:
            continue
        seen.add(root)
        down, stack = [], [root]
        while stack:  # pre-order: parents before children
            node = stack.pop()
            for nb in sorted(tree.neighbors(node), reverse=True):
                if nb not in seen:
                    seen.add(nb)
                    down.append((node, nb))
                    stack.append(nb)
        order += [(child, parent) for parent, child in reversed(down)] + down
    return order


def min_variance_total(measurements: Sequence[tuple[Clique, np.ndarray, float]]) -> float:
    """mbi's ``minimum_variance_unbiased_total``: the noisy counts' sums averaged with weights 1 / (sigma^2 cells),
    at least 1."""
    sums = np.array([float(np.sum(y)) for _, y, _ in measurements])
    var = np.array([float(s) ** 2 * np.size(y) for _, y, s in measurements])
    if not len(sums):
        return 1.0
    return max(1.0, float(np.average(sums, weights=1.0 / var)))
