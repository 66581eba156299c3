"""hacpo_loss / gspo_loss / grpo_loss / k3 KL: golden values and gradients against the closed form."""

import math

import pytest
import torch

from hacrl_core.algorithms import (
    grpo_loss,
    gspo_loss,
    hacpo_loss,
    k3_kl,
    kl_penalty,
    masked_mean,
    stepwise_lower_bound,
)


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def one_row(new, old, advantage, own, discrepancy, m, **kwargs):
    logp_new = leaf([new])
    loss, metrics = hacpo_loss(
        logp_new,
        torch.tensor([old], dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64),
        torch.tensor([own]),
        torch.tensor([discrepancy], dtype=torch.float64),
        m,
        **kwargs,
    )
    loss.backward()
    return loss.item(), logp_new.grad.item(), metrics


# ---- own rows: GSPO clip [1 - 3e-4, 1 + 4e-4] -------------------------------------------------


def test_own_row_inside_clip():
    # log s = 0.0002 -> s = e^0.0002, inside the clip: loss = -s*A, d loss / d logp = -s*A.
    s = math.exp(0.0002)
    loss, grad, _ = one_row(-1.0, -1.0002, 2.0, True, 1.0, 0)
    assert loss == pytest.approx(-2.0 * s, rel=1e-12)
    assert grad == pytest.approx(-2.0 * s, rel=1e-12)


def test_own_row_above_clip_positive_advantage_has_no_gradient():
    loss, grad, metrics = one_row(-1.0, -1.001, 1.0, True, 1.0, 0)
    assert loss == pytest.approx(-(1 + 4e-4), rel=1e-12)
    assert grad == 0.0
    assert metrics["own_clip_frac"] == 1.0


def test_own_row_above_clip_negative_advantage_keeps_gradient():
    s = math.exp(0.001)
    loss, grad, metrics = one_row(-1.0, -1.001, -1.0, True, 1.0, 0)
    assert loss == pytest.approx(s, rel=1e-12)
    assert grad == pytest.approx(s, rel=1e-12)
    assert metrics["own_clip_frac"] == 0.0


def test_own_rows_ignore_discrepancy_and_update_index():
    reference = one_row(-1.0, -1.0001, 0.7, True, 1.0, 0)[:2]
    assert one_row(-1.0, -1.0001, 0.7, True, 5.0, 7)[:2] == reference


# ---- cross rows: -omega * c * sg(c)^alpha * A, c = clamp(s, lo_m, 1) --------------------------


@pytest.mark.parametrize("m, expected_low", [(0, 0.8), (1, 0.825), (2, 0.85), (3, 0.875), (8, 1.0), (20, 1.0)])
def test_stepwise_lower_bound(m, expected_low):
    assert stepwise_lower_bound(m, 0.2, 0.025) == pytest.approx(expected_low)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
@pytest.mark.parametrize("m", [0, 1, 2, 3])
@pytest.mark.parametrize("advantage", [1.5, -0.8])
def test_cross_row_golden_value_and_gradient(alpha, m, advantage):
    # log s = -0.18 -> s = 0.8353: inside [lo_m, 1] for m = 0, 1 (0.8, 0.825), outside for m = 2, 3.
    omega = 0.5
    s = math.exp(-0.18)
    low = 1.0 - 0.2 + m * 0.025
    loss, grad, metrics = one_row(-2.18, -2.0, advantage, False, omega, m, alpha=alpha)
    if s >= low:
        assert loss == pytest.approx(-omega * s ** (1 + alpha) * advantage, rel=1e-10)
        # Closed form of docs/algorithm.md, "Formulas": the gradient is omega * A * s^(alpha+1) times d(mean log pi).
        assert grad == pytest.approx(-omega * advantage * s ** (alpha + 1), rel=1e-10)
        assert metrics["cross_clip_frac"] == 0.0
    else:
        assert loss == pytest.approx(-omega * low ** (1 + alpha) * advantage, rel=1e-10)
        assert grad == 0.0  # no PPO min(): zero gradient outside the bounds whatever the sign of A
        assert metrics["cross_clip_frac"] == 1.0
    assert metrics["cross_lower_bound"] == pytest.approx(low)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_cross_row_above_one_is_clipped_for_both_signs(advantage):
    loss, grad, _ = one_row(-1.0, -1.3, advantage, False, 2.0, 0)
    assert loss == pytest.approx(-2.0 * advantage)
    assert grad == 0.0


def test_log_ratio_is_clamped_two_sided():
    _, _, metrics = one_row(-40.0, -1.0, 1.0, False, 1.0, 0)
    assert metrics["cross_ratio_min"] == pytest.approx(math.exp(-10.0))
    _, _, metrics = one_row(-1.0, -40.0, 1.0, False, 1.0, 0)
    assert metrics["cross_ratio_max"] == pytest.approx(math.exp(10.0))


def test_mixed_batch_is_mean_over_rows_and_gradients_match_closed_form():
    new = leaf([-1.0, -1.0, -2.1, -0.5])
    old = torch.tensor([-1.0, -1.0001, -2.0, -0.9], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5, 1.0], dtype=torch.float64)
    own = torch.tensor([True, True, False, False])
    omega = torch.tensor([1.0, 1.0, 0.4, 3.0], dtype=torch.float64)
    loss, metrics = hacpo_loss(new, old, adv, own, omega, 0, alpha=1.0)
    loss.backward()
    s = torch.exp(new.detach() - old)
    row = [
        -1.0 * 1.0,  # own, s = 1
        -min(s[1] * -2.0, min(max(s[1], 1 - 3e-4), 1 + 4e-4) * -2.0),
        -0.4 * s[2] ** 2 * 0.5,  # cross, s = e^-0.1 inside [0.8, 1]
        -3.0 * 1.0 * 1.0,  # cross, s = e^0.4 clipped to 1
    ]
    assert loss.item() == pytest.approx(sum(float(v) for v in row) / 4)
    expected_grad = torch.tensor([-1.0, 2.0 * s[1], -0.4 * 0.5 * s[2] ** 2, 0.0], dtype=torch.float64) / 4
    assert torch.allclose(new.grad, expected_grad)
    assert metrics["own_rows"] == 2 and metrics["cross_rows"] == 2
    assert metrics["cross_clip_frac"] == 0.5
    # The cross rows' share of the gradient weight is their share of |d loss / d log pi| (autograd's).
    magnitude = new.grad.abs()
    assert metrics["cross_grad_share"] == pytest.approx(float(magnitude[~own].sum() / magnitude.sum()))


def test_gradient_flows_through_mean_log_prob_of_a_model():
    """Autograd through a tiny policy: the cross-row gradient is -omega*A*s^(alpha+1)*d(mean log pi)/N."""
    torch.manual_seed(0)
    logits = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)  # 5 tokens, vocab 7
    tokens = torch.tensor([1, 4, 2, 6, 0])
    mean_logp = torch.log_softmax(logits, -1)[torch.arange(5), tokens].mean()
    old = mean_logp.detach() + 0.05  # s = e^-0.05, inside [0.8, 1]
    omega, advantage, alpha = 1.7, 0.9, 2.0
    loss, _ = hacpo_loss(
        mean_logp.view(1),
        old.view(1),
        torch.tensor([advantage], dtype=torch.float64),
        torch.tensor([False]),
        torch.tensor([omega], dtype=torch.float64),
        0,
        alpha=alpha,
    )
    (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (dmean,) = torch.autograd.grad(mean_logp, logits)
    s = math.exp(-0.05)
    assert torch.allclose(grad, -omega * advantage * s ** (alpha + 1) * dmean)


def test_stop_gradient_scales_cross_gradient_by_one_over_alpha_plus_one():
    """Forward value of a cross row is c^(alpha+1) but its gradient is that of c * const:

    finite differences of the loss see (alpha+1) * c^alpha; autograd must give c^alpha, i.e.
    exactly 1/(alpha+1) of the numerical slope on cross rows and all of it on own rows.
    """
    alpha = 3.0
    old = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    adv = torch.tensor([0.3, -1.2, 0.8], dtype=torch.float64)
    own = torch.tensor([False, False, True])
    omega = torch.tensor([0.6, 1.4, 1.0], dtype=torch.float64)

    def loss_of(new):
        return hacpo_loss(new, old, adv, own, omega, 1, alpha=alpha)[0]

    point = leaf([-1.05, -2.1, -0.5001])
    loss_of(point).backward()
    step = 1e-6
    numerical = []
    for i in range(3):
        up, down = point.detach().clone(), point.detach().clone()
        up[i] += step
        down[i] -= step
        numerical.append((loss_of(up) - loss_of(down)).item() / (2 * step))
    numerical = torch.tensor(numerical, dtype=torch.float64)
    scale = torch.tensor([1 / (alpha + 1), 1 / (alpha + 1), 1.0], dtype=torch.float64)
    assert torch.allclose(point.grad, numerical * scale, rtol=1e-5)


# ---- baselines -----------------------------------------------------------------------------


def test_gspo_equals_hacpo_on_own_rows():
    new = leaf([-1.0, -0.99, -1.2])
    old = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    gspo, _ = gspo_loss(new, old, adv)
    hacpo, _ = hacpo_loss(new, old, adv, torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.float64), 0)
    assert gspo.item() == pytest.approx(hacpo.item())


def test_grpo_token_level_clip_higher_and_token_mean():
    new = leaf([[0.0, math.log(1.5), math.log(0.5)], [math.log(0.7), 0.0, 0.0]])
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, metrics = grpo_loss(new, old, adv, mask)
    # tokens: r=1 (A=1) -> -1; r=1.5 clipped to 1.28 -> -1.28; r=0.5 -> -min(0.5, 0.8) = -0.5;
    # row 2: r=0.7, A=-1 -> -min(-0.7, -0.8) = 0.8; masked tokens ignored.
    assert loss.item() == pytest.approx((-1 - 1.28 - 0.5 + 0.8) / 4)
    loss.backward()
    assert new.grad[0, 1].item() == 0.0 and new.grad[1, 0].item() == 0.0
    assert new.grad[1, 1].item() == 0.0  # masked
    assert metrics["own_clip_frac"] == pytest.approx(0.5)


def test_masked_slots_never_matter():
    """Sentinels in masked positions (verl's trick) must not change loss or metrics."""
    new = torch.tensor([[-1.0, -2.0, 30.0], [-0.5, 50.0, 50.0]])
    old = torch.tensor([[-1.1, -2.0, -30.0], [-0.4, -50.0, 50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    clean_new = torch.where(mask.bool(), new, torch.zeros_like(new))
    clean_old = torch.where(mask.bool(), old, torch.zeros_like(old))
    adv = torch.tensor([1.0, -1.0])
    assert grpo_loss(new, old, adv, mask)[0].item() == pytest.approx(
        grpo_loss(clean_new, clean_old, adv, mask)[0].item()
    )
    assert torch.allclose(masked_mean(new, mask, dim=-1), torch.tensor([-1.5, -0.5]))


def test_masked_mean_of_empty_row_is_zero_not_nan():
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3), dim=-1).tolist() == [0.0, 0.0]


def test_k3_kl_is_zero_at_reference_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0, -0.3])
    assert torch.allclose(k3_kl(logp, logp), torch.zeros(3))
    ref = torch.tensor([-1.5, -1.0, -0.3])
    expected = torch.exp(ref - logp) - (ref - logp) - 1
    assert torch.allclose(k3_kl(logp, ref), expected)
    assert (k3_kl(logp, ref)[:2] > 0).all()


def test_kl_penalty_averages_tokens_then_selected_rows():
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.0], [-1.0, -1.0], [-3.0, -3.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    rows = torch.tensor([True, True, False])  # the third (cross) row is excluded
    k = math.exp(-1) + 1 - 1
    assert kl_penalty(logp, ref, mask, rows).item() == pytest.approx((k / 2 + 0.0) / 2)
