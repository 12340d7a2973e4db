import pytest
import torch

from waddle.modules import RunningNormalizer


def test_batched_updates_match_statistics_of_all_data():
    torch.manual_seed(0)
    data = torch.randn(700, 3) * torch.tensor([1.0, 2.0, 0.5]) + torch.tensor([3.0, -1.0, 0.0])
    norm = RunningNormalizer(3)
    for chunk in torch.split(data, [1, 99, 250, 350]):  # uneven batches, one of size 1
        norm.update(chunk)
    torch.testing.assert_close(norm.mean, data.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False), rtol=1e-4, atol=1e-5)
    assert norm.count.item() == 700


def test_update_accepts_leading_batch_dims_and_ignores_graph():
    x = torch.randn(4, 5, 2, requires_grad=True)
    norm = RunningNormalizer(2)
    norm.update(x)
    torch.testing.assert_close(norm.mean, x.detach().reshape(-1, 2).mean(0))
    assert not norm.mean.requires_grad and norm.count.item() == 20


def test_forward_is_a_differentiable_clamped_standardisation():
    norm = RunningNormalizer(2, eps=1e-8, clip=3.0)
    norm.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]]))  # mean [1, 20], var [1, 100]
    x = torch.tensor([[2.0, 20.0], [1.0, 100.0]], requires_grad=True)
    y = norm(x)
    torch.testing.assert_close(y, torch.tensor([[1.0, 0.0], [0.0, 3.0]]))  # 8 sigma clamps to 3
    y.sum().backward()
    # d/dx of (x - mean) / std is 1 / std; zero where the clamp is active.
    torch.testing.assert_close(x.grad, torch.tensor([[1.0, 0.1], [1.0, 0.0]]))


def test_fresh_normalizer_is_identity_and_clip_none_disables_clamping():
    x = torch.tensor([[50.0, -0.5]])
    torch.testing.assert_close(RunningNormalizer(2, clip=None)(x), x)


def test_state_dict_round_trip_and_dtype_cast_keep_integer_count():
    norm = RunningNormalizer((2,))
    norm.update(torch.randn(10, 2))
    restored = RunningNormalizer(2)
    restored.load_state_dict(norm.state_dict())
    x = torch.randn(3, 2)
    torch.testing.assert_close(restored(x), norm(x))
    assert restored.count.item() == 10
    restored = restored.to(torch.float64)
    assert restored.count.dtype == torch.long and restored.mean.dtype == torch.float64


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="eps"):
        RunningNormalizer(2, eps=0.0)
    with pytest.raises(ValueError, match="clip"):
        RunningNormalizer(2, clip=-1.0)
    with pytest.raises(ValueError, match="feature shape"):
        RunningNormalizer(2).update(torch.zeros(4, 3))
