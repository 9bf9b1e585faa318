"""Tests for runtime/combine.py against float64 references written independently here."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch

from hpctrain.errors import ConfigError, RuntimeFailure
from hpctrain.runtime import combine as C

torch.set_num_threads(1)


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


# --------------------------------------------------------------------------------------------- mean


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-14), (torch.bfloat16, 1e-2)])
def test_mean_matches_float64_reference(dtype: torch.dtype, tol: float) -> None:
    ts = [_rand(3, 5, seed=i, dtype=dtype) for i in range(5)]
    ref = np.mean([t.double().numpy() for t in ts], axis=0)
    out = C.mean(ts)
    assert out.dtype == dtype and out.shape == (3, 5)
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=tol, atol=tol)


def test_mean_does_not_modify_inputs_and_rejects_mismatch() -> None:
    a, b = _rand(4, seed=1), _rand(4, seed=2)
    a0 = a.clone()
    C.mean([a, b])
    assert torch.equal(a, a0)
    with pytest.raises(ValueError, match="tensor 1"):
        C.mean([a, _rand(5, seed=3)])
    with pytest.raises(ValueError):
        C.mean([])


# -------------------------------------------------------------------------------------- compression


@pytest.mark.parametrize("wire,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_compress_roundtrip_is_the_cast(wire: str, dtype: torch.dtype) -> None:
    t = _rand(100, seed=4)
    w = C.compress(t, wire)
    assert w.dtype == dtype
    back = C.decompress(w, torch.float32)
    assert back.dtype == torch.float32
    assert torch.equal(back, t.to(dtype).to(torch.float32))
    rel = 2.0 ** -(11 if wire == "fp16" else 8)  # half an ulp of the wire mantissa
    assert torch.all((back - t).abs() <= rel * t.abs() + 1e-30)


def test_compress_none_is_identity() -> None:
    t = _rand(7, seed=5)
    assert C.compress(t, "none") is t
    assert C.decompress(t, torch.float32) is t


def test_fp16_overflow_raises_or_saturates_knowingly() -> None:
    t = torch.tensor([1.0, -1e5, 7e4, float("inf")])
    with pytest.raises(RuntimeFailure, match="1e\\+05.*bf16"):
        C.compress(t, "fp16")
    sat = C.compress(t, "fp16", overflow="saturate")
    assert sat.tolist() == [1.0, -65504.0, 65504.0, float("inf")]  # inf passes through for the NaN/inf check
    assert C.compress(t[:1], "fp16").item() == 1.0
    assert torch.isfinite(C.compress(torch.tensor([1e30]), "bf16")).all()  # bf16 has float32's range


def test_compress_unknown_wire_is_config_error() -> None:
    with pytest.raises(ConfigError, match="train.combiner.compression"):
        C.compress(torch.ones(2), "int8")


# ------------------------------------------------------------------------------------------- Adasum


def ref_adasum(a: np.ndarray, b: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Independent float64 Adasum: coefficients from norms, 1 where the norm² is below eps."""
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    dot = float(np.sum(a * b))
    na, nb = float(np.sum(a * a)), float(np.sum(b * b))
    ca = 1.0 if na < eps else 1.0 - dot / (2.0 * na)
    cb = 1.0 if nb < eps else 1.0 - dot / (2.0 * nb)
    return ca * a + cb * b


def ref_tree(vs: list[np.ndarray]) -> np.ndarray:
    """Recursive halving: Adasum(reduce(left half), reduce(right half)) — same tree as pairing bottom-up."""
    if len(vs) == 1:
        return vs[0].astype(np.float64).ravel()
    h = len(vs) // 2
    return ref_adasum(ref_tree(vs[:h]), ref_tree(vs[h:]))


def ref_any(vs: list[np.ndarray]) -> np.ndarray:
    """The documented extension: fold ranks (0,1),(2,3),… until a power of two remain, then the tree."""
    p = 2 ** int(math.floor(math.log2(len(vs))))
    extra = len(vs) - p
    folded = [ref_adasum(vs[2 * i], vs[2 * i + 1]) for i in range(extra)]
    return ref_tree(folded + [v.astype(np.float64).ravel() for v in vs[2 * extra :]])


def test_adasum_matches_float64_reference() -> None:
    a, b = _rand(64, seed=10), _rand(64, seed=11) + 0.3 * _rand(64, seed=10)
    out = C.adasum(a, b)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.double().numpy(), ref_adasum(a.numpy(), b.numpy()), rtol=1e-6, atol=1e-6)
    a64, b64 = a.double(), b.double()
    np.testing.assert_allclose(C.adasum(a64, b64).numpy(), ref_adasum(a64.numpy(), b64.numpy()), rtol=1e-13)


def test_adasum_float32_agrees_with_horovods_rounding() -> None:
    # Horovod's ScaledAdd for float32 evaluates acoeff*a + bcoeff*b in double and rounds once.
    a, b = _rand(1000, seed=12), _rand(1000, seed=13)
    an, bn = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    dot, na, nb = float(an @ bn), float(an @ an), float(bn @ bn)
    ca, cb = 1.0 - dot / na * 0.5, 1.0 - dot / nb * 0.5
    horovod = (ca * an + cb * bn).astype(np.float32)
    out = C.adasum(a, b).numpy()
    assert np.array_equal(out, horovod)


def test_adasum_properties() -> None:
    a = _rand(32, seed=14, dtype=torch.float64)
    b = _rand(32, seed=15, dtype=torch.float64)
    b_orth = b - (a @ b) / (a @ a) * a  # orthogonal to a
    assert abs(float(a @ b_orth)) < 1e-12
    torch.testing.assert_close(C.adasum(a, a), a, rtol=1e-15, atol=0)  # identical → the same vector
    torch.testing.assert_close(C.adasum(a, b_orth), a + b_orth, rtol=1e-14, atol=1e-14)  # orthogonal → sum
    torch.testing.assert_close(C.adasum(a, 3.0 * a), 2.0 * a, rtol=1e-14, atol=1e-14)  # parallel → mean
    torch.testing.assert_close(C.adasum(a, -a), torch.zeros_like(a), rtol=0, atol=1e-14)
    for c in (1e-2, 7.0):  # degree-1 homogeneous (norms stay above eps)
        torch.testing.assert_close(C.adasum(c * a, c * b), c * C.adasum(a, b), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(C.adasum(a, b), C.adasum(b, a), rtol=1e-14, atol=1e-14)  # symmetric


def test_adasum_near_zero_norm_keeps_coefficient_one() -> None:
    a = _rand(16, seed=16, dtype=torch.float64)
    zero = torch.zeros_like(a)
    assert torch.equal(C.adasum(a, zero), a)
    tiny = 1e-6 * _rand(16, seed=17, dtype=torch.float64)  # norm² ≈ 1.6e-11 < 1e-8
    ca = 1.0 - float(a @ tiny) / float(a @ a) * 0.5
    assert ca != 1.0
    torch.testing.assert_close(C.adasum(a, tiny), ca * a + tiny, rtol=1e-14, atol=1e-20)  # tiny's coefficient: 1
    np.testing.assert_allclose(C.adasum(a, tiny).numpy(), ref_adasum(a.numpy(), tiny.numpy()), rtol=1e-14)
    assert not torch.equal(C.adasum(a, tiny, eps=1e-12), C.adasum(a, tiny))  # eps is the only switch


def test_adasum_half_precision_rounds_once() -> None:
    a, b = _rand(256, seed=18, dtype=torch.float16), _rand(256, seed=19, dtype=torch.float16)
    out = C.adasum(a, b)
    assert out.dtype == torch.float16
    ref = ref_adasum(a.double().numpy(), b.double().numpy())
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("r", [2, 4, 8])
def test_adasum_reduce_power_of_two_is_horovods_tree(r: int) -> None:
    vs = [_rand(40, seed=100 + i, dtype=torch.float64) for i in range(r)]
    out = C.adasum_reduce(vs)
    np.testing.assert_allclose(out.numpy(), ref_tree([v.numpy() for v in vs]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.numpy(), ref_any([v.numpy() for v in vs]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("r", [3, 5, 6, 7])
def test_adasum_reduce_any_count_folds_extra_ranks_first(r: int) -> None:
    vs = [_rand(40, seed=200 + i, dtype=torch.float64) for i in range(r)]
    out = C.adasum_reduce(vs)
    np.testing.assert_allclose(out.numpy(), ref_any([v.numpy() for v in vs]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("r", [1, 2, 3, 5, 8])
def test_adasum_reduce_invariants_for_any_count(r: int) -> None:
    a = _rand(3, 4, seed=300, dtype=torch.float64)
    torch.testing.assert_close(C.adasum_reduce([a] * r), a, rtol=1e-14, atol=0)  # all equal → that vector
    basis = [
        torch.zeros(8, dtype=torch.float64).index_fill_(0, torch.tensor([i]), float(i + 1)) for i in range(r)
    ]
    assert torch.equal(C.adasum_reduce(basis), sum(basis))  # mutually orthogonal → plain sum


def test_adasum_reduce_layers_is_per_layer() -> None:
    ranks = [[_rand(5, seed=10 * r + i, dtype=torch.float64) for i in range(3)] for r in range(4)]
    out = C.adasum_reduce_layers(ranks)
    assert len(out) == 3
    for i in range(3):
        np.testing.assert_allclose(
            out[i].numpy(), ref_tree([ranks[r][i].numpy() for r in range(4)]), rtol=1e-12
        )
    whole = ref_tree([torch.cat(layers).numpy() for layers in ranks])
    assert not np.allclose(
        torch.cat(out).numpy(), whole
    )  # one rule over the flat vector is a different thing
    with pytest.raises(ValueError, match="rank 1"):
        C.adasum_reduce_layers([ranks[0], ranks[1][:2]])


def _vhdd(vs: list[np.ndarray]) -> list[np.ndarray]:
    """Simulate Horovod's vector-halving distance-doubling Adasum (adasum.h, FusedAllreduce) in float64.

    Each rank keeps a shrinking slice; per level, partners exchange halves, the dot/norms of the slices
    are summed over the group of ranks that have mixed so far, then each rank combines its slice.
    """
    n, size = len(vs[0]), len(vs)
    data = [v.astype(np.float64).copy() for v in vs]
    lo, hi = [0] * size, [n] * size
    level = 1
    while level < size:
        new = [d.copy() for d in data]
        partial = {}
        for rank in range(size):
            nb = rank ^ level
            mid = lo[rank] + (hi[rank] - lo[rank]) // 2
            keep = (lo[rank], mid) if rank & level == 0 else (mid, hi[rank])
            left = rank if rank & level == 0 else nb  # 'a' is always the left neighbour's data
            right = nb if rank & level == 0 else rank
            a, b = data[left][keep[0] : keep[1]], data[right][keep[0] : keep[1]]
            partial[rank] = (keep, np.array([a @ b, a @ a, b @ b]))
        for rank in range(size):  # sum over the reduction group: ranks sharing rank // (2*level)
            group = [q for q in range(size) if q // (2 * level) == rank // (2 * level)]
            dot, na, nb_ = sum(partial[q][1] for q in group) / 1.0
            (k0, k1) = partial[rank][0]
            left = rank if rank & level == 0 else rank ^ level
            right = rank ^ level if rank & level == 0 else rank
            ca = 1.0 - dot / na * 0.5 if na >= 1e-8 else 1.0
            cb = 1.0 - dot / nb_ * 0.5 if nb_ >= 1e-8 else 1.0
            new[rank][k0:k1] = ca * data[left][k0:k1] + cb * data[right][k0:k1]
            lo[rank], hi[rank] = k0, k1
        data = new
        level <<= 1
    out = np.zeros(n)
    for rank in range(size):  # the allgather half: every slice is final on its owner
        out[lo[rank] : hi[rank]] = data[rank][lo[rank] : hi[rank]]
    return [out] * size


def test_adasum_reduce_equals_simulated_vhdd() -> None:
    vs = [_rand(37, seed=400 + i, dtype=torch.float64) for i in range(8)]
    sim = _vhdd([v.numpy() for v in vs])[0]
    np.testing.assert_allclose(C.adasum_reduce(vs).numpy(), sim, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------ AdaComp


def ref_adacomp_select(residue: np.ndarray, grad: np.ndarray, bin_len: int) -> tuple[np.ndarray, float]:
    """Independent per-bin loop: selected flat indices (|H| >= bin max |G|, G != 0) and the mean |G|."""
    g = (residue + grad).ravel()
    h = g + grad.ravel()
    chosen = []
    for start in range(0, g.size, bin_len):
        gmax = np.abs(g[start : start + bin_len]).max()
        for i in range(start, min(start + bin_len, g.size)):
            if abs(h[i]) >= gmax and g[i] != 0:
                chosen.append(i)
    sel = np.array(chosen, dtype=np.int64)
    return sel, float(np.abs(g[sel]).mean()) if sel.size else 0.0


def test_adacomp_hand_example() -> None:
    residue = torch.zeros(4, dtype=torch.float64)
    grad = torch.tensor([1.0, -3.0, 2.0, 0.5], dtype=torch.float64)
    msg, res = C.adacomp_encode(residue, grad, bin_len=4)
    # G = grad, H = 2·grad = [2, −6, 4, 1], gmax = 3 → send 1 and 2; scale = (3 + 2)/2
    assert msg.indices.tolist() == [1, 2] and msg.signs.tolist() == [-1, 1] and msg.scale == 2.5
    assert C.adacomp_decode(msg).tolist() == [0.0, -2.5, 2.5, 0.0]
    assert res.tolist() == [1.0, -0.5, -0.5, 0.5]
    assert msg.indices.dtype == torch.int32 and msg.signs.dtype == torch.int8


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_adacomp_invariant_is_exact_over_steps(dtype: torch.dtype) -> None:
    shape, bin_len = (7, 13, 3), 50  # 273 elements: the last bin is short
    residue = torch.zeros(shape, dtype=dtype)
    deferred = selected = 0
    deferred_seen = False
    for step in range(25):
        grad = _rand(*shape, seed=500 + step, dtype=dtype) * 0.01
        grad[0, :3] = 0.0  # zeros are never sent
        total = residue + grad
        msg, new_res = C.adacomp_encode(residue, grad, bin_len)
        decoded = C.adacomp_decode(msg)
        assert decoded.shape == shape and decoded.dtype == dtype
        assert torch.equal(decoded + new_res, total), f"step {step}"  # bitwise
        sel, scale = ref_adacomp_select(residue.double().numpy(), grad.double().numpy(), bin_len)
        assert set(msg.indices.tolist()) <= set(sel.tolist())
        assert len(sel) - msg.count == msg.deferred
        held = sorted(set(sel.tolist()) - set(msg.indices.tolist()))
        flat = total.reshape(-1)
        q = torch.sign(flat[held]) * torch.tensor(msg.scale, dtype=dtype)
        assert not torch.any(((flat[held] - q) + q) == flat[held])  # sending them would break exactness
        deferred_seen = deferred_seen or bool(held)
        assert msg.scale == pytest.approx(scale, rel=1e-6)
        assert set(msg.signs.tolist()) <= {-1, 1}
        deferred += msg.deferred
        selected += len(sel)
        residue = new_res
    assert selected > 0 and deferred <= 0.05 * selected  # the exactness guard rarely holds anything back
    assert deferred_seen  # these seeds do exercise the guard


def test_adacomp_all_zero_layer_sends_nothing() -> None:
    z = torch.zeros(10)
    msg, res = C.adacomp_encode(z, z, 5)
    assert msg.count == 0 and torch.equal(res, z) and torch.equal(C.adacomp_decode(msg), z)


def test_adacomp_residue_carries_unsent_gradient() -> None:
    # A small gradient element is not sent but accumulates in the residue until it wins its bin.
    residue = torch.zeros(2, dtype=torch.float64)
    grad = torch.tensor([1.0, 0.3], dtype=torch.float64)
    sent_second = False
    for _ in range(10):
        msg, residue = C.adacomp_encode(residue, grad, bin_len=2)
        sent_second |= 1 in msg.indices.tolist()
    assert sent_second


def test_adacomp_wire_bytes_and_ratio() -> None:
    conv = [
        C.adacomp_encode(torch.zeros(64, 3, 3, 3), _rand(64, 3, 3, 3, seed=600 + i), 50)[0] for i in range(2)
    ]
    fc = C.adacomp_encode(torch.zeros(100, 500), _rand(100, 500, seed=610), 500)[0]
    m = conv[0]
    assert m.wire_bytes() == m.count * (4 + 1) + 4
    assert m.dense_bytes() == 64 * 27 * 4
    ratios = C.compression_ratio({"conv": conv, "linear": fc})
    assert ratios["conv"] == pytest.approx(2 * 64 * 27 * 4 / sum(x.wire_bytes() for x in conv))
    assert ratios["linear"] == pytest.approx(100 * 500 * 4 / fc.wire_bytes())
    assert ratios["linear"] > ratios["conv"] > 1.0  # longer bins send fewer elements


def test_default_bin_len() -> None:
    assert C.default_bin_len("conv") == 50 and C.default_bin_len("linear") == 500
    assert C.default_bin_len("features.conv1.weight") == 50
    assert C.default_bin_len("fc.weight") == 500 and C.default_bin_len("classifier.bias") == 500
    assert C.default_bin_len("encoder.lstm.weight_hh_l0") == 500
    assert C.default_bin_len("layer1.0.weight", ndim=4) == 50
    assert C.default_bin_len("layer1.0.weight", ndim=2) == 500
    assert C.default_bin_len("bn.bias") == 50  # unknown: the conservative bin


# -------------------------------------------------------------------------------------------- DaSGD


def test_dasgd_merge_formula() -> None:
    now, sent, avg = (_rand(6, seed=700 + i, dtype=torch.float64) for i in range(3))
    np.testing.assert_allclose(C.dasgd_merge(now, sent, avg).numpy(), (avg + (now - sent)).numpy(), rtol=0)
    assert torch.equal(C.dasgd_merge(sent, sent, avg), avg)  # no local progress → the average


class _InProcessGroup:
    """Real averaging across ranks simulated by threads: wait() blocks until every rank of the round sent."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rounds: dict[int, dict[int, list[torch.Tensor]]] = {}
        self.counter = [0] * size
        self.cond = threading.Condition()

    def starter(self, rank: int) -> Callable[[list[torch.Tensor]], C.AverageHandle]:
        def start(tensors: list[torch.Tensor]) -> C.AverageHandle:
            with self.cond:
                rnd = self.counter[rank]
                self.counter[rank] += 1
                self.rounds.setdefault(rnd, {})[rank] = tensors
                self.cond.notify_all()
            return _Handle(self, rnd, len(tensors))

        return start


class _Handle:
    def __init__(self, group: _InProcessGroup, rnd: int, n: int) -> None:
        self.group, self.rnd, self.n = group, rnd, n

    def wait(self) -> list[torch.Tensor]:
        g = self.group
        with g.cond:
            assert g.cond.wait_for(lambda: len(g.rounds[self.rnd]) == g.size, timeout=10), "a rank never sent"
            sent = [g.rounds[self.rnd][r] for r in range(g.size)]
        return [C.mean([s[i] for s in sent]) for i in range(self.n)]


def _all_ranks(fn: Callable[[int], object], size: int) -> None:
    threads = [threading.Thread(target=fn, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive()


@pytest.mark.parametrize("period,delay", [(3, 0), (3, 2), (2, 2)])
def test_delayed_averager_matches_float64_trajectory(period: int, delay: int) -> None:
    size, steps, lr = 2, 12, 0.1
    group = _InProcessGroup(size)
    params = [[torch.full((3,), float(r), dtype=torch.float64)] for r in range(size)]
    avgs = [C.DelayedAverager(group.starter(r), period, delay) for r in range(size)]

    def grad(r: int, t: int) -> np.ndarray:
        return np.array([r + 1.0, t * 0.5, (-1.0) ** (r + t)])

    # Reference: plain numpy, written from the algorithm's definition.
    ref = [np.full(3, float(r)) for r in range(size)]
    sends: dict[int, list[np.ndarray]] = {}
    for t in range(1, steps + 1):
        for r in range(size):  # ranks step in lock-step
            with torch.no_grad():
                params[r][0] -= lr * torch.from_numpy(grad(r, t))
            ref[r] = ref[r] - lr * grad(r, t)
        _all_ranks(lambda r: avgs[r].after_step(params[r]), size)
        due = [s for s in sends if t - s >= delay]
        for s in due:
            avg = np.mean(sends[s], axis=0)
            ref = [avg + (ref[r] - sends[s][r]) for r in range(size)]
            del sends[s]
        if t % period == 0:
            sends[t] = [x.copy() for x in ref]
            if delay == 0:
                avg = np.mean(sends[t], axis=0)
                ref = [avg.copy() for _ in range(size)]
                del sends[t]
        for r in range(size):
            np.testing.assert_allclose(
                params[r][0].numpy(), ref[r], rtol=1e-12, atol=1e-12, err_msg=f"t={t} r={r}"
            )
    if delay == 0:
        assert torch.equal(params[0][0], params[1][0])


def test_delayed_averager_validation_and_state() -> None:
    with pytest.raises(ConfigError, match="train.combiner.delay"):
        C.DelayedAverager(lambda ts: None, period=2, delay=3)  # type: ignore[arg-type,return-value]
    group = _InProcessGroup(1)
    p = [torch.ones(2)]
    av = C.DelayedAverager(group.starter(0), period=1, delay=1)
    av.after_step(p)
    assert av.in_flight
    with pytest.raises(RuntimeFailure, match="flush"):
        av.state_dict()
    assert av.flush(p) and not av.in_flight
    assert av.state_dict() == {"steps": 1, "period": 1, "delay": 1}
